"""Shared prefixes: resident chains that hits have continued in more than one way.

A document or a tool list that opens many conversations is hit by requests
that go on differently after it; a conversation's own history is hit by its
next turn, which goes on where the previous turn did. A block on a prefix of
the first kind serves every chain that branches below it, so it is worth more
than a block that serves one conversation, however recent that one's use.
"""

from __future__ import annotations

from collections.abc import Sequence

from offload.base import BlockHash


class SharedPrefixes:
    """Which resident blocks lie on a prefix that hits have continued in two different ways.

    Memory: at most two entries per resident block (the block a hit last
    continued into after it, and whether it is shared); the owner forgets a
    block when it leaves the tier.
    """

    __slots__ = ("_continued", "_shared")

    def __init__(self) -> None:
        self._continued: dict[BlockHash, BlockHash] = {}
        """Resident block -> the block a hit last continued into after it."""
        self._shared: set[BlockHash] = set()

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._shared

    def note_hit(self, block_hashes: Sequence[BlockHash], hit: int) -> None:
        """A request whose first ``hit`` blocks were found stored.

        When a hit stops at a block that an earlier hit continued past, and
        this request goes on to another block, the whole hit prefix is shared.
        """
        if hit <= 0:
            return
        continued = self._continued
        if hit < len(block_hashes):
            before = continued.get(block_hashes[hit - 1])
            if before is not None and before != block_hashes[hit]:
                self._shared.update(block_hashes[:hit])
        for position in range(hit - 1):
            continued[block_hashes[position]] = block_hashes[position + 1]

    def forget(self, block_hash: BlockHash) -> None:
        """The block left the tier: what was learnt about it goes with it."""
        self._continued.pop(block_hash, None)
        self._shared.discard(block_hash)

    def tracked(self) -> set[BlockHash]:
        """Every block something is remembered about (for tests of the bound)."""
        return self._continued.keys() | self._shared

    def clear(self) -> None:
        self._continued.clear()
        self._shared.clear()
