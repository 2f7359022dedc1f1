"""A real Prometheus scrapes a live `kvscope demo`: what a Grafana panel will query.

Debian's prometheus runs as a subprocess with one scrape job, the demo's
sidecar, every second. Reading back through Prometheus's own HTTP API proves
what a parser cannot: that the server accepts the exposition, that the
counters behave as counters under ``rate()``, that histograms answer
``histogram_quantile()``, and that the worker's labels arrive intact.
``promtool check metrics`` lints the exposition against Prometheus's naming
conventions.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.demo_process import running_demo
from tests.support.polling import wait_for

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="Debian package prometheus not installed"),
    pytest.mark.timeout(180),
]
WAIT_S = 60.0

CONFIG = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kvscope
    static_configs:
      - targets: ["{target}"]
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_prometheus(tmp_path: Path, target: str) -> Iterator[httpx.Client]:
    """Prometheus scraping ``target`` (host:port); yields a client for its HTTP API."""
    assert PROMETHEUS is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(CONFIG.format(target=target))
    address = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [
            PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={address}", "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://{address}", timeout=10) as api:

            def ready() -> bool:
                assert server.poll() is None, f"prometheus exited: {server.communicate()[1]}"
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


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """One live demo for both tests: its base URL."""
    with running_demo(rate=300) as base:
        yield base


def test_prometheus_scrapes_the_sidecar_and_answers_grafanas_queries(
    demo: str, tmp_path: Path
) -> None:
    with running_prometheus(tmp_path, urlsplit(demo).netloc) as api:
        targets = wait_for(
            lambda: api.get("/api/v1/targets").json()["data"]["activeTargets"],
            lambda active: active and active[0]["health"] == "up",
            "the sidecar's target is up", WAIT_S,
        )  # fmt: skip
        assert targets[0]["scrapeUrl"] == f"{demo}/metrics"
        assert targets[0]["lastError"] == ""

        lookup_rate = 'sum(rate(kvscope_lookup_blocks_total{medium="CPU"}[5s]))'
        wait_for(
            lambda: value_of(api, lookup_rate), lambda v: v is not None and v > 0,
            "a positive lookup rate", WAIT_S,
        )  # fmt: skip

        series = query(api, 'kvscope_blocks_capacity{medium="CPU"}')
        assert len(series) == 1
        labels = series[0]["metric"]
        stats = httpx.get(f"{demo}/api/v1/stats", timeout=10).json()
        (publisher,) = stats["publishers"]
        assert labels["job"] == "kvscope"
        assert (labels["engine"], labels["publisher"]) == ("demo", publisher["name"])
        assert float(series[0]["value"][1]) == publisher["capacity_blocks"]

        hit_ratio = (
            'sum(kvscope_lookup_hit_blocks_total{medium="CPU"})'
            ' / sum(kvscope_lookup_blocks_total{medium="CPU"})'
        )
        ratio = value_of(api, hit_ratio)
        assert ratio is not None and 0 <= ratio <= 1

        p99 = (
            "histogram_quantile(0.99, sum by (le) (rate("
            'kvscope_manager_operation_duration_seconds_bucket{operation="prepare_store"}[5s])))'
        )
        wait_for(
            lambda: value_of(api, p99), lambda v: v is not None and 0 < v < float("inf"),
            "a finite prepare_store p99", WAIT_S,
        )  # fmt: skip

        tracked = value_of(api, "kvscope_sidecar_tracked_blocks")
        assert tracked is not None and tracked > 0


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_finds_nothing_to_lint_in_the_exposition(demo: str) -> None:
    assert PROMTOOL is not None
    body = wait_for(
        lambda: httpx.get(f"{demo}/metrics", timeout=10).text,
        lambda text: "kvscope_lookup_blocks_total{" in text,
        "the worker's series appear", WAIT_S,
    )  # fmt: skip
    linted = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    problems = linted.stdout + linted.stderr
    assert linted.returncode == 0 and not problems, problems
