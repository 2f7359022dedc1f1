"""`kvscope demo` end to end, as a user runs it: a real process, real HTTP, moving metrics."""

from __future__ import annotations

import signal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.demo_process import running_demo
from tests.support.polling import wait_for

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

        def series() -> dict[str, float]:
            return kvscope_series(httpx.get(f"{url}/metrics", timeout=10).text)

        lookups = "kvscope_lookup_blocks_total"
        first = wait_for(series, lambda s: lookups in s, "the worker's series appear", WAIT_S)
        later = wait_for(
            series, lambda s: s[lookups] > first[lookups], "the worker's counters move", WAIT_S
        )
        assert later["kvscope_store_admitted_blocks_total"] > 0
        assert later["kvscope_transfer_bytes_total"] > 0
        # Both tiers, on one stream: the simulated GPU prefix cache and the CPU tier behind it.
        wait_for(
            lambda: httpx.get(f"{url}/api/v1/stats", timeout=10).json()["blocks_by_medium"],
            lambda by_medium: by_medium.get("GPU", 0) > 0 and by_medium.get("CPU", 0) > 0,
            "the sidecar holds blocks on both media",
            WAIT_S,
        )
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("stop", "sigint_ignored"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["a container's SIGTERM", "Ctrl-C in a shell that started it in the background"],
)
def test_the_demo_stops_cleanly_on_sigterm_and_on_an_inherited_ignored_sigint(
    stop: signal.Signals, sigint_ignored: bool
) -> None:
    with running_demo(rate=100, stop=stop, sigint_ignored=sigint_ignored) as url:
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    # running_demo asserted the exit: within its deadline, status 0
