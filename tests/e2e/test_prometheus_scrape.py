"""A real Prometheus scrapes a live `kvscope demo`: what a Grafana panel will query.

Debian's prometheus runs as a subprocess with one scrape job, the demo's
sidecar, every second. Reading back through Prometheus's own HTTP API proves
what a parser cannot: that the server accepts the exposition, that the
counters behave as counters under ``rate()``, that histograms answer
``histogram_quantile()``, and that the worker's labels arrive intact.
``promtool check metrics`` lints the exposition against Prometheus's naming
conventions; it passes a series printed twice and a family with no TYPE (and
Prometheus 2.42 keeps the first of two silently, counting nothing), so the
exposition is checked for those too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.demo_process import running_demo
from tests.support.polling import wait_for
from tests.support.prometheus import (
    WAIT_S,
    needs_prometheus,
    needs_promtool,
    promtool,
    query,
    running_prometheus,
    value_of,
    worker_exposition,
)

pytestmark = [needs_prometheus, pytest.mark.timeout(180)]

CONFIG = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kvscope
    static_configs:
      - targets: ["{target}"]
"""


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """One live demo for both tests: its base URL."""
    with running_demo(rate=300) as base:
        yield base


def test_prometheus_scrapes_the_sidecar_and_answers_grafanas_queries(
    demo: str, tmp_path: Path
) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(CONFIG.format(target=urlsplit(demo).netloc))
    with running_prometheus(config, tmp_path / "tsdb") as api:
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


def test_every_family_has_help_and_type_and_every_series_is_printed_once(demo: str) -> None:
    families = list(text_string_to_metric_families(worker_exposition(demo)))
    untyped = [f.name for f in families if f.type == "unknown" or not f.documentation.strip()]
    assert not untyped, f"no TYPE or no HELP: {untyped}"
    series = Counter(
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in families
        for sample in family.samples
    )
    assert [key for key, count in series.items() if count > 1] == []


@needs_promtool
def test_promtool_finds_nothing_to_lint_in_the_exposition(demo: str) -> None:
    body = worker_exposition(demo)
    linted = promtool("check", "metrics", stdin=body)
    problems = linted.stdout + linted.stderr
    assert linted.returncode == 0 and not problems, problems
