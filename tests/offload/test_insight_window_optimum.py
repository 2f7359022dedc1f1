"""The live optimum's window: the offline optimum's answer on the window's own references,
never below the tier's policy, and never more references than its bound.

Random traces are paths in a random forest of blocks (test_insight_optimum's
strategy): prefix-closed, as every trace vLLM makes is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload.base import BlockHash
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import policy_names
from offload.insight.estimator import adjusted_ratio
from offload.insight.sampling import SpatialSampler
from offload.insight.uncertainty import quotient_error
from offload.insight.window_optimum import (
    MIN_WINDOW_REFS,
    WINDOW_CAPACITIES,
    WindowOptimum,
    WindowResult,
)
from offload.sim.mooncake import bundled_trace_path, load_trace
from offload.sim.optimum import offline_hits, offline_runs
from offload.sim.workload import run_request, run_workload
from tests.offload.test_insight_optimum import prefix_closed_traces


def newest_within(requests: Sequence[Sequence[int]], refs: int) -> list[Sequence[int]]:
    """The newest whole requests holding at most ``refs`` references (a longer last one cut)."""
    kept: list[Sequence[int]] = []
    total = 0
    for request in reversed(requests):
        head = request[:refs]
        if kept and total + len(head) > refs:
            break
        kept.append(head)
        total += len(head)
    return kept[::-1]


@settings(max_examples=150, deadline=None)
@given(
    prefix_closed_traces(requests=60, depth=6),
    st.integers(1, 12),
    st.sampled_from(policy_names()),
)
def test_the_window_is_the_offline_optimum_and_the_policy_on_its_own_references(
    trace: list[list[int]], capacity: int, policy: str
) -> None:
    window = WindowOptimum(capacity, 1.0, policy)
    for request in trace:
        window.record([request], [len(request)])
    requests, block_refs = window.take()
    result = window.compute(requests, block_refs)
    expected = newest_within(trace, window.max_refs)
    assert requests == expected
    assert result.optimum_hits == offline_hits(expected, capacity)
    assert (
        result.tier_hits == run_workload(CPUOffloadingManager(1, capacity, policy), expected).hits
    )
    assert result.tier_hits <= result.optimum_hits
    assert result.refs == block_refs == sum(map(len, expected))
    efficiency = result.efficiency
    assert efficiency is None or 0.0 <= efficiency <= 1.0
    assert result.efficiency_error == (None if efficiency is None else 0.0), "rate 1: exact"


@settings(max_examples=100, deadline=None)
@given(prefix_closed_traces(requests=300, depth=8), st.integers(1, 4))
def test_the_window_holds_at_most_its_bound_and_drops_the_oldest_first(
    trace: list[list[int]], capacity: int
) -> None:
    window = WindowOptimum(capacity, 1.0, "lru")
    for request in trace * 8:  # past the bound (MIN_WINDOW_REFS) when the trace is long
        window.record([request], [len(request)])
        assert window.refs <= window.max_refs
    assert window.max_refs == max(MIN_WINDOW_REFS, WINDOW_CAPACITIES * capacity)
    assert window.take()[0] == newest_within(trace * 8, window.max_refs)


def test_a_request_longer_than_the_window_keeps_its_head_and_its_heads_share() -> None:
    window = WindowOptimum(1, 0.5, "lru")
    long = list(range(3 * window.max_refs))
    window.record([long], [2 * len(long) + 1])
    requests, block_refs = window.take()
    assert requests == [long[: window.max_refs]] and block_refs == 2 * window.max_refs


def test_prompts_longer_than_the_window_that_never_hit_read_as_no_hits() -> None:
    """Every request the same 3 prompts of thousands of blocks, on a tier of 2: nothing
    hits, in the tier or in the optimum. Cut to its head, each request once still stood
    for all its blocks, and the references cut off read as hits: 83% for both."""
    window = WindowOptimum(2, 1.0, "lru")
    prompts = [[1_000_000 * p + b for b in range(3000)] for p in range(3)]
    trace = [prompts[r % 3] for r in range(30)]
    assert run_workload(CPUOffloadingManager(1, 2, "lru"), trace).hits == 0
    for request in trace:
        window.record([request], [len(request)])
    requests, block_refs = window.take()
    result = window.compute(requests, block_refs)
    assert block_refs == result.refs == window.max_refs
    assert (result.tier_ratio, result.optimum_ratio) == (0.0, 0.0)


def test_unsampled_references_count_with_the_newest_request() -> None:
    window = WindowOptimum(100, 0.5, "lru")
    window.record([[]], [3], 7)  # before the window's first request: outside it
    assert (window.refs, window.block_refs) == (0, 0)
    window.record([[1, 2], [], [3]], [10, 4, 5], 6)
    assert (window.refs, window.block_refs) == (3, 25)
    assert window.take() == ([[1, 2], [3]], 25)


def test_a_request_with_more_sampled_blocks_than_blocks_is_refused() -> None:
    window = WindowOptimum(100, 0.5, "lru")
    with pytest.raises(ValueError, match="more sampled blocks than blocks"):
        window.record([[1, 2]], [1])
    assert window.refs == 0


def test_it_is_due_once_half_full_then_once_half_of_it_is_new() -> None:
    window = WindowOptimum(100, 1.0, "lru")
    half = window.max_refs // 2
    assert half >= MIN_WINDOW_REFS
    for block in range(half - 1):
        window.record([[block]], [1])
    assert not window.due(), "under half full"
    window.record([[half]], [1])
    assert window.due()
    window.take()
    assert not window.due()
    for block in range(half - 1):
        window.record([[-block - 1]], [1])
    assert not window.due(), "just under half of the window is new"
    window.record([[-half]], [1])
    assert window.due()


def test_a_small_tiers_window_is_first_due_once_it_holds_the_least_that_means_something() -> None:
    """A window of MIN_WINDOW_REFS was once first computed at half of it, 256 references,
    which its own bound calls mostly noise."""
    window = WindowOptimum(1, 1.0, "lru")
    assert window.max_refs == MIN_WINDOW_REFS
    for block in range(MIN_WINDOW_REFS - 1):
        window.record([[block]], [1])
    assert not window.due(), "half full, but under MIN_WINDOW_REFS"
    window.record([[-1]], [1])
    assert window.due()


def test_no_efficiency_when_the_optimum_hits_nothing_on_the_sample() -> None:
    """With no sampled hit for either cache, both ratios are the sample-size correction
    alone; their quotient once read as 100% of the optimum."""
    window = WindowOptimum(10, 0.5, "lru")
    window.record([[block] for block in range(600)], [3] * 600)
    requests, block_refs = window.take()
    result = window.compute(requests, block_refs)
    assert (result.optimum_hits, result.tier_hits) == (0, 0)
    assert result.optimum_ratio > 0 and result.tier_ratio == result.optimum_ratio
    assert result.efficiency is None


def sampled_window() -> tuple[WindowOptimum, list[Sequence[BlockHash]], int, WindowResult]:
    """The bundled trace's first 4,000 requests sampled at 0.05 into an arc tier's window of
    2,000 blocks: the window, what it took, and its result."""
    trace = load_trace(bundled_trace_path())[:4000]
    sampler = SpatialSampler(0.05)
    window = WindowOptimum(2000, 0.05, "arc")
    window.record([sampler.sample(request) for request in trace], list(map(len, trace)))
    requests, block_refs = window.take()
    return window, requests, block_refs, window.compute(requests, block_refs)


def test_on_a_sample_the_ratios_are_corrected_as_the_curve_is() -> None:
    """The bundled trace sampled at 0.05: hit ratios as the estimator corrects them."""
    window, _, block_refs, result = sampled_window()
    assert result.capacity == 100 and window.max_refs == WINDOW_CAPACITIES * 100
    assert result.optimum_ratio == adjusted_ratio(
        result.optimum_hits, result.refs, block_refs, 0.05
    )
    assert 0 < result.tier_ratio <= result.optimum_ratio <= 1
    assert result.efficiency == pytest.approx(result.tier_ratio / result.optimum_ratio)


def test_on_a_sample_the_efficiencys_error_pairs_each_blocks_misses_in_both_replays() -> None:
    """The bundled trace sampled at 0.05: the efficiency's error is the quotient's over the
    misses each sampled block had in the tier's own replay and in the optimum's, request by
    request (a prefix hit is a request's leading blocks)."""
    _, requests, block_refs, result = sampled_window()
    tier = CPUOffloadingManager(1, result.capacity, "arc")
    tier_misses: Counter[int] = Counter()
    for sampled in requests:
        tier_misses.update(sampled[run_request(tier, sampled) :])
    optimum_misses: Counter[int] = Counter()
    for sampled, run in zip(requests, offline_runs(requests, result.capacity), strict=True):
        optimum_misses.update(sampled[run:])
    assert result.optimum_hits == result.refs - optimum_misses.total()
    assert result.efficiency is not None
    adjusted_optimum_hits = result.optimum_ratio * 0.05 * block_refs
    assert result.efficiency_error == pytest.approx(
        quotient_error(tier_misses, optimum_misses, result.efficiency, 0.05, adjusted_optimum_hits)
    )
    assert 0 < result.efficiency_error < 1


def test_an_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        WindowOptimum(10, 1.0, "nope")
