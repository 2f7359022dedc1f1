"""Prompt ends: the blocks that ended recent stores, to tell a prompt sent again from a new one.

A store ends where its prompt ends, mostly in a partial block that the next
turn sees under a new hash, so the tier ranks that block first to go. A
block that ended a store before and ends one again is no such tail: the
same prompt (or one cut at the same block) was sent again, and its next
send loads that block like any other.
"""

from __future__ import annotations

from collections import OrderedDict

from offload.base import BlockHash


class PromptEnds:
    """The last blocks of the ``limit`` most recent stores.

    Memory: at most ``limit`` hashes; the least recently ended are forgotten first.
    """

    __slots__ = ("_ends", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self._ends: OrderedDict[BlockHash, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ends)

    def ended_before(self, block_hash: BlockHash) -> bool:
        """Note that a store ends in ``block_hash``; whether a remembered store ended there."""
        ends = self._ends
        seen = block_hash in ends
        if seen:
            ends.move_to_end(block_hash)
        else:
            ends[block_hash] = None
            if len(ends) > self.limit:
                ends.popitem(last=False)
        return seen

    def clear(self) -> None:
        self._ends.clear()
