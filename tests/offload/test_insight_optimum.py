"""``opt``, the offline optimum of prefix hits: exact on prefix-closed traces.

Random traces here are paths in a random tree of blocks, as every trace
vLLM makes is (a block's hash covers its whole prefix). On such traces the
optimum equals an exhaustive search and no online policy beats it; on other
traces it is only a feasible schedule, which the search bounds from above.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import policy_names
from offload.sim.optimum import offline_hits, prefix_conflict
from offload.sim.workload import run_workload


@st.composite
def prefix_closed_traces(draw: st.DrawFn, requests: int, depth: int) -> list[list[int]]:
    """Paths from the roots of a random forest: each request follows or grows a branch."""
    children: dict[int | None, list[int]] = {}
    trace = []
    for _ in range(draw(st.integers(1, requests))):
        node: int | None = None
        path = []
        for _ in range(draw(st.integers(1, depth))):
            kids = children.setdefault(node, [])
            if kids and draw(st.booleans()):
                node = draw(st.sampled_from(kids))
            else:
                node = sum(map(len, children.values()))
                kids.append(node)
            path.append(node)
        trace.append(path)
    return trace


def exhaustive_optimum(requests: Sequence[Sequence[int]], capacity: int) -> int:
    """Most prefix hits over every schedule: after each request, keep any subset of
    what was held and what it named, of at most ``capacity`` blocks."""
    best = {frozenset(): 0}
    for request in requests:
        following: dict[frozenset[int], int] = {}
        for held, hits in best.items():
            run = next((i for i, h in enumerate(request) if h not in held), len(request))
            pool = sorted(held | set(request))
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
