"""The LRU curve at many capacities in one pass, from stack distances.

Mattson's observation (1970): LRU at capacity c holds the c most recently
used blocks, so one recency stack answers every capacity at once; a
reference hits at c when its stack distance is at most c. Only the bucket of
each distance matters for a curve at given capacities, so the stack is kept
as one segment per capacity (an OrderedDict each, oldest first), and a
reference costs a move across each boundary it crosses, in C-level dict
operations. Blocks deeper than the largest capacity are forgotten: memory
is that capacity's worth of hashes, never the trace's.

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
from collections.abc import Sequence

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
        self._spills = [
            (segment, room, below, number)
            for number, (segment, room, below) in enumerate(
                zip(self._segments, rooms, belows, strict=True), 1
            )
        ]
        """Top first: each segment, the blocks it holds at most, the segment its overflow goes
        to (None under the last: forgotten) and that one's number."""
        self._segment_of: dict[BlockHash, int] = {}
        # _counts[k]: references whose prefix first fits at capacities[k]; the last: never.
        self._counts = [0] * (len(sizes) + 1)
        self.refs = 0

    @property
    def held_blocks(self) -> int:
        """Hashes held: at most the largest capacity."""
        return len(self._segment_of)

    @property
    def hits(self) -> tuple[int, ...]:
        """Prefix hits at each capacity so far."""
        total, out = 0, []
        for count in self._counts[:-1]:
            total += count
            out.append(total)
        return tuple(out)

    def add(self, block_hashes: Sequence[BlockHash]) -> None:
        """One request: count its references, then make its blocks the most recent."""
        segment_of, segments = self._segment_of, self._segments
        never = len(segments)
        where = segment_of.get
        counts = self._counts
        deepest = 0
        for block_hash in block_hashes:
            segment = where(block_hash, never)
            if segment > deepest:
                deepest = segment
            counts[deepest] += 1
        self.refs += len(block_hashes)
        # The prompt's head ends newest: insert tail first (a repeat counts where it first is).
        top = segments[0]
        for block_hash in reversed(dict.fromkeys(block_hashes)):
            segment = where(block_hash)
            if segment is not None:
                del segments[segment][block_hash]
            top[block_hash] = None
            segment_of[block_hash] = 0
        # Each segment's oldest overflow moves one segment down; the last one's is forgotten.
        # Inline, not a method: it runs per request, and most requests are a block or two.
        for segment, room, below, deeper in self._spills:
            excess = len(segment) - room
            if excess <= 0:
                return  # nothing spilled into the segments below either
            pop = segment.popitem
            if below is None:
                for _ in range(excess):
                    del segment_of[pop(False)[0]]
                return
            for _ in range(excess):
                block_hash = pop(False)[0]
                below[block_hash] = None
                segment_of[block_hash] = deeper
