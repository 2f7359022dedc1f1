"""Stranded blocks: held in a tier, unreachable by any prefix lookup because an ancestor is gone.

A prefix lookup walks a prompt's chain from its first block and stops at the
first block held nowhere, so a block whose parent (or any block before it) is
held on no medium is dead weight, however hot it is. vLLM's ``BlockStored``
says where each block hangs: its ``block_hashes`` continue one chain, the
first from ``parent_block_hash`` (None: the chain's root). A block's parent
held on *another* medium still reaches it (the GPU prefix, then the CPU tier).

Kept exactly and incrementally, so a count costs nothing to read: each block
that names a parent is recorded as its parent's child, and a block's
stranded flag changes only when a block above it comes or goes. Then the
walk down its subtree flips each descendant once and stops at blocks already
in the new state, so the work is the number of blocks whose state changed.

Memory: two dict entries per held block that names a parent (its parent, and
its place among its parent's children) and one per stranded block, all
bounded by the index's ``max_blocks``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping


class StrandedBlocks:
    """Which held blocks are stranded, and how many on each location bit.

    ``held`` is the index's own map of held blocks (hash -> entry whose first
    item is the location bits). The index calls ``stored`` once a new block is
    entered, ``gone`` once a block is dropped, and ``moved`` when a held block
    gains or loses locations. Children are kept as one child per parent, plus
    a set only for the parents with more than one (a chain's common case costs
    one dict entry, no set).
    """

    def __init__(self, held: Mapping[Hashable, tuple]) -> None:
        self._held = held
        self._parent: dict[Hashable, Hashable] = {}
        self._child: dict[Hashable, Hashable] = {}
        self._more_children: dict[Hashable, set[Hashable]] = {}
        self._stranded: set[Hashable] = set()
        self.counts: dict[int, int] = {}
        """Location bit number -> stranded blocks held there."""

    def stored(self, block_hash: Hashable, parent: Hashable | None) -> None:
        """A block newly held, hanging under ``parent`` (None: a root, or not known)."""
        if parent is not None and parent != block_hash:
            self._parent[block_hash] = parent
            if parent in self._child:
                self._more_children.setdefault(parent, set()).add(block_hash)
            else:
                self._child[parent] = block_hash
            if parent not in self._held or parent in self._stranded:
                self._set(block_hash, True)
                return
        if block_hash in self._child:
            self._walk(block_hash, False)

    def gone(self, block_hash: Hashable, mask: int) -> None:
        """A block no longer held (it was on ``mask``): what hung under it is stranded."""
        if block_hash in self._stranded:
            self._stranded.discard(block_hash)
            self._count(mask, -1)
        parent = self._parent.pop(block_hash, None)
        if parent is not None:
            more = self._more_children.get(parent)
            if self._child[parent] == block_hash:
                if more:
                    self._child[parent] = more.pop()
                else:
                    del self._child[parent]
            elif more is not None:
                more.discard(block_hash)
            if more is not None and not more:
                del self._more_children[parent]
        if block_hash in self._child:
            self._walk(block_hash, True)

    def moved(self, block_hash: Hashable, bits: int, delta: int) -> None:
        """A held block gained (delta 1) or lost (delta -1) the locations ``bits``."""
        if block_hash in self._stranded:
            self._count(bits, delta)

    def clear(self) -> None:
        self._parent.clear()
        self._child.clear()
        self._more_children.clear()
        self._stranded.clear()
        self.counts.clear()

    def _children(self, block_hash: Hashable) -> list[Hashable]:
        child = self._child.get(block_hash)
        if child is None:
            return []
        return [child, *self._more_children.get(block_hash, ())]

    def _walk(self, top: Hashable, stranded: bool) -> None:
        """Set the flag of every block under ``top`` (not ``top``) that now changes."""
        stack = self._children(top)
        while stack:
            block_hash = stack.pop()
            if (block_hash in self._stranded) == stranded:
                continue
            self._set(block_hash, stranded)
            stack.extend(self._children(block_hash))

    def _set(self, block_hash: Hashable, stranded: bool) -> None:
        mask = self._held[block_hash][0]
        if stranded:
            self._stranded.add(block_hash)
            self._count(mask, 1)
        else:
            self._stranded.discard(block_hash)
            self._count(mask, -1)

    def _count(self, mask: int, delta: int) -> None:
        counts = self.counts
        bit = 0
        while mask:
            if mask & 1:
                counts[bit] = counts.get(bit, 0) + delta
            mask >>= 1
            bit += 1
