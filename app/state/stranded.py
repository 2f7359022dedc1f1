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

A held block's parent and flag live in its index entry (the entry's last two
items), not in maps of their own: the index already reads and writes that
entry for every event, so the bookkeeping keeps one dict (each parent's
children) where it kept four, and a store or a removal touches it two or
three times. The index hands over an event's stored blocks in one call: the
per-block work is then a few dict operations, not a Python call as well.

Memory: one dict entry per parent of a held block, bounded by the index's
``max_blocks``.
"""

from __future__ import annotations

from collections.abc import Hashable, MutableMapping

MASK, SEQ, PARENT, STRANDED = 0, 1, -2, -1
"""Where an index entry (a tuple) keeps the block's location bits, its sequence number (taken
when it was entered), the parent its store named, and whether the block is stranded."""


class StrandedBlocks:
    """How many held blocks are stranded on each location bit, and who hangs under whom.

    ``held`` is the index's own map of held blocks (hash -> entry: location
    bits first, parent and stranded flag last). The index enters an event's new
    blocks not stranded and then calls ``stored``, calls ``gone`` once a block is
    dropped, and ``count`` when a stranded block gains or loses locations.
    Each parent maps to its one child, or to a set of them when it has more
    (a chain's common case costs one dict entry, no set).
    """

    def __init__(self, held: MutableMapping[Hashable, tuple]) -> None:
        self._held = held
        self._children: dict[Hashable, Hashable | set[Hashable]] = {}
        self.counts: dict[int, int] = {}
        """Location bit number -> stranded blocks held there."""

    def stored(self, block_hashes: list[Hashable], parents: list[Hashable | None]) -> None:
        """Blocks one event newly held, in its order, each entered not stranded, hanging under
        its parent (None: a root, or not known; the block itself: ignored).

        One call per event, not per block: a chain's block hangs under the block
        entered just before it, whose state and children this loop has just read,
        so it costs no look-up of its parent. A parent entered by the same event after
        its child (a cycle) was not held when the child came: its sequence
        number, later than the child's, says so.
        """
        held, children = self._held, self._children
        previous: Hashable | None = None
        previous_stranded = False
        previous_children: Hashable | set[Hashable] | None = None
        for block_hash, parent in zip(block_hashes, parents, strict=True):
            stranded = False
            if parent is not None and parent != block_hash:
                if parent is previous:
                    child, stranded = previous_children, previous_stranded
                else:
                    child = children.get(parent)
                    above = held.get(parent)
                    stranded = (
                        above is None or above[STRANDED] or above[SEQ] > held[block_hash][SEQ]
                    )
                if child is None:
                    children[parent] = block_hash
                elif type(child) is set:
                    child.add(block_hash)
                else:
                    children[parent] = {child, block_hash}
            below = children.get(block_hash)
            if stranded:
                self._set(block_hash, True)  # what hangs under it was stranded already
            elif below is not None:
                self._walk(block_hash, False)
            previous, previous_stranded, previous_children = block_hash, stranded, below

    def gone(self, block_hash: Hashable, entry: tuple) -> None:
        """A block no longer held (``entry``: its last index entry): what hung under it is
        stranded."""
        if entry[STRANDED]:
            self.count(entry[MASK], -1)
        children = self._children
        parent = entry[PARENT]
        if parent is not None and parent != block_hash:
            child = children[parent]
            if type(child) is not set:
                del children[parent]
            else:
                child.discard(block_hash)
                if len(child) == 1:
                    children[parent] = child.pop()
        if block_hash in children:
            self._walk(block_hash, True)

    def count(self, mask: int, delta: int) -> None:
        """A stranded block entered (1) or left (-1) the locations ``mask``."""
        counts = self.counts
        bit = 0
        while mask:
            if mask & 1:
                counts[bit] = counts.get(bit, 0) + delta
            mask >>= 1
            bit += 1

    def _walk(self, top: Hashable, stranded: bool) -> None:
        """Set the flag of every block under ``top`` (not ``top``) that now changes."""
        held, children = self._held, self._children
        stack = [top]
        while stack:
            below = children.get(stack.pop())
            if below is None:
                continue
            for block_hash in below if type(below) is set else (below,):
                if held[block_hash][STRANDED] != stranded:
                    self._set(block_hash, stranded)
                    stack.append(block_hash)

    def _set(self, block_hash: Hashable, stranded: bool) -> None:
        entry = self._held[block_hash]
        self._held[block_hash] = (*entry[:STRANDED], stranded)
        self.count(entry[MASK], 1 if stranded else -1)
