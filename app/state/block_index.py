"""The sidecar's live block index: which blocks exist, on which publisher and medium, since when.

Fed by the ingest thread from the KV-event streams of every publisher, it answers
"where is this block", "how much of this prompt's prefix is cached, and where"
and paged listings for the API, from memory, at the cost of one dict lookup per
event. How it keys blocks, counts hits and caps its memory: docs/ARCHITECTURE.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from itertools import islice
from typing import Final, TypeVar

import msgspec

from app.decode import DEFAULT_MEDIUM, DecodedBatch, DecodedEvent
from app.settings import MAX_PAGE_LIMIT
from app.state.held_block import HeldBlock, location_numbers
from app.state.listing import Listing
from app.state.locations import LOCATIONS_PER_HOST, MEDIA_PER_PUBLISHER, Locations
from app.state.shards import SHARD_RUN, SHARDS, shard_of
from app.state.stranded import MAX_REHANG_LINKS, Siblings, StrandedBlocks

# Per block, the index keeps one HeldBlock (app/state/held_block.py), changed in
# place, in dicts the cyclic garbage collector never tracks; the listing
# (app/state/listing.py) keeps the creation order in chunks it never walks
# either. So an index of millions of blocks adds nothing to a full collection.
# The dicts are shards (app/state/shards.py), so none is big enough to stall on a rebuild.

RESET_TRACKED: Final = 2048
"""Most blocks a publisher may store after a reset (counted as its batches end) for its next
reset to look at those alone, rather than walk the index: 16 KB per publisher at most. To make
its resets walk a million blocks again, a peer must store this many between two."""
PART_BLOCKS: Final = 65_536
"""Block events a batch applies per hold of the readers' lock (``BlockIndex.apply``): under
0.1 s of removals, the dearest events (a 16 MB frame holds about 2 million). A reset is a
part of its own: a walk of at most every block held. The blocks the stranded count's walks
look at count as block events: one block's removal or store walks every block under it."""
PAGE_SCAN: Final = 16 * MAX_PAGE_LIMIT
"""Listing records one page examines at most (``BlockIndex.page``), matching or not, the dead
included: a filter few blocks match walked the whole listing under the readers' lock, which
ingest needs too, so many such requests stalled ingest. Sixteen full pages' worth, so an
unfiltered page comes short only where most records after its cursor are dead."""
_NO_LOCK: Final = nullcontext()
_DONE: Final = object()
"""What the parts of a batch give when the batch is applied."""
_NO_BLOCK: Final = object()
"""Never a block hash: what a store's loop knows of before it enters a block."""
_Item = TypeVar("_Item")  # what an event's cuts hold: block hashes, or rehangs


