"""The CPU tier's scheduler-side manager: block pool + cache policy + events.

This is the hot path of offloading: vLLM's scheduler calls it for every
request step. Each call therefore does its per-block work in one tight loop
over local names, crosses into the policy once per call, never per block,
and counts what it did in plain integers (ManagerStats) once per call.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from operator import attrgetter

from offload.base import (
    BlockHash,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    positive_count,
)
from offload.cpu.block_pool import Block, BlockPool
from offload.cpu.load_store_spec import CPULoadStoreSpec
from offload.cpu.manager_stats import ManagerStats
from offload.cpu.miss_attribution import HORIZON_CAPACITIES, MissAttribution
from offload.cpu.policies.registry import make_policy
from offload.cpu.request_recency import RequestRecency
from offload.cpu.runs_in_flight import RunsInFlight
from offload.telemetry.spans import SpanGate, record_span

MEDIUM = CPULoadStoreSpec.medium()
_COUNT_TRIES = 5
"""Readings of the counts a live check takes before leaving them unchecked."""
LIVE_CHECK_SLOTS = 8192
"""Slots whose blocks each live invariant check inspects (a bounded cost per check)."""
MAX_BLOCK_SIZE = 2**31 - 1
"""Tokens per block: every event carries it, and every KV-event encoding holds this much."""
MAX_NUM_BLOCKS = 2**32
"""Far beyond any host's memory; a larger count is a units mistake, refused at once
rather than found by a MemoryError after the pool has tried to build its slots."""

_loaded = attrgetter("loaded")
_NOTHING: frozenset[BlockHash] = frozenset()


class CPUOffloadingManager(OffloadingManager):
    """Tracks the CPU tier's blocks; a pluggable policy picks what to evict.

    Block states: a block being written has ref -1 (invisible to lookup, not
    evictable); a ready block has ref 0, or the count of loads reading it
    (not evictable while > 0).
    """

    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
        attribute_misses: bool = True,
    ) -> None:
        """``attribute_misses=False`` leaves ``misses`` at zero and saves its cost on every
        lookup, store and eviction (the baseline bench.insight_overhead measures it against;
        the sidecar's shadow tiers, whose misses nothing reads), and its memory: what it
        would remember is sized for a tier of one block."""
        positive_count("block_size", block_size, MAX_BLOCK_SIZE)
        positive_count("num_blocks", num_blocks, MAX_NUM_BLOCKS)
        self.block_size = block_size
        self.medium = MEDIUM
        self.policy = make_policy(cache_policy, num_blocks)
        self.pool = BlockPool(num_blocks)
        self.stats = ManagerStats()
        self.misses = MissAttribution(num_blocks if attribute_misses else 1, HORIZON_CAPACITIES)
        """Why lookups missed: the reason of each lookup's first missing block."""
        self._attributing = attribute_misses
        self._blocks = self.policy.blocks
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._runs = RunsInFlight()
        """The blocks being written, as runs of their prompts' chains, so each stored event
        names its run's parent however the store completes; kept only with events on."""
        # Odd while a call moves blocks between the policy and the pool, when the
        # counts are short for a moment: a check on another thread (a scrape)
        # reads them only between such moves (a sequence lock, see _count_violations).
        self._moves = 0
        self._spans = SpanGate()

    @property
    def num_blocks(self) -> int:
        return self.pool.capacity

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int:
        _refuse_one_object(block_hashes)
        total = len(block_hashes)  # a generator is refused here, before anything is counted
        get = self._blocks.get
        hits = 0
        for block_hash in block_hashes:
            block = get(block_hash)
            if block is None or block.ref < 0:
                if self._attributing:
                    self.misses.miss(block_hashes, hits, block is not None, self.block_size)
                break
            hits += 1
        stats = self.stats
        stats.lookup_calls += 1
        stats.lookup_blocks += total
        stats.lookup_hit_blocks += hits
        stats.lookup_tokens += total * self.block_size
        stats.lookup_hit_tokens += hits * self.block_size
        return hits

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> CPULoadStoreSpec:
        return self.pin(self.readable(block_hashes))

    def readable(self, block_hashes: Iterable[BlockHash]) -> Sequence[Block]:
        """A load's check: the ready blocks behind the hashes, or a ValueError naming the
        first absent or not ready one; nothing changes. With ``pin``, ``prepare_load`` in two
        steps, for a caller with its own step between them that may fail (vLLM's connector
        has the policy observe the loading request): it then leaves no block pinned."""
        return self._resident(block_hashes, "load")

    def pin(self, blocks: Sequence[Block]) -> CPULoadStoreSpec:
        """A load's start: pin blocks ``readable`` returned (none evicted since) and name
        their slots; ``complete_load`` unpins them."""
        pinned = 0
        for block in blocks:
            if not block.ref:
                pinned += 1
            block.ref += 1
            block.loaded = True
        stats = self.stats
        stats.load_blocks += len(blocks)
        stats.load_pinned_blocks += pinned
        return CPULoadStoreSpec([block.slot for block in blocks])

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Record a use of the blocks (the policy's recency order).

        A bad hash (unhashable) part way raises with the hashes walked before
        it touched: recency alone moves, as a valid touch of those would have
        moved it, and nothing counted or owned changes. Checking every hash
        first would cost the hot path on every call.
        """
        _refuse_one_object(block_hashes)
        self.policy.touch(block_hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash]) -> None:
        hashes = _hash_list(block_hashes)
        blocks = self._resident(hashes, "complete the load of")
        unpinned = 0
        for done, block in enumerate(blocks):
            if block.ref <= 0:
                # Undo this call's unpins: a bad call must not change anything.
                for undone in blocks[:done]:
                    undone.ref += 1
                raise ValueError(
                    f"cannot complete the load of block {hashes[done]!r}: no load in flight"
                )
            if block.ref == 1:
                unpinned += 1
            block.ref -= 1
        stats = self.stats
        stats.load_completed_blocks += len(blocks)
        stats.load_unpinned_blocks += unpinned

    def prepare_store(
        self,
        block_hashes: Iterable[BlockHash],
        request: RequestRecency | None = None,
        offered: Collection[BlockHash] = (),
        *,
        parent: BlockHash | None = None,
        restarts: Mapping[int, BlockHash | None] | None = None,
    ) -> PrepareStoreOutput | None:
        """Reserve slots for the blocks not yet resident, evicting idle ones if needed.

        The policy first admits the new blocks worth a slot (``CachePolicy.admit``);
        the others are not stored and counted as not admitted. ``request``
        (optional) is the storing request, for policies that order a request's
        blocks by their place in its prompt. ``offered`` names
        more blocks to keep from eviction: the ones a caller filtered out of
        ``block_hashes`` (vLLM protects a whole offer). ``block_hashes`` continue
        one prompt's chain from ``parent`` (None: its start, or not known), so
        the stored events can name each run's parent. ``restarts`` maps the
        positions in ``block_hashes`` where another chain begins (vLLM offers
        each KV cache group's chain after the other's) to that chain's parent:
        no run crosses one.
        """
        start = time.perf_counter()
        requested = _hash_list(block_hashes)
        if request is not None and not isinstance(request, RequestRecency):
            kind = type(request).__name__
            raise TypeError(f"request must be a RequestRecency or None, not {kind}")
        if restarts:
            _check_restarts(restarts, len(requested))
        hash(parent)  # an unhashable parent is refused before anything changes
        _refuse_one_object(offered, "offered")
        also_protected = frozenset(offered) if offered else _NOTHING  # unhashable: refused now
        resident = self._blocks
        # dict.fromkeys dedupes while keeping order: a hash named twice is stored once.
        # (An unhashable hash raises here, before anything is counted or changed.)
        to_store = list(dict.fromkeys([h for h in requested if h not in resident]))
        held = len(requested) - len(to_store)
        offered_new = len(to_store)
        evicted_hashes: list[BlockHash] = []
        refused: Sequence[BlockHash] = ()
        blocks: list[Block] | None = []
        try:
            if to_store:
                pool = self.pool
                admitted = self.policy.admit(to_store, pool.num_free, request)
                if admitted is not to_store:
                    # Refused before any room is made: a block not worth a slot evicts nothing.
                    if self._attributing:
                        kept = set(admitted)
                        refused = [h for h in to_store if h not in kept]
                    to_store = admitted
                if to_store:
                    protected = also_protected.union(requested)
                    blocks = self._allocate(to_store, protected, request, evicted_hashes)
        except BaseException:
            # The store did not happen: nothing is counted for it. Only what left the tier
            # for room before the failure is remembered (its removed event is queued).
            if evicted_hashes and self._attributing:
                self.misses.stored((), 0, (), evicted_hashes)
            raise
        stats = self.stats
        stats.store_requested_blocks += len(requested)
        stats.store_skipped_blocks += held
        stats.store_not_admitted_blocks += offered_new - len(to_store)
        if self._attributing:
            # The store's start and what it found held split the last miss; what it
            # refused, evicted and had no room for is remembered.
            no_room = to_store if blocks is None else ()
            self.misses.stored(requested, held, refused, evicted_hashes, no_room)
        if blocks is None:
            stats.store_refused_calls += 1
            stats.store_refused_blocks += len(to_store)
            return None
        if not to_store:
            return PrepareStoreOutput([], CPULoadStoreSpec([]), [])
        stats.store_admitted_blocks += len(to_store)
        if self._events is not None:
            if not restarts and to_store[-1] == requested[len(to_store) - 1]:
                # One run from the chain's start, the common case: to_store is a
                # subsequence of requested ending where a prefix of it would.
                self._runs.add(to_store, parent)
            else:
                self._runs.mark(requested, to_store, parent, restarts or {})
        seconds = time.perf_counter() - start
        stats.prepare_store_seconds.observe(seconds)
        if evicted_hashes and self._spans.active():
            record_span(
                "kvscope.manager.prepare_store",
                seconds,
                {
                    "kvscope.policy": self.policy.name,
                    "kvscope.blocks.requested": len(requested),
                    "kvscope.blocks.admitted": len(to_store),
                    "kvscope.blocks.evicted": len(evicted_hashes),
                },
            )
        return PrepareStoreOutput(
            to_store, CPULoadStoreSpec([block.slot for block in blocks]), evicted_hashes
        )

    def _allocate(
        self,
        to_store: list[BlockHash],
        protected: Container[BlockHash],
        request: RequestRecency | None,
        evicted_hashes: list[BlockHash],
    ) -> list[Block] | None:
        """Slots for ``to_store``, made by evicting idle blocks not in ``protected``, and the
        blocks into the policy; None, with nothing changed, when room cannot be made.

        Evictions are counted and announced here, as they happen, and their hashes go into
        ``evicted_hashes``: a store that fails after making room has still lost those blocks,
        and its caller must know which.
        """
        pool = self.pool
        shortfall = len(to_store) - pool.num_free
        self._moves += 1
        try:
            if shortfall > 0:
                evicted = self.policy.evict(shortfall, protected)
                if evicted is None:
                    return None
                hashes, freed = zip(*evicted, strict=True)
                evicted_hashes.extend(hashes)
                stats = self.stats
                stats.evicted_capacity_blocks += shortfall
                stats.dead_write_blocks += shortfall - sum(map(_loaded, freed))
                pool.free(freed)
                if self._events is not None:
                    event = OffloadingEvent(list(hashes), self.block_size, MEDIUM, True)
                    self._events.append(event)
            blocks = pool.allocate(len(to_store))
            try:
                self.policy.insert(to_store, blocks, request)
            except BaseException:
                # The slots of the blocks the policy did not take come back; one it took
                # stays its own (a slot is never owned twice).
                taken = self._blocks
                pairs = zip(to_store, blocks, strict=True)
                pool.free([block for h, block in pairs if taken.get(h) is not block])
                raise
        finally:
            self._moves += 1
        return blocks

    def complete_store(
        self, block_hashes: Iterable[BlockHash], success: bool = True
    ) -> list[BlockHash]:
        """Make written blocks readable, or forget them when the copy failed.

        Returns the hashes whose state changed: stored, or forgotten.
        """
        _refuse_one_object(block_hashes)
        if success is not True and success is not False:
            raise TypeError(f"success must be True or False, not {type(success).__name__}")
        get = self._blocks.get
        if success:
            stored: list[BlockHash] = []
            try:
                for block_hash in block_hashes:
                    block = get(block_hash)
                    if block is not None and block.ref < 0:
                        block.ref = 0
                        stored.append(block_hash)
            except BaseException:
                # A bad hash (unhashable, say) part way: undo this call's changes.
                for block_hash in stored:
                    self._blocks[block_hash].ref = -1
                raise
            self.stats.store_completed_blocks += len(stored)
            events = self._events
            if stored and events is not None:
                for run, parent in self._runs.complete(stored):  # one run, as a rule
                    events.append(OffloadingEvent(run, self.block_size, MEDIUM, False, parent))
            return stored
        # A failed copy leaves garbage in the slots: forget the blocks that were
        # being written. Their stored event was never sent, so nothing is removed
        # from a consumer's view either. Rare, so the blocks are looked up first,
        # before anything changes (a dict: a hash named twice is forgotten once).
        hashes = _hash_list(block_hashes)
        blocks = dict(zip(hashes, map(get, hashes), strict=True))
        forgotten = [h for h, block in blocks.items() if block is not None and block.ref < 0]
        freed: list[Block] = []
        try:
            self._remove(forgotten, freed)
        finally:  # what left the tier is counted, even when the policy failed part way
            self.stats.evicted_failed_store_blocks += len(freed)
            if self._events is not None:  # what is left of their runs hangs under them
                self._runs.take(forgotten[: len(freed)])
        return forgotten

    def clear(self) -> list[BlockHash]:
        """Drop every idle block (a prefix-cache reset); returns the dropped hashes.

        Blocks being read or written stay: their transfers still own the
        slots, and their completion calls must find them.
        """
        idle = [h for h, block in self._blocks.items() if block.ref == 0]
        freed: list[Block] = []
        try:
            self._remove(idle, freed)
        finally:  # what left the tier is counted and announced, even when the policy failed
            gone = idle[: len(freed)]
            self.stats.evicted_clear_blocks += len(freed)
            self.stats.dead_write_blocks += len(freed) - sum(map(_loaded, freed))
            if gone and self._events is not None:
                self._events.append(OffloadingEvent(gone, self.block_size, MEDIUM, removed=True))
        return idle

    def reset(self) -> None:
        """Forget every block, in flight or not, and all policy history.

        vLLM's prefix-cache reset: its scheduler drops the completions of
        every job in flight, so nothing will ask for these blocks again. A
        consumer mirroring the tier is told that the ready blocks left.
        """
        ready = [h for h, block in self._blocks.items() if block.ref >= 0]
        loaded = sum(1 for h in ready if self._blocks[h].loaded)
        self._moves += 1
        try:
            self.policy.reset()  # first: a policy failing here leaves the counts as they were
            self.pool.reset()
        finally:
            self._moves += 1
        self._runs.clear()
        self.misses.reset()
        stats = self.stats
        stats.load_dropped_blocks += stats.loads_in_flight
        stats.load_unpinned_blocks += stats.blocks_pinned_by_loads
        stats.store_dropped_blocks += stats.stores_in_flight
        stats.evicted_clear_blocks += len(ready)
        stats.dead_write_blocks += len(ready) - loaded
        if ready and self._events is not None:
            self._events.append(OffloadingEvent(ready, self.block_size, MEDIUM, removed=True))

    def _remove(self, block_hashes: list[BlockHash], freed: list[Block]) -> None:
        """Take the blocks from the policy, in order, into ``freed``, and give their slots
        back: a policy failing part way leaves no slot owned by a block it no longer holds,
        and ``freed`` says how far it got."""
        self._moves += 1
        try:
            for block_hash in block_hashes:
                freed.append(self.policy.remove(block_hash))
        finally:
            self.pool.free(freed)
            self._moves += 1

    @property
    def events_enabled(self) -> bool:
        return self._events is not None

    def take_events(self) -> list[OffloadingEvent]:
        if self._events is None:
            return []
        events, self._events = self._events, []
        return events

    def invariant_violations(self) -> list[str]:
        """Every broken bookkeeping invariant, checked in full, the policy's own included.

        O(blocks), and it walks the policy's tables, so it runs on the manager's
        own thread (tests, debugging); scrapes use ``live_invariant_violations``.
        """
        problems = self._count_violations() + self.pool.check_slots(0, self.pool.capacity)
        if not self.pool.holders_are_distinct(self._blocks.values()):
            problems.append("a block is held twice")
        return problems + self.policy.invariant_violations()

    def live_invariant_violations(self, slots: int = LIVE_CHECK_SLOTS) -> list[str]:
        """The bounded check behind the live gauge, cheap enough for every scrape.

        The counts (used + free = capacity) every call, and the per-block
        checks of the next ``slots`` slots, so a tier of any size is covered
        every ceil(capacity / slots) calls at a bounded cost per call, where
        the full check grows with the tier. A block held twice while another
        is lost keeps the counts right, so only the full check finds that pair; any single slip
        in ownership breaks the counts.
        """
        return self._count_violations() + self.pool.check_next_slots(slots)

    def _count_violations(self) -> list[str]:
        """used + free = capacity, read between two moves (``_moves``'s reader side).

        A reading taken during a move, or across one, is retried after giving
        the moving thread the interpreter; if the manager never stands still
        for a few tries, the counts go unchecked this time rather than raise a
        false alarm.
        """
        capacity = self.pool.capacity
        for _ in range(_COUNT_TRIES):
            moves = self._moves
            used, free = len(self._blocks), self.pool.num_free
            if moves % 2 == 0 and moves == self._moves:
                if used + free != capacity:
                    return [f"used {used} + free {free} != capacity {capacity}"]
                return []
            time.sleep(0)
        return []

    def _resident(self, block_hashes: Iterable[BlockHash], action: str) -> Sequence[Block]:
        """The ready blocks behind the hashes, or a ValueError naming the first bad one."""
        _refuse_one_object(block_hashes)
        get = self._blocks.get
        blocks: list[Block] = []
        for block_hash in block_hashes:
            block = get(block_hash)
            if block is None:
                raise ValueError(f"cannot {action} block {block_hash!r}: not in the CPU tier")
            if block.ref < 0:
                raise ValueError(f"cannot {action} block {block_hash!r}: its store is not complete")
            blocks.append(block)
        return blocks


def _refuse_one_object(block_hashes: Iterable[BlockHash], name: str = "block_hashes") -> None:
    """A TypeError for a str or bytes-like object passed as the hashes.

    Iterating one yields characters or small ints, each a valid-looking hash:
    ``prepare_store(b"abc")`` would store the blocks 97, 98 and 99.
    """
    if isinstance(block_hashes, str | bytes | bytearray | memoryview):
        raise TypeError(
            f"{name} must be a collection of hashes, not one {type(block_hashes).__name__}"
        )


def _check_restarts(restarts: Mapping[int, BlockHash | None], length: int) -> None:
    """A TypeError or ValueError naming the first position of ``restarts`` that is not a place
    in the offer, or whose parent is not a hash."""
    if not isinstance(restarts, Mapping):
        raise TypeError(f"restarts must map positions to parents, not {type(restarts).__name__}")
    for position, chain_parent in restarts.items():
        if type(position) is not int or not 0 <= position < length:
            raise ValueError(f"restarts names position {position!r:.40}, not one of the offer's")
        try:
            hash(chain_parent)
        except TypeError as error:
            raise TypeError(f"restarts[{position}] is not a hash: {error}") from error


def _hash_list(block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
    """The hashes as a list; a list is used as it is (the hot path's case)."""
    if type(block_hashes) is list:
        return block_hashes
    _refuse_one_object(block_hashes)
    return list(block_hashes)
