"""One indexed block's record, changed in place as events arrive.

The index keeps a million of these in one dict. A record is a struct the
cyclic garbage collector never tracks (``gc=False``), and the dict's keys are
bytes or ints, so the dict itself is never tracked either: full collections
never walk the index, however large it grows. That holds only while a record
references nothing the collector tracks, so its fields are numbers, flags and
hashes only.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from offload.wire.labels import BlockHash


class HeldBlock(msgspec.Struct, gc=False):
    """Where a block is held and its history, as the index, its listing and the stranded count
    read it."""

    block_hash: BlockHash
    shard: int
    """Which of the index's dicts holds it, and of the stranded count's holds its children
    (app/state/shards.py): computed once, when it is entered."""
    mask: int
    """Location bits: one per (publisher, medium, KV cache group) the block is held on; zero
    once the block is gone (the listing keeps the record until it sweeps it)."""
    seq: int
    """Its sequence number, taken when it was entered: its place in the listing."""
    first: float
    """When it was first stored (the time ``BlockIndex.apply`` was given)."""
    last: float
    """When it was last stored."""
    hits: int
    """GPU stores of it while a lower tier held it: reloads."""
    size: int | None
    """Tokens per block, as its first store named (None when it named none), or a coarser
    store that it was hung under since."""
    parent: BlockHash | None
    """The block its store said it hangs under (None: a root, or not known): its first
    store's, or the coarsest store's named up its chain since (a hybrid model's groups
    chain one hash under blocks of their own sizes)."""
    parent_shard: int
    """The parent's shard (0 without a parent)."""
    stranded: bool
    """Whether a block above it is held nowhere, so no prefix lookup reaches it."""


def location_numbers(mask: int) -> Iterator[int]:
    """The bit numbers set in a location mask, lowest first: its set bits only, as a mask is
    as wide as its highest location (walking every bit up to it once took minutes)."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
