"""Benchmark pairing: each chunk in each order once per pair of rounds, no full collection
inside a round, and an interval for the median that leaves out the values it may.

A difference of a few nanoseconds per reference is resolved only if nothing
systematic lands on one side: these check the schedule and the statistic, on
recorded calls and fixed numbers, never on time.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from itertools import count

from bench.tooling.pairing import Round, abba_pairs, median_interval, paired_round

REQUESTS = [[index] for index in range(6)]


def _leads_per_chunk(pairs: int) -> list[tuple[str, int]]:
    """(side that ran first, first request of the chunk) for every chunk of the rounds that
    count, the warm-up left out."""
    calls: list[tuple[str, int]] = []
    ticks = count()

    def clock() -> float:
        return float(next(ticks))

    def run_round(on_leads: bool) -> Round:
        def off(chunk: Sequence[Sequence[int]]) -> None:
            calls.append(("off", chunk[0][0]))

        def on(chunk: Sequence[Sequence[int]]) -> None:
            calls.append(("on", chunk[0][0]))

        return paired_round(REQUESTS, 2, off, on, clock=clock, on_leads=on_leads)

    abba_pairs(pairs, run_round)
    per_round = 2 * len(REQUESTS) // 2  # both sides, chunks of two requests
    return calls[per_round::2]


def test_a_pair_of_rounds_runs_every_chunk_in_each_order_once() -> None:
    each_order_once = [(name, start) for name in ("off", "on") for start in (0, 2, 4)]
    assert sorted(_leads_per_chunk(1)) == each_order_once
    assert sorted(_leads_per_chunk(2)) == sorted(each_order_once * 2)


def test_every_round_starts_after_a_full_collection() -> None:
    collected_before: list[bool] = []
    full = [False]

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full[0] = True

    def run_round(on_leads: bool) -> Round:
        collected_before.append(full[0])
        full[0] = False
        return 1.0, 1.0

    gc.callbacks.append(note)
    try:
        abba_pairs(2, run_round)
    finally:
        gc.callbacks.remove(note)
    assert collected_before == [True] * 5


def test_the_median_interval_leaves_out_what_its_confidence_allows() -> None:
    twelve = [float(value) for value in (12, 1, 11, 2, 10, 3, 9, 4, 8, 5, 7, 6)]
    assert median_interval(twelve) == (3.0, 10.0)  # 96% from the 3rd to the 10th of 12
    assert median_interval(list(map(float, range(1, 17)))) == (4.0, 13.0)
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0)  # too few: the range
