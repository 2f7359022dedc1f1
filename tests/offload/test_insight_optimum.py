"""``opt``, the offline optimum of prefix hits: exact on prefix-closed traces.

Random traces here are paths in a random tree of blocks, as every trace
vLLM makes is (a block's hash covers its whole prefix). On such traces the
optimum equals an exhaustive search and no online policy beats it; on other
traces it is only a feasible schedule, which the search bounds from above.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import policy_names
from offload.sim.optimum import offline_hits, prefix_conflict
from offload.sim.workload import run_workload
from tests.support.traces import prefix_closed_traces


def exhaustive_optimum(
    requests: Sequence[Sequence[int]], capacity: int, stored_from: int = 1
) -> int:
    """Most prefix hits over every schedule: after each request, keep any subset of
    what was held and what it named, of at most ``capacity`` blocks; a block not held
    joins only once it has been named ``stored_from`` times."""
    best = {frozenset(): 0}
    named: dict[int, int] = {}
    for request in requests:
        for h in request:
            named[h] = named.get(h, 0) + 1
        following: dict[frozenset[int], int] = {}
        for held, hits in best.items():
            run = next((i for i, h in enumerate(request) if h not in held), len(request))
            pool = sorted(held | {h for h in request if named[h] >= stored_from})
            for size in range(min(capacity, len(pool)) + 1):
                for kept in itertools.combinations(pool, size):
                    key = frozenset(kept)
                    following[key] = max(following.get(key, -1), hits + run)
        best = following
    return max(best.values())


@settings(max_examples=150, deadline=None)
@given(prefix_closed_traces(requests=6, depth=3), st.integers(1, 3))
def test_opt_equals_an_exhaustive_search_on_small_prefix_closed_traces(
    trace: list[list[int]], capacity: int
) -> None:
    assert prefix_conflict(trace) is None
    assert offline_hits(trace, capacity) == exhaustive_optimum(trace, capacity)


@settings(max_examples=150, deadline=None)
@given(prefix_closed_traces(requests=6, depth=3), st.integers(1, 3), st.integers(2, 3))
def test_opt_storing_from_a_later_reference_equals_the_search_under_that_rule(
    trace: list[list[int]], capacity: int, stored_from: int
) -> None:
    """The bound on gates that refuse first offers: the best schedule that never stores a
    block before its ``stored_from``-th reference, and never above the unrestricted one."""
    bound = offline_hits(trace, capacity, stored_from=stored_from)
    assert bound == exhaustive_optimum(trace, capacity, stored_from)
    assert bound <= offline_hits(trace, capacity)


def test_a_block_named_once_is_never_stored_under_a_second_reference_rule() -> None:
    trace = [[0, 1], [0, 1], [0, 1]]
    assert offline_hits(trace, 2) == 4
    assert offline_hits(trace, 2, stored_from=2) == 2  # stored at the second, hit at the third
    assert offline_hits(trace, 2, stored_from=3) == 0


def test_storing_from_below_the_first_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="stored_from must be at least 1, got 0"):
        offline_hits([[0]], 1, stored_from=0)


@settings(max_examples=150, deadline=None)
@given(prefix_closed_traces(requests=40, depth=6), st.integers(1, 12))
def test_no_online_policy_beats_opt_on_prefix_closed_traces(
    trace: list[list[int]], capacity: int
) -> None:
    best = offline_hits(trace, capacity)
    for policy in policy_names():
        online = run_workload(CPUOffloadingManager(1, capacity, policy), trace).hits
        assert online <= best, policy


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=5),
    st.integers(1, 3),
)
def test_on_any_trace_opt_is_a_feasible_schedule(trace: list[list[int]], capacity: int) -> None:
    assert offline_hits(trace, capacity) <= exhaustive_optimum(trace, capacity)


def test_prefix_conflict_names_the_first_block_that_changes_parent() -> None:
    assert prefix_conflict([[1, 2, 3], [1, 2], [4]]) is None
    assert prefix_conflict([[1, 2, 3], [1, 3]]) == (1, 3)
    assert prefix_conflict([[1, 2], [2]]) == (1, 2)  # a root the second time


def test_among_blocks_next_used_together_the_deepest_leaves_first() -> None:
    """Chain 0-1 is next used by the fourth request; block 2, sooner, needs one of its slots.

    Giving up 0 would leave 1 unreachable; giving up 1 keeps 0 a hit.
    """
    trace = [[0, 1], [2], [2], [0, 1]]
    assert offline_hits(trace, 2) == 2  # block 2 once, block 0 once


def test_progress_reports_every_request_once() -> None:
    seen: list[int] = []
    trace = [[0, i] for i in range(2500)]
    offline_hits(trace, 4, seen.append)
    assert sum(seen) == 2500
