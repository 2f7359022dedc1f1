"""`kvscope demo` in its own process, for the end-to-end tests that need a live one."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def running_demo(rate: int) -> Iterator[str]:
    """`kvscope demo` as a user runs it, in its own process; yields its base URL.

    On exit it is stopped with Ctrl-C (SIGINT) and must exit cleanly.
    """
    demo = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "demo", "--port", "0", "--rate", str(rate)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        line = demo.stdout.readline()
        match = re.search(r"open (http://\S+)/ ", line)
        assert match, f"no URL in {line!r}"
        yield match.group(1)
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=60)
    assert demo.returncode == 0, demo.stderr.read() if demo.stderr else ""
