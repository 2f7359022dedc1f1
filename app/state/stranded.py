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

A held block's parent and flag live in its index record (``HeldBlock``), not in
maps of their own: the index already reads and writes that record for every
event, so the bookkeeping keeps one map (each parent's children, spread over
shards: app/state/shards.py) where it kept four, and a store or a removal
touches it two or three times. Like the index's, that map holds no object the
cyclic garbage collector tracks (a parent of several children holds them in a
``Siblings``, which it never tracks), so full collections never walk it. The
index enters a store's new blocks and drops a removal's reachable leaves in
its own per-block loops, with ``children`` (app/state/block_index.py): the
per-block work is then a few dict operations, not Python calls as well.

Memory: one map entry per parent of a held block, bounded by the index's
``max_blocks``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

import msgspec

from app.state.held_block import HeldBlock, location_numbers
from app.state.shards import SHARDS, shard_of

MAX_REHANG_LINKS: Final = 64
"""Most links up its chain a block is searched for the coarser parent it moves under
(``rehang``): a coarse block of 64 of the finest; beyond, it keeps its parent. Bounds
the search a peer's block sizes ask for."""


class Siblings(msgspec.Struct, gc=False):
    """The children of a parent that has several, as the keys of a dict.

    Neither is ever tracked by the collector: the struct by construction, the
    dict because it holds only hashes and None (a set is always tracked). So a
    parent of a million children (a system prompt every conversation opens
    with) adds nothing to a full collection, and the map of children that
    holds it stays untracked.
    """

    members: dict[Hashable, None]


class StrandedBlocks:
    """How many held blocks are stranded on each location bit, and who hangs under whom.

    ``held`` is the index's shards of held blocks' records. The index enters each new
    block in ``children`` under its parent itself, then calls ``flag`` when it is stranded
    (its parent is held nowhere, or stranded) or ``walk`` when blocks hang under it
    already; it calls ``gone`` once a block is dropped (but for a reachable leaf, which
    it unhangs itself), and ``count`` when a stranded block gains or loses locations.
    Each parent maps to its one child, or to ``Siblings`` when it has more (a chain's
    common case costs one dict entry, no set).
    """

    def __init__(self, held: tuple[dict[Hashable, HeldBlock], ...]) -> None:
        self._held = held
        self.children: tuple[dict[Hashable, Hashable | Siblings], ...] = tuple(
            {} for _ in range(SHARDS)
        )
        """Per shard of the parent: parent -> its one child, or ``Siblings``. The index's
        store and removal loops change it inline for the common cases (a call per block
        would be most of their cost)."""
        self.counts: dict[int, int] = {}
        """Location bit number -> stranded blocks held there."""
        self.walked = 0
        """Children the walks looked at, since start: their work, which a store or removal
        of one block can make as large as the blocks held (a chain's root that comes and
        goes), for the index to count in its parts of a batch (``BlockIndex.apply``)."""

    def gone(self, entry: HeldBlock, mask: int) -> None:
        """A block no longer held (``entry``: its record, ``mask``: the locations it left):
        what hung under it is stranded."""
        if entry.stranded:
            self.count(mask, -1)
        self.unhang(entry)
        if entry.block_hash in self.children[entry.shard]:
            self.walk(entry, True)

    def rehang(
        self, record: HeldBlock, parent: Hashable | None, parent_shard: int, links: int
    ) -> bool:
        """Hang a held block under ``parent`` instead, if that is a root (None), or the block
        is stranded, or ``parent`` is at most ``links`` links up its chain; say whether it
        moved.

        A hybrid model's groups of different block sizes chain one hash under different
        parents, a coarse group's being an ancestor of a finer one's, and the index moves a
        block under its coarsest (app/state/block_index.py). A move under one of its own
        descendants would close a loop: a reachable block may then move only up its chain
        (the search costs ``links`` look-ups, once per block and coarser size), or its loop
        would stay reachable with no root above it; a stranded block's descendants are
        stranded, so its loop would stay stranded, as no root reaches it.
        """
        if parent == record.block_hash:
            return False
        if not (
            parent is None
            or record.stranded
            or self._above(record, parent, min(links, MAX_REHANG_LINKS))
        ):
            return False
        self.unhang(record)
        record.parent, record.parent_shard = parent, parent_shard
        stranded = False
        if parent is not None:
            children = self.children[parent_shard]
            _adopt(children, parent, children.get(parent), record.block_hash)
            above = self._held[parent_shard].get(parent)
            stranded = above is None or above.stranded
        if stranded != record.stranded:
            self.flag(record, stranded)
            self.walk(record, stranded)
        return True

    def _above(self, record: HeldBlock, ancestor: Hashable, links: int) -> bool:
        """Whether ``ancestor`` is at most ``links`` links up the chain of a reachable block
        (whose ancestors are all held)."""
        held = self._held
        above, shard = record.parent, record.parent_shard
        for _ in range(links):
            if above is None:
                return False
            if above == ancestor:
                return True
            node = held[shard].get(above)
            if node is None:
                return False
            above, shard = node.parent, node.parent_shard
        return False

    def unhang(self, record: HeldBlock) -> None:
        """Take a block out of its parent's children."""
        block_hash, parent = record.block_hash, record.parent
        if parent is not None and parent != block_hash:
            children = self.children[record.parent_shard]
            child = children[parent]
            if type(child) is not Siblings:
                del children[parent]
            else:
                del child.members[block_hash]
                if len(child.members) == 1:
                    children[parent] = next(iter(child.members))

    def count(self, mask: int, delta: int) -> None:
        """A stranded block entered (1) or left (-1) the locations ``mask``: its set bits
        only, so the cost is the block's locations, not the highest bit number."""
        counts = self.counts
        for bit in location_numbers(mask):
            counts[bit] = counts.get(bit, 0) + delta

    def walk(self, top: HeldBlock, stranded: bool) -> None:
        """Set the flag of every block under ``top`` (not ``top``) that now changes."""
        held, shards = self._held, self.children
        stack = [top]
        walked = 0
        while stack:
            above = stack.pop()
            below = shards[above.shard].get(above.block_hash)
            if below is None:
                continue
            children = below.members if type(below) is Siblings else (below,)
            walked += len(children)
            for block_hash in children:
                record = held[shard_of(block_hash)][block_hash]  # children are held
                if record.stranded != stranded:
                    self.flag(record, stranded)
                    stack.append(record)
        self.walked += walked

    def flag(self, record: HeldBlock, stranded: bool) -> None:
        """Set one held block's flag, counting it on its locations."""
        record.stranded = stranded
        self.count(record.mask, 1 if stranded else -1)


def _adopt(
    children: dict[Hashable, Hashable | Siblings],
    parent: Hashable,
    child: Hashable | Siblings | None,
    block_hash: Hashable,
) -> None:
    """Enter ``block_hash`` among ``parent``'s children in ``children``, which held ``child``
    for it (None: no child yet). The index's store loop inlines it: a call per block costs
    that loop 5%."""
    if child is None:
        children[parent] = block_hash
    elif type(child) is Siblings:
        child.members[block_hash] = None
    else:
        children[parent] = Siblings({child: None, block_hash: None})
