"""The one-pass LRU curve against kvscope's own ``lru``, capacity by capacity.

Where the stack model and the replay agree by construction, they must agree
exactly; where they cannot (the canonical replay is not a stack algorithm),
the counterexample is pinned and the gap on the bundled trace is bounded.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload.cpu.manager import CPUOffloadingManager
from offload.insight.stack_distance import LRUStackCurve
from offload.sim.mooncake import bundled_trace_path, load_trace
from offload.sim.workload import run_request, run_workload

CAPACITIES = [1, 2, 3, 5, 8, 13]


def stack_hits(requests: Sequence[Sequence[int]], capacities: Sequence[int]) -> tuple[int, ...]:
    curve = LRUStackCurve(capacities)
    curve.add_many(requests)
    return curve.hits


def lru_hits_with_finish(requests: Sequence[Sequence[int]], capacity: int) -> int:
    """The canonical replay, each request's use then recorded as the LRU's finish records it."""
    manager = CPUOffloadingManager(1, capacity, "lru")
    hits = 0
    for request in requests:
        hits += run_request(manager, request)
        manager.policy.finish(request, ())
    return hits


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), max_size=120))
def test_single_block_requests_equal_the_canonical_lru_replay_at_every_capacity(
    blocks: list[int],
) -> None:
    requests = [[block] for block in blocks]
    expected = [run_workload(CPUOffloadingManager(1, c, "lru"), requests).hits for c in CAPACITIES]
    assert list(stack_hits(requests, CAPACITIES)) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=5), max_size=40))
def test_requests_equal_the_lru_replay_that_records_each_requests_use_when_it_ends(
    requests: list[list[int]],
) -> None:
    """Any trace, repeats inside a request included, at capacities that hold every request."""
    capacities = [c for c in CAPACITIES if c >= 5]
    expected = [lru_hits_with_finish(requests, c) for c in capacities]
    assert list(stack_hits(requests, capacities)) == expected


# The canonical replay (no finish) stores a request's missed blocks head-oldest,
# above its hits, so what it holds depends on the capacity through the hits:
# after this trace, 6 blocks hold block 9, 7 blocks do not.
NOT_INCLUSIVE = [
    [0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [0, 1, 2, 5], [0, 6, 7, 8, 9], [0, 1, 2],
    [0, 6, 7, 10], [0, 1], [0, 1], [0, 6, 7, 8, 9, 11], [0, 1, 2],
]  # fmt: skip


def test_the_canonical_lru_replay_is_not_a_stack_algorithm() -> None:
    held = {}
    for capacity in (6, 7):
        manager = CPUOffloadingManager(1, capacity, "lru")
        run_workload(manager, NOT_INCLUSIVE)
        held[capacity] = set(manager.policy.blocks)
    assert 9 in held[6] and 9 not in held[7]


def test_the_curve_stays_near_the_canonical_lru_replay_on_the_bundled_trace() -> None:
    """The measured gap of the stack model (0.06 points at most on the whole trace)."""
    requests = load_trace(bundled_trace_path())[:3000]
    capacities = [125, 250, 500, 1000, 2000, 4000]
    block_refs = sum(map(len, requests))
    for capacity, hits in zip(capacities, stack_hits(requests, capacities), strict=True):
        replay = run_workload(CPUOffloadingManager(1, capacity, "lru"), requests)
        assert abs(hits - replay.hits) / block_refs < 0.002, capacity


def test_memory_is_the_largest_capacity_and_a_zero_capacity_hits_nothing() -> None:
    curve = LRUStackCurve([0, 2, 4])
    for request in ([1, 2, 3], [1, 2], [4, 5, 6, 7, 8], [4, 5]):
        curve.add_many([request])
        assert curve.held_blocks <= 4
    assert curve.hits == (0, 4, 4)  # [1, 2] and [4, 5] hit from 2 blocks on
    assert curve.refs == 12


@pytest.mark.parametrize("capacities", [[], [3, 2], [-1], [1.5]])
def test_bad_capacities_are_refused_by_name(capacities: list[int]) -> None:
    with pytest.raises(ValueError, match="capacities must be nondecreasing whole numbers"):
        LRUStackCurve(capacities)
