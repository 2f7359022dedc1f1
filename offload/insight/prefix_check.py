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
prefix hit shortens the head), so a change of it is the premise failing. A
change costs the curve a hit only where the tier may hold the block without
its new prefix: where the new predecessor was used less recently than the
block (or never), so that a recency order keeps the block longer, and so
long ago that a tier of the size spoken of has let it go. A block shared
behind several prefixes that are each used more often than it (one document
behind a few hot system prompts) changes predecessor without the first; one
whose new prefix is less recent but still well inside the tier (a document
behind a system prompt used a few requests before it) without the second:
wherever the block is held its prefix is too, and the curve counts what the
tier hits. So the check counts the changes whose new predecessor is the less
recent and out of ``reach`` (``broken``); their share of the reused
predecessor pairs is the sample's estimate of the share of references the
curve may count as hits the tier does not get.

Reach: a tier of LRU's order (a request's blocks most recent once it is
served, its head newest) holds a block while fewer other blocks were used
since; the sampled references since the start of the predecessor's last
request bound those from above (they count its request's blocks and every
later one, repeats and all). So a predecessor used at most ``reach``
sampled references before (``reach``: the sampled blocks the smallest tier
the check speaks for holds) is held by every tier from that size up, and
is no break for any of them; past it, it may be out of one, and is counted.
The bound costs nothing per reference (one number per request, the
references before it), and errs only towards counting: a predecessor whose
request was long, or whose later references repeated blocks, is counted
sooner than an exact stack distance would count it. Smaller tiers than the
one spoken of are not vouched for: on them a new prefix a few requests old
may be gone while the block is held.

Memory: one predecessor and the number of its last use per sampled block,
``max_blocks`` of them (the largest simulated tier's capacity: reuses farther
apart change no point of the curve) and one request's more at most, as the bound
is checked between requests; past it the check starts over, forgetting
predecessors, which at worst misses the change at each block's next use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from offload.base import BlockHash


class PrefixCheck:
    """Counts sampled references whose sampled predecessor differs from their last use's, was
    used less recently than they were, and more than ``reach`` sampled references before."""

    __slots__ = ("_before", "_refs", "broken", "checked", "max_blocks", "reach")

    def __init__(self, max_blocks: int, reach: int = 0) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        if reach < 0:
            raise ValueError(f"reach must be at least 0 sampled blocks, got {reach}")
        self.max_blocks = max_blocks
        self.reach = reach
        """The sampled blocks the smallest tier the check speaks for holds: a predecessor
        used within as many sampled references is in that tier and every larger one (0:
        every less recent predecessor is counted)."""
        self._before: dict[BlockHash, tuple[BlockHash | None, int]] = {}
        """Each block's sampled predecessor at its last use as one (None: none yet) and that
        use, as the sampled references before its request (a request's head is the more
        recent of two blocks of one request, as the tier's order has it)."""
        self._refs = reach + 1
        """Sampled references so far, counted from ``reach + 1``: every use is then out of
        reach of another only past ``reach`` references, and 0, a block never used, from
        the first request on, with no test of its own."""
        self.checked = 0
        """Sampled references with a sampled predecessor that had one at their last use."""
        self.broken = 0
        """Of those, the ones whose predecessor was another block, used less recently than
        they were (or never) and out of ``reach``."""

    @property
    def held_blocks(self) -> int:
        """Blocks whose predecessor is remembered: at most ``max_blocks`` and one request's
        sampled blocks more, the check's bound on its memory, which its tests hold it to."""
        return len(self._before)

    def add_many(self, requests: Iterable[Sequence[BlockHash]]) -> None:
        """Requests in order, each its sampled blocks in prompt order."""
        before, most, reach, refs = self._before, self.max_blocks, self.reach, self._refs
        checked = broken = 0
        for sampled in requests:
            if not sampled:
                continue
            if len(before) >= most:
                before.clear()
            use = refs
            refs += len(sampled)
            recent = use - reach  # uses before it are out of reach; never (0) always is
            # A request's first sampled block keeps the predecessor it had: its own may be
            # in the GPU prefix cache, out of the sample's sight.
            previous: BlockHash | None = None
            previous_use = 0
            for block_hash in sampled:
                last, last_use = before.get(block_hash, (None, 0))
                if previous is not None and last is not None:
                    checked += 1
                    if last != previous and previous_use < last_use and previous_use < recent:
                        broken += 1
                before[block_hash] = (last if previous is None else previous, use)
                previous, previous_use = block_hash, last_use
        self._refs = refs
        self.checked += checked
        self.broken += broken
