"""Whether the sampled stream keeps the premise its prefix hits rest on.

A tier's lookup stops at a request's first miss, so a block deep in a
request hits only when every block before it does. The sample sees only its
own blocks, and counts a sampled block as hit when the sampled blocks before
it are: that stands for the tier only while a block's unsampled
predecessors are as resident as it is, which holds when a block always
follows the same prefix (vLLM's hash chains: a block's hash covers its
prefix, so the tier keeps the chain's head at least as long as its tail).
A trace whose block ids recur behind other prefixes (random ids reused at
different positions) breaks it: a sampled block resident from one request
is counted as hit in another whose earlier, unsampled blocks miss, and the
sampled curve reads far above the tier, by an amount the sample cannot
measure.

What the sample can see is the same relation among its own blocks: on a
chained stream a sampled block's sampled predecessor in a request is always
the same block (or none, where the request's sample starts after it: a GPU
prefix hit shortens the head), so any change of it is the premise failing.
The share of reused predecessor pairs that changed is a lower bound on the
share of references whose prefix changed, each of which the curve may count
as a hit the tier does not get.

Memory: one predecessor per sampled block, ``max_blocks`` of them (the
largest simulated tier's capacity: reuses farther apart change no point of the
curve) and one request's more at most, as the bound is checked between
requests; past it the check starts over, forgetting predecessors, which at worst
misses the change at each block's next use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from offload.base import BlockHash


class PrefixCheck:
    """Counts sampled references whose sampled predecessor differs from their last use's."""

    __slots__ = ("_before", "changed", "checked", "max_blocks")

    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._before: dict[BlockHash, BlockHash] = {}
        self.checked = 0
        """Sampled references with a sampled predecessor that had one at their last use."""
        self.changed = 0
        """Of those, the ones whose predecessor was another block."""

    @property
    def held_blocks(self) -> int:
        """Blocks whose predecessor is remembered: at most ``max_blocks`` and one request's
        sampled blocks more, the check's bound on its memory, which its tests hold it to."""
        return len(self._before)

    def add_many(self, requests: Iterable[Sequence[BlockHash]]) -> None:
        """Requests in order, each its sampled blocks in prompt order."""
        before = self._before
        checked = changed = 0
        for sampled in requests:
            if len(sampled) < 2:
                continue
            if len(before) >= self.max_blocks:
                before.clear()
            previous = sampled[0]
            for block_hash in sampled[1:]:
                last = before.get(block_hash)
                if last is not None:
                    checked += 1
                    if last != previous:
                        changed += 1
                before[block_hash] = previous
                previous = block_hash
        self.checked += checked
        self.changed += changed
