"""The sidecar's live block index: which blocks exist, on which publisher and medium, since when.

Fed by the ingest thread from the KV-event streams of every publisher, it answers
"where is this block", "how much of this prompt's prefix is cached, and where"
and paged listings for the API, from memory, at the cost of one dict lookup per
event. How it keys blocks, counts hits and caps its memory: docs/ARCHITECTURE.md.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable
from operator import itemgetter
from typing import Final

import msgspec

from app.decode import DEFAULT_MEDIUM, DecodedBatch, DecodedEvent
from app.settings import MAX_PAGE_LIMIT
from app.state.stranded import MASK, SEQ, STRANDED, StrandedBlocks

# Per block, the index keeps one tuple of atomic values (location mask,
# sequence, first stored, last stored, hits, block size, and for
# app/state/stranded.py the parent its store named and whether it is
# stranded; the positions are stranded.py's MASK, SEQ, PARENT, STRANDED) in
# one dict, never a mutable object: the cyclic garbage collector stops
# tracking such tuples, so an index of millions of blocks adds nothing to
# every full collection's walk (with a list per block, those walks grow with
# the index and pause ingest).
# One dict, not one per field: CPython rebuilds a dict that churn has filled
# with deleted slots in one go, and at a million entries each rebuild stalls
# ingest and every request for tens of milliseconds.

_COMPACT_SLACK: Final = 1024
"""Dead listing slots tolerated beyond the live count before the listing is rebuilt."""


class BlockEntry(msgspec.Struct, frozen=True):
    """A snapshot of one indexed block (built on request, never on the hot path).

    ``block_size`` is the one the first store named (None when it named none);
    times are the ``now`` values passed to ``BlockIndex.apply``.
    """

    block_hash: bytes | int
    media: tuple[str, ...]
    publishers: tuple[str, ...]
    block_size: int | None
    first_stored: float
    last_stored: float
    hits: int
    seq: int


class Usage(msgspec.Struct, frozen=True):
    """Blocks one publisher holds on one medium; bytes when its block size in bytes is known.

    ``stranded`` of those blocks no prefix lookup can reach (app/state/stranded.py).
    """

    publisher: str
    medium: str
    blocks: int
    bytes: int | None
    stranded: int = 0


class PrefixMatch(msgspec.Struct, frozen=True):
    """How far a chain of block hashes is indexed.

    ``runs`` maps every known medium to the length of the chain's leading run
    of blocks held on it; ``break_index`` is the first block held nowhere (the
    chain's length when every block is held somewhere).
    """

    runs: dict[str, int]
    break_index: int


class BlockIndex:
    """Block hash -> locations and timings, for every publisher the sidecar follows.

    Not thread-safe: one ingest thread applies batches; readers run on the same
    thread (or take their own lock around both).
    """

    def __init__(self, max_blocks: int, max_media: int = 16) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        if max_media < 1:
            raise ValueError(f"max_media must be at least 1, got {max_media}")
        self.max_blocks = max_blocks
        self.max_media = max_media
        """Most distinct media tracked: each is a bit of every block's location mask per
        publisher and a key of every answer, so a peer naming thousands would slow them all."""
        self.overflow = 0
        """Stores of blocks refused because the index was full."""
        self.refused_media_events = 0
        """Events refused because they named a medium past ``max_media``."""
        self._media: set[str] = set()
        self.untracked_removals = 0
        """Removals of locations the index did not hold."""
        # block hash -> (location bits, sequence, first stored, last stored, hits, block size,
        # parent, stranded)
        self._blocks: dict[
            Hashable, tuple[int, int, float, float, int, int | None, Hashable | None, bool]
        ] = {}
        # Every entry ever created, by sequence, for paging; an item is dead once
        # its hash is gone or was re-created under a later sequence.
        self._listing_seqs: list[int] = []
        self._listing_hashes: list[Hashable] = []
        self._next_seq = 0
        self._locations: dict[tuple[str, str], int] = {}  # (publisher, medium) -> bit number
        self._location_names: list[tuple[str, str]] = []  # bit number -> (publisher, medium)
        self._counts: list[int] = []  # bit number -> blocks held there
        self._block_bytes: dict[tuple[str, str], int] = {}
        self._lower_tier_bits = 0  # the bits of every location whose medium is not the GPU
        self.stranded = StrandedBlocks(self._blocks)
        """Held blocks no prefix lookup reaches: an ancestor named by the events is held nowhere."""

    def __len__(self) -> int:
        return len(self._blocks)

    # --- ingest -------------------------------------------------------------------

    def apply(self, publisher: str, batch: DecodedBatch, now: float) -> None:
        """Apply one decoded batch of ``publisher``'s events, in order, at time ``now``."""
        for event in batch.events:
            if event.kind == "stored":
                self._store(publisher, event, now)
            elif event.kind == "removed":
                self._remove(publisher, event)
            else:
                self.reset_publisher(publisher)
        self._compact_listing()

    def _store(self, publisher: str, event: DecodedEvent, now: float) -> None:
        number = self._location(publisher, event.medium or DEFAULT_MEDIUM)
        if number is None:
            return
        bit = 1 << number
        reload_bits = 0 if bit & self._lower_tier_bits else self._lower_tier_bits
        blocks = self._blocks
        list_seq, list_hash = self._listing_seqs.append, self._listing_hashes.append
        room = self.max_blocks - len(blocks)
        block_size = event.block_size
        stranded = self.stranded
        # The event's blocks continue one chain: each hangs under the one before it.
        parent = event.parent_block_hash
        seq = self._next_seq
        added = refused = 0
        parents: list[Hashable | None] = []  # of each block entered, in order
        for block_hash in event.block_hashes:
            entry = blocks.get(block_hash)
            if entry is None:
                if room <= 0:
                    refused += 1
                    parent = block_hash
                    continue
                room -= 1
                added += 1
                blocks[block_hash] = (bit, seq, now, now, 0, block_size, parent, False)
                list_seq(seq)
                list_hash(block_hash)
                seq += 1
                parents.append(parent)
                parent = block_hash
                continue
            parent = block_hash
            mask, created, first, _last, hits, size, above, flag = entry
            if mask & reload_bits:
                hits += 1
            if not mask & bit:
                mask |= bit
                added += 1
                if flag:
                    stranded.count(bit, 1)
            blocks[block_hash] = (mask, created, first, now, hits, size, above, flag)
        if parents:  # the blocks entered are the listing's newest items
            stranded.stored(self._listing_hashes[-len(parents) :], parents)
        self._next_seq = seq
        self._counts[number] += added
        self.overflow += refused

    def _remove(self, publisher: str, event: DecodedEvent) -> None:
        number = self._location(publisher, event.medium or DEFAULT_MEDIUM)
        if number is None:
            return
        bit = 1 << number
        blocks = self._blocks
        stranded = self.stranded
        removed = 0
        # Tail first: a chain listed head first then leaves without stranding,
        # one after another, every block below the head (the result is the same).
        for block_hash in reversed(event.block_hashes):
            entry = blocks.get(block_hash)
            if entry is None or not entry[MASK] & bit:
                continue
            removed += 1
            mask = entry[MASK] ^ bit
            if mask:
                blocks[block_hash] = (mask, *entry[1:])
                if entry[STRANDED]:
                    stranded.count(bit, -1)
            else:
                del blocks[block_hash]
                stranded.gone(block_hash, entry)
        self._counts[number] -= removed
        self.untracked_removals += len(event.block_hashes) - removed

    def _location(self, publisher: str, medium: str) -> int | None:
        """The bit number of a (publisher, medium) pair, allocated on first sight.

        None (the event counted in ``refused_media_events``) for a medium past ``max_media``.
        """
        key = (publisher, medium)
        number = self._locations.get(key)
        if number is None:
            if medium not in self._media:
                if len(self._media) >= self.max_media:
                    self.refused_media_events += 1
                    return None
                self._media.add(medium)
            number = self._locations[key] = len(self._location_names)
            self._location_names.append(key)
            self._counts.append(0)
            if medium != DEFAULT_MEDIUM:
                self._lower_tier_bits |= 1 << number
        return number

    def reset_publisher(self, publisher: str) -> None:
        """Forget every location of ``publisher`` (its cache was reset, or it restarted)."""
        bits = self._bits(publisher=publisher)
        if not bits:
            return
        keep = ~bits
        blocks = self._blocks
        stranded = self.stranded
        for block_hash in list(blocks):
            entry = blocks[block_hash]  # read now: a drop before it may have changed its flag
            dropped = entry[MASK] & bits
            if not dropped:
                continue
            if mask := entry[MASK] & keep:
                blocks[block_hash] = (mask, *entry[1:])
                if entry[STRANDED]:
                    stranded.count(dropped, -1)
            else:
                del blocks[block_hash]
                stranded.gone(block_hash, entry)
        for number, (owner, _medium) in enumerate(self._location_names):
            if owner == publisher:
                self._counts[number] = 0
        self._compact_listing()

    def _compact_listing(self) -> None:
        """Drop dead items from the listing once they outnumber the live ones.

        Dropping a block leaves its listing item in place, because finding it
        would cost a search per removed block; rebuilding when the dead
        dominate keeps the listing within twice the index's size, at amortised
        O(1) per removal. The rebuild reads the live blocks straight from
        ``_blocks``, whose order is the listing's: an entry is inserted when its
        block is first stored (taking the next sequence number), updates keep
        its place, and a block dropped and stored again is inserted anew at
        the end. So the rebuild runs at C speed, with no object per block: a
        million-block index rebuilds in tens of milliseconds, where a Python
        loop over the listing stalled ingest and every request for half a second.
        """
        if len(self._listing_seqs) > 2 * len(self._blocks) + _COMPACT_SLACK:
            self._listing_hashes = list(self._blocks)
            self._listing_seqs = list(map(itemgetter(SEQ), self._blocks.values()))

    def set_block_bytes(self, publisher: str, medium: str, block_bytes: int) -> None:
        """Declare the size in bytes of one of ``publisher``'s blocks on ``medium``.

        Events carry no byte sizes; stats frames (or configuration) do, and
        from then on ``usage`` reports bytes for that location.
        """
        if block_bytes < 0:
            raise ValueError(f"block_bytes must not be negative, got {block_bytes}")
        self._block_bytes[(publisher, medium)] = block_bytes

    # --- queries --------------------------------------------------------------------

    def usage(self) -> list[Usage]:
        """Blocks (and bytes where known) per publisher and medium, in order of first sight."""
        rows = []
        stranded = self.stranded.counts
        for number, key in enumerate(self._location_names):
            blocks = self._counts[number]
            block_bytes = self._block_bytes.get(key)
            size = None if block_bytes is None else blocks * block_bytes
            rows.append(Usage(key[0], key[1], blocks, size, stranded.get(number, 0)))
        return rows

    def blocks_by_medium(self) -> dict[str, int]:
        """Blocks held per medium, over all publishers (a block on two counts twice)."""
        totals: dict[str, int] = {}
        for row in self.usage():
            totals[row.medium] = totals.get(row.medium, 0) + row.blocks
        return totals

    def bytes_by_medium(self) -> dict[str, int]:
        """Bytes held per medium, over the publishers whose block bytes are known."""
        totals: dict[str, int] = {}
        for row in self.usage():
            if row.bytes is not None:
                totals[row.medium] = totals.get(row.medium, 0) + row.bytes
        return totals

    def get(self, block_hash: Hashable) -> BlockEntry | None:
        """The entry of one block, or None when it is not indexed."""
        return self._snapshot(block_hash) if block_hash in self._blocks else None

    def lookup_prefix(self, block_hashes: Iterable[Hashable]) -> PrefixMatch:
        """Per medium, the leading run of a hash chain held there; and where the chain breaks."""
        alive = self._bits_by_medium()
        runs: dict[str, int] = {}
        blocks = self._blocks
        length = 0
        for block_hash in block_hashes:
            entry = blocks.get(block_hash)
            if entry is None:
                break
            mask = entry[MASK]
            for medium, bits in list(alive.items()):
                if not mask & bits:
                    runs[medium] = length
                    del alive[medium]
            length += 1
        for medium in alive:
            runs[medium] = length
        return PrefixMatch(runs, length)

    def page(
        self,
        medium: str | None = None,
        publisher: str | None = None,
        cursor: int | None = None,
        limit: int = 100,
    ) -> tuple[list[BlockEntry], int | None]:
        """Entries in creation order after ``cursor``, at most ``min(limit, MAX_PAGE_LIMIT)``.

        Filters keep entries held on ``medium`` and/or by ``publisher``. The
        returned cursor is the last entry's sequence number, to pass back for
        the next page, or None when no entry is left.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        limit = min(limit, MAX_PAGE_LIMIT)
        bits = self._bits(medium=medium, publisher=publisher)
        seqs, hashes, blocks = self._listing_seqs, self._listing_hashes, self._blocks
        start = 0 if cursor is None else bisect_right(seqs, cursor)
        found: list[BlockEntry] = []
        for position in range(start, len(seqs) if bits else start):
            block_hash = hashes[position]
            entry = blocks.get(block_hash)
            if entry is not None and entry[SEQ] == seqs[position] and entry[MASK] & bits:
                if len(found) == limit:
                    return found, found[-1].seq
                found.append(self._snapshot(block_hash))
        return found, None

    def _bits(self, medium: str | None = None, publisher: str | None = None) -> int:
        """The bits of every location matching both filters (all locations without filters)."""
        bits = 0
        for number, (owner, held_on) in enumerate(self._location_names):
            if medium in (None, held_on) and publisher in (None, owner):
                bits |= 1 << number
        return bits

    def _bits_by_medium(self) -> dict[str, int]:
        bits: dict[str, int] = {}
        for number, (_owner, medium) in enumerate(self._location_names):
            bits[medium] = bits.get(medium, 0) | 1 << number
        return bits

    def _snapshot(self, block_hash: Hashable) -> BlockEntry:
        mask, seq, first, last, hits, block_size, _parent, _stranded = self._blocks[block_hash]
        held = [key for number, key in enumerate(self._location_names) if mask >> number & 1]
        return BlockEntry(
            block_hash=block_hash,
            media=tuple(sorted({medium for _owner, medium in held})),
            publishers=tuple(sorted({owner for owner, _medium in held})),
            block_size=block_size,
            first_stored=first,
            last_stored=last,
            hits=hits,
            seq=seq,
        )
