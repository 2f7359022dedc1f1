"""`kvscope demo` end to end, as a user runs it: a real process, real HTTP, moving metrics."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.demo_process import running_demo

WAIT_S = 60.0


def kvscope_series(text: str) -> dict[str, float]:
    """Every kvscope_ worker counter sample, summed over its labels."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("kvscope_") and not sample.name.startswith(
                "kvscope_sidecar_"
            ):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def test_the_demo_serves_moving_kvscope_metrics() -> None:
    with running_demo(rate=400) as url:
        deadline = time.monotonic() + WAIT_S
        first: dict[str, float] = {}
        while "kvscope_lookup_blocks_total" not in first:
            assert time.monotonic() < deadline, "the worker's series never appeared"
            first = kvscope_series(httpx.get(f"{url}/metrics", timeout=10).text)
            time.sleep(0.2)
        later = first
        while later["kvscope_lookup_blocks_total"] <= first["kvscope_lookup_blocks_total"]:
            assert time.monotonic() < deadline, "the worker's counters never moved"
            time.sleep(0.5)
            later = kvscope_series(httpx.get(f"{url}/metrics", timeout=10).text)
        assert later["kvscope_store_admitted_blocks_total"] > 0
        assert later["kvscope_transfer_bytes_total"] > 0
        stats = httpx.get(f"{url}/api/v1/stats", timeout=10).json()
        assert stats["blocks_by_medium"].get("CPU", 0) > 0
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
