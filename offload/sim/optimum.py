"""The offline bound on hit ratio: farthest-next-use eviction with bypass.

No online policy can know the future, so this is the ceiling the policies are
measured against (README, Benchmarks): on a miss, a block that is never used again
is not stored at all, and otherwise it replaces the resident block whose next
use is farthest away, when that is later than its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

NEVER = float("inf")


def next_uses(requests: Sequence[Sequence[int]]) -> list[list[float]]:
    """For each request and position, the index of the next request using that block."""
    upcoming: dict[int, float] = {}
    result: list[list[float]] = [[] for _ in requests]
    for index in range(len(requests) - 1, -1, -1):
        hashes = requests[index]
        result[index] = [upcoming.get(h, NEVER) for h in hashes]
        for h in hashes:
            upcoming[h] = index
    return result


def offline_hits(requests: Sequence[Sequence[int]], capacity: int) -> int:
    """Prefix hits of the canonical replay under farthest-next-use with bypass."""
    nexts = next_uses(requests)
    resident: dict[int, float] = {}  # block -> its next use
    farthest: list[tuple[float, int]] = []  # max-heap by next use, lazily invalidated
    hits = 0
    for hashes, uses in zip(requests, nexts, strict=True):
        run = 0
        for h in hashes:
            if h not in resident:
                break
            run += 1
        hits += run
        for h, use in zip(hashes, uses, strict=True):
            if h in resident:
                resident[h] = use
                heapq.heappush(farthest, (-use, h))
                continue
            if use == NEVER:
                continue
            if len(resident) >= capacity:
                while -farthest[0][0] != resident.get(farthest[0][1]):
                    heapq.heappop(farthest)
                victim_use, victim = farthest[0]
                if -victim_use <= use:
                    continue
                heapq.heappop(farthest)
                del resident[victim]
            resident[h] = use
            heapq.heappush(farthest, (-use, h))
    return hits
