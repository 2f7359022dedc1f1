"""`kvscope demo` in its own process, for the end-to-end tests that need a live one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def running_demo(
    rate: int,
    stop: signal.Signals = signal.SIGINT,
    sigint_ignored: bool = False,
    policy: str | None = None,
    token: str | None = None,
) -> Iterator[str]:
    """`kvscope demo` as a user runs it, in its own process; yields its base URL.

    On exit it is stopped with ``stop`` (Ctrl-C's SIGINT, or a container's
    SIGTERM) and must exit cleanly. ``sigint_ignored`` starts it as a shell's
    background job is started: with SIGINT ignored from birth. ``policy``: its
    ``--policy`` (None: the demo's default). ``token``: its ``KVSCOPE_TOKEN``, in its
    environment only (None: as this process's).
    """
    chosen = [] if policy is None else ["--policy", policy]
    env = None if token is None else {**os.environ, "KVSCOPE_TOKEN": token}
    demo = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "demo", "--port", "0", "--rate", str(rate), *chosen],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        line = demo.stdout.readline()
        match = re.search(r"open (http://\S+)/ ", line)
        assert match, f"no URL in {line!r}"
        yield match.group(1)
    finally:
        demo.send_signal(stop)
        demo.wait(timeout=60)
    assert demo.returncode == 0, demo.stderr.read() if demo.stderr else ""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