class BlockEntry(msgspec.Struct, frozen=True):
    """A snapshot of one indexed block (built on request, never on the hot path).

    ``block_size`` is the one the first store named (None when it named none), or the
    coarser one of the store it hangs under (``BlockIndex._rehang``);
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
    thread, or take a lock that ``apply`` is given (it lets it go between parts).
    """

    def __init__(
        self,
        max_blocks: int,
        max_media: int = 16,
        part_blocks: int = PART_BLOCKS,
        media_per_host: int = MEDIA_PER_PUBLISHER,
        locations_per_host: int = LOCATIONS_PER_HOST,
        page_scan: int = PAGE_SCAN,
    ) -> None:
        """A location is a (publisher, medium, KV cache group): a hybrid model holds a block
        once per group, each copy stored and removed on its own, so a block leaves a
        medium when its last group's copy does, and a medium's count is of copies (the
        blocks its pool spends)."""
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self.locations = Locations(
            max_media, media_per_host, locations_per_host, self._forget_location
        )
        """Which (publisher, medium, group) each bit of a mask stands for, and its counts."""
        if part_blocks < 1:
            raise ValueError(f"part_blocks must be at least 1, got {part_blocks}")
        self.part_blocks = part_blocks
        """Block events applied per hold of the readers' lock (``apply``)."""
        if page_scan < 1:
            raise ValueError(f"page_scan must be at least 1, got {page_scan}")
        self.page_scan = page_scan
        """Listing records one page examines at most (``page``)."""
        self.max_blocks = max_blocks
        self.overflow = 0
        """Stores of blocks refused because the index was full."""
        self.untracked_removals = 0
        """Removals of locations the index did not hold."""
        self._shards: tuple[dict[Hashable, HeldBlock], ...] = tuple({} for _ in range(SHARDS))
        self._held = 0  # blocks in all shards
        self._listing = Listing()
        self._next_seq = 0
        self._block_bytes: dict[str, dict[str, int]] = {}  # publisher -> medium -> bytes
        self.stranded = StrandedBlocks(self._shards)
        """Held blocks no prefix lookup reaches: an ancestor named by the events is held nowhere."""
        self._gained: dict[str, list[Hashable]] = {}
        """Publisher -> every block it stored since its last reset (a superset of the
        locations it gained since), for its next reset to look at those alone. Kept while
        that costs less than a walk of the index (an eighth of the blocks held: a store
        costs about four times a step of the walk), and past the end of a batch only up to
        ``RESET_TRACKED``. A publisher not here (never reset, or past the bound) is reset
        by a walk of the whole index."""
        self._extra_copies: dict[int, dict[Hashable, int]] = {}
        """Location bit number -> block hash -> copies held there beyond the first. vLLM's
        GPU pool does not deduplicate its cache: a prompt sent again whose length is a whole
        number of blocks recomputes its last block (the last token is always recomputed)
        into a second cache block under the same hash, in the same group, and announces each
        copy's store and removal; a block leaves the location with its last copy. Kept apart
        from the records (few blocks are ever copied twice), holding only hashes and ints."""

    def __len__(self) -> int:
        return self._held

    def _record(self, block_hash: Hashable) -> HeldBlock | None:
        """The record of a held block, or None."""
        return self._shards[shard_of(block_hash)].get(block_hash)

    # --- ingest -------------------------------------------------------------------

    def apply(
        self,
        publisher: str,
        batch: DecodedBatch,
        now: float,
        lock: AbstractContextManager[object] = _NO_LOCK,
    ) -> None:
        """Apply one decoded batch of ``publisher``'s events, in order, at time ``now``,
        holding ``lock`` (the readers' lock) for one part of the batch at a time.

        A part is about ``part_blocks`` block events (a longer event is cut: a later cut of a
        store continues its chain under the block before it, a removal's cuts go tail
        first as its blocks do, and each cut's bookkeeping is done before the lock is let
        go), or one reset. A store's moves of held blocks under its coarser parents come in
        parts of their own once all its cuts are in, as the whole event makes them. The
        blocks the stranded count walks count as block events (``StrandedBlocks.walked``).
        A 16 MB frame held the lock for seconds (a store or removal of a million blocks, a
        thousand resets of what was stored since the one before), and one of a few kilobytes
        for minutes (a chain's root removed and stored again, again and again: each a
        walk of the chain under it): every API read and /metrics waited it out. A reader
        between parts sees the index as if the publisher had sent the events (and blocks)
        applied so far alone, a store's moves aside: every count, chain and stranded flag
        agrees with the blocks held (the caller, the index's one writer, changes nothing
        else between parts).
        """
        parts = self._parts(publisher, batch, now)
        while True:
            with lock:
                if next(parts, _DONE) is _DONE:
                    return

    def _parts(self, publisher: str, batch: DecodedBatch, now: float) -> Iterator[None]:
        """Apply ``batch``, pausing after each part (``apply``).

        A reset looks only at what its publisher stored since its last one (``_gained``)
        while that is tracked; a publisher past the bound is reset by a walk of the whole
        index, a part of its own, and one walk after another in a batch takes more than
        an eighth of the index in stores between them (so a walk costs at most about what
        the stores before it did).
        """
        stranded = self.stranded
        pending = 0  # block events applied, and children walked, since the last pause
        walked = stranded.walked
        for event in batch.events:
            if event.kind == "stored":
                cuts = self._store(publisher, event, now)
            elif event.kind == "removed":
                cuts = self._remove(publisher, event)
            else:
                cuts = self._reset(publisher)
            for applied in cuts:
                pending += applied + stranded.walked - walked
                walked = stranded.walked
                if pending >= self.part_blocks:
                    self._listing.settle()
                    yield
                    pending = 0
        gained = self._gained.get(publisher)
        if gained is not None and len(gained) > RESET_TRACKED:
            del self._gained[publisher]
        self._listing.settle()

    def _reset(self, publisher: str) -> Iterator[int]:
        """A reset, weighed as a whole part: it may walk the index."""
        self.reset_publisher(publisher)
        yield self.part_blocks

    def _cuts(self, items: list[_Item], tail_first: bool = False) -> Iterable[list[_Item]]:
        """An event's blocks (or rehangs) in cuts of ``part_blocks``, head first or tail
        first: the list itself when it fits in one (nearly always), which copies nothing."""
        part = self.part_blocks
        if len(items) <= part:
            return (items,) if items else ()
        starts = range(0, len(items), part)
        return (items[start : start + part] for start in (starts[::-1] if tail_first else starts))

    def _store(self, publisher: str, event: DecodedEvent, now: float) -> Iterator[int]:
        """Store ``event``'s blocks a cut at a time, yielding each cut's length once it is in."""
        medium = event.medium or DEFAULT_MEDIUM
        number = self.locations.number(publisher, medium, event.group)
        if number is None:
            return
        bit = 1 << number
        hashes = event.block_hashes
        if event.parent_block_hash is None and self._reports(event, bit):
            for cut in self._cuts(hashes):
                yield self._touch(cut, bit, now)
            return
        block_size = event.block_size
        coarser: list[tuple[HeldBlock, Hashable | None, int]] = []  # (block, parent, shard)
        parent = event.parent_block_hash
        for cut in self._cuts(hashes):
            self._store_run(publisher, medium, number, cut, parent, block_size, now, coarser)
            parent = cut[-1]  # the next cut continues the chain
            yield len(cut)
        # Once the whole chain is in, as for an event applied whole: a block the chain names
        # twice (a loop) is met at each place before it moves, and a cut moving it first
        # left the later place unmet, its stranded count apart from the whole event's.
        for moves in self._cuts(coarser) if coarser else ():
            for entry, above, above_shard in moves:
                self._rehang(entry, above, above_shard, block_size or 0)
            yield len(moves)

    def _store_run(
        self,
        publisher: str,
        medium: str,
        number: int,
        block_hashes: list[Hashable],
        parent: Hashable | None,
        block_size: int | None,
        now: float,
        coarser: list[tuple[HeldBlock, Hashable | None, int]],
    ) -> None:
        """Store one chain of blocks, the first under ``parent``, at location ``number``;
        the held blocks stored at a coarser size go on ``coarser``, with the parent this
        store names, for ``_store`` to rehang once the event's blocks are all in."""
        bit = 1 << number
        locations = self.locations
        lower_tier_bits = locations.lower_tier_bits
        reload_bits = 0 if bit & lower_tier_bits else lower_tier_bits
        # Another group's copy on this medium came with the same reload: one hit, not two.
        copies = locations.pair_bits[publisher][medium]
        shards = self._shards
        listed = self._listing.open.append  # this event's new records go at its end
        # The blocks continue one chain: each hangs under the one before it.
        parent_shard = 0 if parent is None else shard_of(parent)
        seq = first_seq = self._next_seq
        full = seq + self.max_blocks - self._held  # the sequence number the index is full at
        added = refused = 0  # added: copies of blocks held already
        sized = bool(block_size)  # a size that names no granularity (0) moves nothing
        stranded = self.stranded
        kids = stranded.children
        # The last new block, whether it is stranded, and what hangs under it: its child
        # next in the chain takes those without a look-up.
        previous: Hashable = _NO_BLOCK
        previous_stranded = False
        previous_children: Hashable | Siblings | None = None
        for block_hash in block_hashes:
            shard = (hash(block_hash) >> SHARD_RUN) % SHARDS  # shard_of, inlined
            blocks = shards[shard]
            entry = blocks.get(block_hash)
            if entry is None:
                if seq >= full:
                    refused += 1
                    parent, parent_shard = block_hash, shard
                    continue
                # Entered not stranded under its parent (``StrandedBlocks``), inline: a call
                # per block would be most of the store's cost. A parent later in the chain
                # (a loop) is not held yet, so the block is stranded below it.
                if parent is previous:  # the chain's last new block (never this one)
                    child, flag = previous_children, previous_stranded
                elif parent is None or parent == block_hash:
                    child, flag = _NO_BLOCK, False  # hangs under nothing
                else:
                    child = kids[parent_shard].get(parent)
                    above = shards[parent_shard].get(parent)
                    flag = above is None or above.stranded
                if child is None:  # stranded._adopt, inlined
                    kids[parent_shard][parent] = block_hash
                elif type(child) is Siblings:
                    child.members[block_hash] = None
                elif child is not _NO_BLOCK:
                    kids[parent_shard][parent] = Siblings({child: None, block_hash: None})
                entry = HeldBlock(
                    block_hash, shard, bit, seq, now, now, 0, block_size,
                    parent, parent_shard, False,
                )  # fmt: skip
                blocks[block_hash] = entry
                listed(entry)
                seq += 1
                below = kids[shard].get(block_hash)
                if flag:
                    stranded.flag(entry, True)  # what hangs under it was stranded already
                elif below is not None:
                    stranded.walk(entry, False)
                previous, previous_stranded, previous_children = block_hash, flag, below
                parent, parent_shard = block_hash, shard
                continue
            # A hybrid model's coarser group (the first test is all other stores pay).
            if entry.size != block_size and sized and entry.size and entry.size < block_size:
                coarser.append((entry, parent, parent_shard))
            parent, parent_shard = block_hash, shard
            entry.last = now
            if entry.mask & reload_bits and not entry.mask & copies:
                entry.hits += 1
            added += 1
            if not entry.mask & bit:
                entry.mask |= bit
                if entry.stranded:
                    stranded.count(bit, 1)
            else:  # another copy at the same location
                extra = self._copies(number)
                extra[block_hash] = extra.get(block_hash, 0) + 1
        sizes = locations.sizes
        if block_size and block_size > sizes[number]:
            sizes[number] = block_size
        added += seq - first_seq
        counts = locations.counts
        if added and not counts[number]:
            locations.hold(publisher, number)
        if added and (gained := self._gained.get(publisher)) is not None:
            gained += block_hashes
            if len(gained) > max(RESET_TRACKED, self._held >> 3):  # a walk costs less
                del self._gained[publisher]
        self._held += seq - first_seq
        self._next_seq = seq
        counts[number] += added
        self.overflow += refused

    def _remove(self, publisher: str, event: DecodedEvent) -> Iterator[int]:
        """Remove ``event``'s blocks a cut at a time, the tail's cut first, yielding each
        cut's length once it is out."""
        number = self.locations.number(publisher, event.medium or DEFAULT_MEDIUM, event.group)
        if number is None:
            return
        for cut in self._cuts(event.block_hashes, tail_first=True):
            self._remove_run(number, cut)
            yield len(cut)

    def _remove_run(self, number: int, block_hashes: list[Hashable]) -> None:
        """Remove one copy of each block at location ``number``."""
        bit = 1 << number
        shards = self._shards
        stranded = self.stranded
        children = stranded.children
        extra = self._extra_copies.get(number)
        removed = gone = 0
        # Tail first: a chain listed head first then leaves without stranding,
        # one after another, every block below the head (the result is the same).
        for block_hash in reversed(block_hashes):
            shard = (hash(block_hash) >> SHARD_RUN) % SHARDS  # shard_of, inlined
            blocks = shards[shard]
            entry = blocks.get(block_hash)
            if entry is None:
                continue
            mask = entry.mask
            if mask == bit and not (extra and block_hash in extra):
                # Its one copy held, here: it goes (the common case first).
                entry.mask = 0
                del blocks[block_hash]
                removed += 1
                gone += 1
                if entry.stranded or block_hash in children[shard]:
                    stranded.gone(entry, bit)
                    continue
                # StrandedBlocks.gone of a reachable leaf, inlined: it leaves its parent's
                # children, and the parent of one child (a chain's) forgets it in one step.
                parent = entry.parent
                if parent is not None and parent != block_hash:
                    siblings = children[entry.parent_shard]
                    if type(siblings[parent]) is Siblings:
                        stranded.unhang(entry)
                    else:
                        del siblings[parent]
                continue
            if not mask & bit:
                continue
            removed += 1
            if extra and block_hash in extra:  # one of several copies there: it stays
                if extra[block_hash] == 1:
                    del extra[block_hash]
                else:
                    extra[block_hash] -= 1
                continue
            entry.mask = mask ^ bit  # held elsewhere too
            if entry.stranded:
                stranded.count(bit, -1)
        counts = self.locations.counts
        counts[number] -= removed
        if removed and not counts[number]:
            self.locations.emptied(number)
        self._held -= gone
        self._listing.dead += gone
        self.untracked_removals += len(block_hashes) - removed

    def _rehang(
        self, entry: HeldBlock, parent: Hashable | None, parent_shard: int, block_size: int
    ) -> None:
        """A store of a held block at a coarser block size than its parent's: hang it under
        the parent that store names, the coarsest, unless that could close a loop
        (``StrandedBlocks.rehang``).

        A hybrid model's groups of different block sizes cache one hash under different
        parents: vLLM names a coarse block by the hash of its last fine block, so a
        32-token group chains h4 under h2 where a 16-token group chains it under h3.
        The coarse chain skips the fine blocks, and a sliding-window group drops those
        as its window passes while vLLM still hits the whole prefix: under h3 the block
        would count as stranded, though the full-attention group reaches it. So a block
        is stranded only when no group's chain reaches it, whichever group stored first.
        """
        if parent != entry.parent and self.stranded.rehang(
            entry, parent, parent_shard, block_size // entry.size
        ):
            entry.size = block_size

    def _reports(self, event: DecodedEvent, bit: int) -> bool:
        """Whether a store naming no parent re-announces blocks the location holds.

        vLLM announces a request's prefix-cache hits again, as a store from the chain's
        root (``emit_cached_block_events``, for requests with ``kv_cache_report_mode``
        "full"), though no block was copied and none of them will be removed twice. Such a
        store's last block is a hit, so held already; a store of new copies from the root
        ends at a block it computed. The wire cannot tell the two apart when a request whose
        lookup hit nothing computed blocks the location holds (it skipped the lookup, its
        prompt is one block, or a hybrid model's sliding-window group lost its window):
        those copies are missed, and the block goes with the first copy to leave.
        """
        if not event.block_hashes:
            return False
        last = event.block_hashes[-1]
        entry = self._shards[(hash(last) >> SHARD_RUN) % SHARDS].get(last)  # _record, inlined
        return entry is not None and bool(entry.mask & bit)

    def _touch(self, block_hashes: list[Hashable], bit: int, now: float) -> int:
        """A report of prefix-cache hits (``_reports``): the blocks the location holds were
        stored again at ``now``; nothing else changes. Returns how many blocks it named.

        It names every block of the hit, but a sliding-window group hits only the blocks in
        its window (vLLM's null blocks stand for the rest, which the group freed, and may
        have evicted): adding the location to those would count copies the group does not
        hold, for good, as no removal of them follows.
        """
        for block_hash in block_hashes:
            entry = self._record(block_hash)
            if entry is not None and entry.mask & bit:
                entry.last = now
        return len(block_hashes)

    def _copies(self, number: int) -> dict[Hashable, int]:
        """The extra copies held at location ``number`` (created on first use)."""
        copies = self._extra_copies.get(number)
        if copies is None:
            copies = self._extra_copies[number] = {}
        return copies

    def _forget_location(self, number: int) -> None:
        """Location ``number`` was released (``Locations.release_empty``): what the index
        keeps of it goes."""
        self._extra_copies.pop(number, None)
        self.stranded.counts.pop(number, None)

    def set_host(self, publisher: str, host: str | None) -> bool:
        """Count ``publisher``'s locations in ``host``'s share (``Locations.media_per_host``,
        ``Locations.locations_per_host``) from now on, no longer in the share of the host it had:
        ``host`` is the IP address its listen-mode stream's latest frame came from; None
        (a publisher the sidecar connects to, an ipc:// peer's) is held to its own share
        and the index's only.

        A stream's host followed its first frame for good: a peer that sent first under
        an engine's name tied the engine's stream to the peer's share, and an engine that
        came back from a new address stayed in its old host's. Moved, the locations must
        fit the new host's share, as a new location must (its empty ones released first,
        then its new host's publishers'): else a peer of two hosts could fill one's share,
        move it to the other and fill it again. Those that do not fit are forgotten, as at
        a restart (an engine back from a new address restarted its sequence). Whether
        they were: the caller counts it."""
        locations = self.locations
        if not locations.leave_host(publisher, host) or host is None:
            return False
        forgotten = not locations.room_in(publisher, host)
        if forgotten:
            self.reset_publisher(publisher)
            locations.release_empty([publisher])  # of no host's share now
        locations.join_host(publisher, host)
        return forgotten

    def reset_publisher(self, publisher: str) -> None:
        """Forget every location of ``publisher`` (its cache was reset, or it restarted).

        A walk of the whole index unless the publisher is tracked (``_gained``): then
        only the blocks it stored since its last reset are looked at. None at all when
        it holds nothing. Every reset walked the index: a 1 MB frame of cleared events,
        a one-block store before each, held the ingest thread and the index lock for
        half an hour, and each frame of a few bytes restarting a sequence cost a walk.
        """
        gained = self._gained.get(publisher)
        self._gained[publisher] = []
        if not self.locations.holds_any(publisher):
            return
        bits = self.locations.bits(publisher=publisher)
        if gained is not None:
            records = filter(None, map(self._record, gained))
            self._forget_locations(publisher, self._drop(records, bits))
            return  # the listing's sweep drops the dead, a few chunks per batch
        records = (entry for blocks in self._shards for entry in list(blocks.values()))
        self._forget_locations(publisher, self._drop(records, bits))
        self._listing.compact()

    def _drop(self, records: Iterable[HeldBlock], bits: int) -> int:
        """Take ``bits`` off each record's mask (a record may come twice), dropping the blocks
        left held nowhere; returns how many were dropped."""
        shards = self._shards
        stranded = self.stranded
        gone = 0
        for entry in records:
            dropped = entry.mask & bits
            if not dropped:
                continue
            entry.mask ^= dropped
            if not entry.mask:
                del shards[entry.shard][entry.block_hash]
                gone += 1
                stranded.gone(entry, dropped)
            elif entry.stranded:
                stranded.count(dropped, -1)
        return gone

    def _forget_locations(self, publisher: str, gone: int) -> None:
        """After a reset of ``publisher`` that dropped ``gone`` blocks: its locations hold
        nothing, and the listing counts the dead."""
        self._held -= gone
        self._listing.dead += gone
        locations = self.locations
        for number, (owner, _medium, _group) in locations.names.items():
            if owner == publisher:
                locations.counts[number] = 0
                self._extra_copies.pop(number, None)
                locations.emptied(number)

    def set_block_bytes(self, publisher: str, block_bytes: Mapping[str, int]) -> None:
        """Declare the size in bytes of one of ``publisher``'s blocks on each medium named.

        Events carry no byte sizes; stats frames do, and from then on ``usage``
        reports bytes for those locations. Each declaration replaces the
        publisher's last one whole, and keeps its first ``max_media`` media
        (the rest are counted in ``locations.refused_media``): the network
        writes these names, so what they take must not grow frame by frame.
        """
        if any(size < 0 for size in block_bytes.values()):
            raise ValueError(f"block sizes must not be negative, got {block_bytes}")
        kept = dict(islice(block_bytes.items(), self.locations.max_media))
        self.locations.refused_media["max_media"] += len(block_bytes) - len(kept)
        self._block_bytes[publisher] = kept

    # --- queries --------------------------------------------------------------------

    def usage(self) -> list[Usage]:
        """Blocks (and bytes where known) per publisher and medium, in order of first sight
        (a location released while empty is seen anew: ``Locations.number``); a block held by two
        KV cache groups there is two copies, and counts twice."""
        summed: dict[tuple[str, str], tuple[int, int]] = {}
        stranded = self.stranded.counts
        counts = self.locations.counts
        for number, (publisher, medium, _group) in self.locations.names.items():
            pair = (publisher, medium)
            blocks, strays = summed.get(pair, (0, 0))
            summed[pair] = (blocks + counts[number], strays + stranded.get(number, 0))
        rows = []
        for (publisher, medium), (blocks, strays) in summed.items():
            block_bytes = self._block_bytes.get(publisher, {}).get(medium)
            size = None if block_bytes is None else blocks * block_bytes
            rows.append(Usage(publisher, medium, blocks, size, strays))
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
        entry = self._record(block_hash)
        return None if entry is None else self._snapshot(entry)

    def lookup_prefix(self, block_hashes: Sequence[Hashable]) -> PrefixMatch:
        """Per medium, the leading run of a hash chain held there; and where the chain breaks.

        A block of the chain held nowhere, or not on a medium whose run goes on, still counts
        where a coarser block further on covers it (``_cover``): a hybrid model's coarse
        group names a block by the hash of its last fine block, and its sliding-window group
        drops the fine blocks its window has passed, while vLLM hits the whole prefix through
        the coarse chain. Walking the fine chain (a request's hashes) stopped at the first
        block the window dropped.
        """
        alive = self.locations.bits_by_medium()
        by_size: dict[int, int] | None = None  # made at the first cover sought (none: held whole)
        runs: dict[str, int] = {}
        covers: list[tuple[int, int]] = []  # (last position, mask) of the covering blocks
        finest = 0  # the smallest block size held in the chain so far
        length = 0
        for block_hash in block_hashes:
            entry = self._record(block_hash)
            mask = 0
            if entry is not None:
                mask = entry.mask
                if entry.size and (not finest or entry.size < finest):
                    finest = entry.size
            if covers:
                covers = [cover for cover in covers if cover[0] >= length]
                for _last, bits in covers:
                    mask |= bits
            if not mask or not all(mask & bits for bits in alive.values()):
                if by_size is None:
                    by_size = self.locations.bits_by_size()
                cover = self._cover(block_hashes, length, finest, by_size)
                if cover is not None:
                    covers.append(cover)
                    mask |= cover[1]
            if not mask:
                break
            for medium, bits in list(alive.items()):
                if not mask & bits:
                    runs[medium] = length
                    del alive[medium]
            length += 1
        for medium in alive:
            runs[medium] = length
        return PrefixMatch(runs, length)

    def _cover(
        self, chain: Sequence[Hashable], at: int, finest: int, by_size: Mapping[int, int]
    ) -> tuple[int, int] | None:
        """The position and locations of the first held block of ``chain`` after ``at`` that
        covers ``at``, within ``MAX_REHANG_LINKS`` blocks; None when none does.

        Its locations are those of its copies at its own (coarse) size, ``by_size`` giving
        the locations storing at each size: a finer group's copy of the block on another
        medium (the CPU tier's 16-token copy, where only the GPU holds the 32-token one)
        says nothing of the fine blocks before it, which that medium may have dropped.

        A block of ``n`` times the chain's finest block size (the smallest seen in the walk
        or in the blocks searched here) spans its ``n`` positions, the last its own, and it
        covers them when it hangs under the block just before them (its coarsest store's
        parent: ``_rehang``), or under none when they start the chain. So a block the events
        chained otherwise (kvscope's CPU stream names no parent where the tier never met the
        block before a run) covers nothing, and neither does a coarse block with no finer
        block of the chain in view.
        """
        found: list[tuple[int, HeldBlock, int]] = []  # (place, block, its coarse copies)
        for place in range(at + 1, min(len(chain), at + 1 + MAX_REHANG_LINKS)):
            entry = self._record(chain[place])
            if entry is None:
                continue
            if entry.size and (not finest or entry.size < finest):
                finest = entry.size
            coarse = entry.mask & by_size.get(entry.size or 0, 0)
            if coarse and _covers(chain, at, place, entry, finest):  # usually the first held
                return place, coarse
            if coarse:
                found.append((place, entry, coarse))
        for place, entry, coarse in found:  # a finer block came after it
            if _covers(chain, at, place, entry, finest):
                return place, coarse
        return None

    def page(
        self,
        medium: str | None = None,
        publisher: str | None = None,
        cursor: int | None = None,
        limit: int = 100,
    ) -> tuple[list[BlockEntry], int | None]:
        """Entries in creation order after ``cursor``, at most ``min(limit, MAX_PAGE_LIMIT)``,
        found among the next ``page_scan`` records of the listing.

        Filters keep entries held on ``medium`` and/or by ``publisher``. The returned
        cursor is the sequence number to pass back for the next page: the last entry's
        when the page is full and another matching entry follows, the last record
        examined when the scan ran out first (so a page may be short, even empty, and
        still have one), None only when no record is left to examine. Sequence numbers
        only grow, so a cursor neither skips nor repeats an entry while blocks come
        and go between pages.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        limit = min(limit, MAX_PAGE_LIMIT)
        bits = self.locations.bits(medium=medium, publisher=publisher)
        if not bits:
            return [], None
        found: list[BlockEntry] = []
        records = self._listing.after(cursor)
        last = cursor
        for entry in islice(records, self.page_scan):
            if entry.mask & bits:  # zero once the block is gone
                if len(found) == limit:
                    return found, found[-1].seq
                found.append(self._snapshot(entry))
            last = entry.seq
        return found, None if next(records, None) is None else last

    def _snapshot(self, entry: HeldBlock) -> BlockEntry:
        names = self.locations.names
        held = [names[number] for number in location_numbers(entry.mask)]
        return BlockEntry(
            block_hash=entry.block_hash,
            media=tuple(sorted({medium for _owner, medium, _group in held})),
            publishers=tuple(sorted({owner for owner, _medium, _group in held})),
            block_size=entry.size,
            first_stored=entry.first,
            last_stored=entry.last,
            hits=entry.hits,
            seq=entry.seq,
        )


def _covers(chain: Sequence[Hashable], at: int, place: int, entry: HeldBlock, finest: int) -> bool:
    """Whether ``entry``, the held block at ``place`` in ``chain``, covers position ``at``
    (``BlockIndex._cover``), ``finest`` being the chain's finest block size known."""
    if not finest:
        return False
    span, rest = divmod(entry.size or 0, finest)
    before = place - span  # the position of the block it hangs under when it covers them
    above = None if before < 0 else chain[before]
    return not rest and -1 <= before < at and entry.parent == above
