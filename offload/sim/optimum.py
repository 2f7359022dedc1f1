"""The offline optimum of prefix hits: farthest-next-use eviction with bypass.

No online policy can know the future, so this is the ceiling the policies are
measured against (README, Benchmarks; ``kvscope replay --policy opt``): on a
miss, a block that is never used again is not stored at all, and otherwise it
replaces the resident block whose next use is farthest away, when that is
later than its own. Among blocks next used by the same request, the deepest
in its prompt leaves first.

Why that is the optimum of *prefix* hits, not only of block hits: in a
prefix-closed trace (each block always follows the same block, as vLLM's
hash chains guarantee, since a block's hash covers its whole prefix) every
request using a block also uses its parent, so a parent's next use is never
later than its child's. Evicting the farthest, deepest first, therefore never
keeps a block without its parent: every resident block's chain is resident,
and the prefix hits equal the block hits. Farthest-next-use with bypass
maximises block hits (Belady), and no schedule has more prefix hits than
block hits, so none beats it. On a trace that is not prefix-closed this is a
feasible schedule, not necessarily the best (``prefix_conflict`` finds out).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence

NEVER = float("inf")
PROGRESS_EVERY = 1024
"""Requests between two progress calls."""

Progress = Callable[[int], None]
"""Called with the requests done since the last call."""


def next_uses(requests: Sequence[Sequence[Hashable]]) -> list[list[float]]:
    """For each request and position, the index of the next request using that block."""
    upcoming: dict[Hashable, float] = {}
    result: list[list[float]] = [[] for _ in requests]
    for index in range(len(requests) - 1, -1, -1):
        hashes = requests[index]
        result[index] = [upcoming.get(h, NEVER) for h in hashes]
        for h in hashes:
            upcoming[h] = index
    return result


def offline_hits(
    requests: Sequence[Sequence[Hashable]],
    capacity: int,
    progress: Progress | None = None,
    *,
    stored_from: int = 1,
) -> int:
    """Prefix hits of the canonical replay under farthest-next-use with bypass
    (``offline_runs``, summed)."""
    return sum(offline_runs(requests, capacity, progress, stored_from=stored_from))


def offline_runs(
    requests: Sequence[Sequence[Hashable]],
    capacity: int,
    progress: Progress | None = None,
    *,
    stored_from: int = 1,
) -> list[int]:
    """Per request, its prefix hits (the leading blocks that hit) under farthest-next-use
    with bypass: which references hit, not only how many, for an error that depends on how
    the hits fall over the blocks (offload/insight/uncertainty.py).

    ``stored_from`` > 1 bounds the policies that never store a block before
    its ``stored_from``-th reference (2: every gate that refuses first offers,
    vLLM's reuse filter among them): until then, a block is bypassed whatever
    its next use. In a prefix-closed trace a block's parent has been named at
    least as often as the block, so the rule never holds a block without its
    parent, and the schedule is still the best of those policies'.
    """
    if stored_from < 1:
        raise ValueError(f"stored_from must be at least 1, got {stored_from}")
    nexts = next_uses(requests)
    named: dict[Hashable, int] = {}  # block -> times named while not held (stored_from > 1)
    resident: dict[Hashable, tuple[float, int]] = {}  # block -> (next use, depth)
    # Max-heap by (next use, depth), lazily invalidated: an entry is current while
    # it equals the block's resident key.
    farthest: list[tuple[float, int, int, Hashable]] = []
    runs: list[int] = []
    order = 0  # a unique tie-break, so the hashes themselves are never compared
    for done, (hashes, uses) in enumerate(zip(requests, nexts, strict=True), start=1):
        run = 0
        for h in hashes:
            if h not in resident:
                break
            run += 1
        runs.append(run)
        for depth, (h, use) in enumerate(zip(hashes, uses, strict=True)):
            order += 1
            if h in resident:
                resident[h] = (use, depth)
                heapq.heappush(farthest, (-use, -depth, order, h))
                continue
            if stored_from > 1:
                named[h] = times = named.get(h, 0) + 1
                if times < stored_from:
                    continue
            if use == NEVER:
                continue
            if len(resident) >= capacity:
                while (-farthest[0][0], -farthest[0][1]) != resident.get(farthest[0][3]):
                    heapq.heappop(farthest)
                victim_use, _, _, victim = farthest[0]
                if -victim_use <= use:
                    continue
                heapq.heappop(farthest)
                del resident[victim]
            resident[h] = (use, depth)
            heapq.heappush(farthest, (-use, -depth, order, h))
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(PROGRESS_EVERY)
    if progress is not None and len(requests) % PROGRESS_EVERY:
        progress(len(requests) % PROGRESS_EVERY)
    return runs


def prefix_conflict(requests: Sequence[Sequence[Hashable]]) -> tuple[int, Hashable] | None:
    """The first (request index, block) that follows a different block than before, or None.

    None means the trace is prefix-closed, and ``offline_hits`` is the optimum.
    """
    parent: dict[Hashable, object] = {}
    start = object()
    for index, hashes in enumerate(requests):
        previous: object = start
        for h in hashes:
            if parent.setdefault(h, previous) != previous:
                return index, h
            previous = h
    return None
