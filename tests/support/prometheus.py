"""A real Prometheus (Debian's ``prometheus``) in a subprocess, and its HTTP API, for the tests.

Tests that drive it skip when the binaries are absent (``make debs`` installs
them); the skip reasons are here so every such test says the same.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.polling import wait_for

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian package prometheus not installed"
)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian package prometheus) not installed"
)
WAIT_S = 60.0


def worker_exposition(base_url: str) -> str:
    """The sidecar's /metrics once a worker's series are in it (its first stats frame)."""
    return wait_for(
        lambda: httpx.get(f"{base_url}/metrics", timeout=10).text,
        lambda text: "kvscope_lookup_blocks_total{" in text,
        "the worker's series appear", WAIT_S,
    )  # fmt: skip


def free_port() -> int:
    """A port free now, for a process that must be told its port before it binds it (and
    may find it taken by then): only where the process cannot bind port 0 and say which."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


LISTENING = re.compile(r'msg="Listening on" address=(\S+)')
"""The line Prometheus logs (at level info) naming the address it bound."""


@contextmanager
def running_prometheus(config: Path, data: Path) -> Iterator[httpx.Client]:
    """Prometheus on a loopback port of its own choosing with ``config``, its TSDB under
    ``data``, its log beside it (``data`` with ``.log``).

    Yields a client for its HTTP API once it reports ready.
    """
    assert PROMETHEUS is not None
    log = data.with_suffix(".log")
    with log.open("w") as written:
        # Port 0, the address read from its log: a port probed free, then bound by
        # Prometheus, could be taken in between.
        server = subprocess.Popen(
            [
                PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
                "--web.listen-address=127.0.0.1:0", "--log.level=info",
            ],
            stdout=subprocess.DEVNULL, stderr=written,
        )  # fmt: skip
    try:

        def address() -> str | None:
            assert server.poll() is None, f"prometheus exited: {log.read_text()}"
            found = LISTENING.search(log.read_text())
            return found.group(1) if found else None

        listening = wait_for(address, bool, "prometheus listens", WAIT_S)
        with httpx.Client(base_url=f"http://{listening}", timeout=10) as api:

            def ready() -> bool:
                assert server.poll() is None, f"prometheus exited: {log.read_text()}"
                try:
                    return api.get("/-/ready").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(ready, bool, "prometheus is ready", WAIT_S)
            yield api
    finally:
        server.terminate()
        server.wait(timeout=30)


def query(api: httpx.Client, promql: str) -> list[dict[str, Any]]:
    """An instant query's vector (empty until the series exist)."""
    answer = api.get("/api/v1/query", params={"query": promql}).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def value_of(api: httpx.Client, promql: str) -> float | None:
    """The single value a query returns, or None while it returns nothing."""
    result = query(api, promql)
    assert len(result) <= 1, f"{promql} returned {len(result)} series"
    return float(result[0]["value"][1]) if result else None


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS``, ``stdin`` on its standard input; the caller checks the outcome."""
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60
    )
