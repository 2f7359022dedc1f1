"""The LRU curve at many capacities in one pass, from stack distances.

Mattson's observation (1970): LRU at capacity c holds the c most recently
used blocks, so one recency stack answers every capacity at once; a
reference hits at c when its stack distance is at most c. Only the bucket of
each distance matters for a curve at given capacities, so the stack is kept
as one segment per capacity (an OrderedDict each, oldest first), and a
reference costs a move across each boundary it crosses, in C-level dict
operations. Blocks deeper than the largest capacity are forgotten: memory
is that capacity's worth of hashes, never the trace's.

Every new block pushes one block across every boundary, so that move is
the stack's cost: it is a pop and an insert, with no per-block record of
its segment to rewrite. A block's segment is found instead by asking the
segments in turn, top first, which only a reference below the top segment
pays (a set of the held blocks answers a miss at once). Requests come a
frame at a time (``add_many``): the ingest thread pays the call and the
lookups of the stack's parts once per frame, not once per request.

Prefix semantics: a request's block at position i hits at c only when every
block before it does (kvscope's hits are the leading run of the chain that
is resident), so each reference counts at the largest bucket of its prefix.

The recency order modelled is a request's use as the LRU records it when the
request ends (``LRUCachePolicy.finish``, vLLM's order): the whole prompt
becomes most recent, its head newest. Under that order this curve equals an
``lru`` replay at every capacity whose tier holds each request's distinct
blocks (tests/offload/test_insight_stack_distance.py). The canonical
replay instead stores a request's missed blocks head-oldest above its hits,
so its content at c is not always inside its content at c + 1, and no single
stack can reproduce it at every capacity; the gap is measured, not hidden.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from offload.base import BlockHash


class LRUStackCurve:
    """Prefix hits of LRU at each capacity (in blocks, nondecreasing; 0 allowed)."""

    def __init__(self, capacities: Sequence[int]) -> None:
        sizes = list(capacities)
        if not sizes or any(type(c) is not int or c < 0 for c in sizes) or sizes != sorted(sizes):
            raise ValueError(f"capacities must be nondecreasing whole numbers >= 0, got {sizes}")
        self.capacities = tuple(sizes)
        self._segments: list[OrderedDict[BlockHash, None]] = [OrderedDict() for _ in sizes]
        rooms = [high - low for low, high in zip([0, *sizes], sizes, strict=False)]
        belows: list[OrderedDict[BlockHash, None] | None] = [*self._segments[1:], None]
        self._spills = tuple(
            zip(self._segments, rooms, belows, [s.popitem for s in self._segments], strict=True)
        )
        """Top first: each segment, the blocks it holds at most, the segment its overflow goes
        to (None under the last: forgotten) and its own ``popitem``."""
        self._held: set[BlockHash] = set()
        """Every block in a segment."""
        # _counts[k]: references whose prefix first fits at capacities[k]; the last: never.
        self._counts = [0] * (len(sizes) + 1)
        self.refs = 0

    @property
    def held_blocks(self) -> int:
        """Hashes held: at most the largest capacity."""
        return len(self._held)

    @property
    def hits(self) -> tuple[int, ...]:
        """Prefix hits at each capacity so far."""
        total, out = 0, []
        for count in self._counts[:-1]:
            total += count
            out.append(total)
        return tuple(out)

    def add_many(self, requests: Iterable[Sequence[BlockHash]]) -> None:
        """Requests in order, each its blocks in prompt order: for each, count its
        references, then make its blocks the most recent."""
        segments, held, counts, spills = self._segments, self._held, self._counts, self._spills
        top = segments[0]
        never = len(segments)
        refs = 0
        for block_hashes in requests:
            deepest = 0
            for block_hash in block_hashes:
                if block_hash not in top:
                    if block_hash in held:
                        segment = 1
                        while block_hash not in segments[segment]:
                            segment += 1
                        if segment > deepest:
                            deepest = segment
                    else:
                        deepest = never
                counts[deepest] += 1
            size = len(block_hashes)
            refs += size
            # The prompt's head ends newest: insert tail first (a repeat counts where it first is).
            for block_hash in reversed(dict.fromkeys(block_hashes)) if size > 1 else block_hashes:
                if block_hash in top:
                    top.move_to_end(block_hash)
                    continue
                if block_hash in held:
                    segment = 1
                    while block_hash not in segments[segment]:
                        segment += 1
                    del segments[segment][block_hash]
                else:
                    held.add(block_hash)
                top[block_hash] = None
            # Each segment's oldest overflow moves one segment down; the last one's is forgotten.
            for segment_blocks, room, below, pop in spills:
                excess = len(segment_blocks) - room
                if excess <= 0:
                    break  # nothing spilled into the segments below either
                if below is None:
                    for _ in range(excess):
                        held.remove(pop(False)[0])
                    break
                below[pop(False)[0]] = None  # one, the common case, without a loop
                if excess > 1:
                    for _ in range(excess - 1):
                        below[pop(False)[0]] = None
        self.refs += refs
