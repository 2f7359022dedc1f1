"""Least recently used: the baseline every other policy is measured against."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from heapq import heapify, heappop, heappush
from itertools import count

from offload.base import BlockHash
from offload.cpu.block_pool import Block
from offload.cpu.policies.cache_policy import CachePolicy
from offload.cpu.policies.metadata_bound import MetadataBound
from offload.cpu.policies.self_check import (
    bound_violations,
    rank_order_violations,
    ranking_violations,
)
from offload.cpu.request_recency import RequestRecency

_POSITION_BITS = 48
"""A rank is ``(order << 48) - position``: one int, compared in C, for (order, -position)."""

_PLACES = 1 << _POSITION_BITS
"""Positions a rank can hold: a larger one, or a negative one, would rank the block among
another request's blocks."""

HEAP_SLACK = 64
"""Outdated heap entries allowed beyond twice the placed blocks before the heap is compacted:
the heap holds at most ``2 * capacity + HEAP_SLACK`` entries."""

_Candidate = tuple[int, int, BlockHash]
"""(rank, tiebreak, hash): blocks compare by rank, then by when they were ranked (0 for a
block ranked by use, a heap entry's push number otherwise), never by hash: blocks share a
rank (a request's chains of two KV cache groups, blocks demoted together), and hashes of
different types (an int and a bytes) do not compare."""


class LRUCachePolicy(CachePolicy):
    """Evicts the idle block with the oldest rank, as vLLM 0.33's LRU does.

    Every use gives a block a new, highest rank. A touch walks a request's
    prefix tail-first, so the chain's head ends up most recent: a prefix loses
    its tail before its head, which keeps the rest of the chain reachable.
    A running request's blocks share the request's rank, tails below heads,
    so a prefix stored in several batches (or out of order) is still evicted
    tail first, and a late store completion never makes a block look newer
    than the request that used it.

    Two structures hold the ranks. A use gives the highest rank yet, so
    blocks ranked by use sit in an OrderedDict in rank order (O(1) per use).
    Blocks ranked by a running request can rank below them, so they sit in a
    heap, ordered lazily (a rank change pushes a new entry; an outdated one
    is skipped when it surfaces). Eviction merges the two in rank order.
    """

    name = "lru"
    metadata_bound = MetadataBound(12 * 1024, 512)
    """A resident block's slot, its rank and its hash per slot, nothing else: the larger of
    the C and Python forms' cost, rounded up (tests/offload/test_policy_memory.py holds it)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.blocks: dict[BlockHash, Block] = {}
        self._used: OrderedDict[BlockHash, int] = OrderedDict()
        self._placed: dict[BlockHash, int] = {}
        self._heap: list[_Candidate] = []
        self._pushes = count(1)
        """Heap entries' tiebreaks: every entry has its own, so no two entries compare equal."""
        self._order = 0
        self._generation = 0

    def insert(
        self,
        block_hashes: Sequence[BlockHash],
        blocks: Sequence[Block],
        request: RequestRecency | None = None,
    ) -> None:
        used = self._used
        if request is None:
            self.blocks.update(zip(block_hashes, blocks, strict=True))
            order = self._order
            for block_hash in block_hashes:
                order += 1
                used[block_hash] = order << _POSITION_BITS
            self._order = order
            return
        # The manager takes the slots back if the request cannot place a block.
        places = _places(request, block_hashes)
        self.blocks.update(zip(block_hashes, blocks, strict=True))
        for block_hash, place in zip(block_hashes, places, strict=True):
            if place is None:
                self._order += 1
                used[block_hash] = self._order << _POSITION_BITS
            else:
                self._place(block_hash, (self._request_order(request) << _POSITION_BITS) - place)
        # The heap's outdated entries go here too: a placed block that leaves by a touch or a
        # failed store's removal is not dropped from the heap, and once no block is placed
        # nothing else compacts it, so stores naming requests would grow it without bound.
        self._compact()

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        used, placed = self._used, self._placed
        order = self._order
        to_end = used.move_to_end
        try:
            for block_hash in reversed(list(block_hashes)):
                if block_hash in used:
                    to_end(block_hash)
                elif block_hash in placed:
                    del placed[block_hash]
                else:
                    continue
                order += 1
                used[block_hash] = order << _POSITION_BITS
        finally:
            # An unhashable hash part way keeps the ranks given before it: the clock must
            # stand past them, or later uses would rank below them.
            self._order = order
        if placed:
            self._compact()

    def finish(
        self,
        block_hashes: Sequence[BlockHash],
        reused: Container[BlockHash],
        request: RequestRecency | None = None,
    ) -> None:
        """Every block the request met counts as used, the head of its prompt newest."""
        self.touch(block_hashes)

    def observe(self, block_hashes: Iterable[BlockHash], request: RequestRecency) -> None:
        block_hashes = list(block_hashes)
        places = _places(request, block_hashes)
        order = self._request_order(request) << _POSITION_BITS
        used, placed = self._used, self._placed
        try:
            for block_hash, place in zip(block_hashes, places, strict=True):
                if place is None or block_hash not in self.blocks:
                    continue
                new = order - place
                old = used.get(block_hash)
                if (placed[block_hash] if old is None else old) >= new:
                    continue
                if old is not None:
                    del used[block_hash]
                self._place(block_hash, new)
        finally:
            # An unhashable hash part way keeps the places given before it: their pushes are
            # compacted all the same, or repeated bad calls would grow the heap without bound.
            self._compact()

    def evict(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        if n <= 0:
            return []
        if not self._placed:
            return self._evict_by_use(n, protected)
        resident = self.blocks
        by_use = self._idle_by_use(protected)
        held: list[_Candidate] = []
        chosen: dict[BlockHash, _Candidate] = {}
        next_used = next(by_use, None)
        next_placed = self._pop_idle_placed(protected, held, chosen)
        while len(chosen) < n and (next_used is not None or next_placed is not None):
            if next_placed is None or (next_used is not None and next_used < next_placed):
                chosen[next_used[2]] = next_used
                next_used = next(by_use, None)
            else:
                chosen[next_placed[2]] = next_placed
                next_placed = self._pop_idle_placed(protected, held, chosen)
        if next_placed is not None:
            held.append(next_placed)
        if len(chosen) < n:
            held.extend(entry for entry in chosen.values() if entry[2] in self._placed)
            chosen = {}
        for entry in held:
            heappush(self._heap, entry)
        if not chosen:
            return None
        used, placed = self._used, self._placed
        for block_hash in chosen:
            if used.pop(block_hash, None) is None:
                del placed[block_hash]
        self._compact()
        return [(block_hash, resident.pop(block_hash)) for block_hash in chosen]

    def remove(self, block_hash: BlockHash) -> Block:
        if self._used.pop(block_hash, None) is None:
            del self._placed[block_hash]
        return self.blocks.pop(block_hash)

    def reset(self) -> None:
        for table in (self.blocks, self._used, self._placed, self._heap):
            table.clear()
        self._order = 0
        self._generation += 1

    def invariant_violations(self) -> list[str]:
        """Each resident block ranked once (``_ranking_tables``), each ordered table in rank
        order; each block a request ranks findable in the heap at its rank (eviction finds it
        nowhere else); the heap within its bound."""
        tables = self._ranking_tables()
        problems = ranking_violations(self.name, self.blocks, tables)
        for table_name, table in tables.items():
            if isinstance(table, OrderedDict):
                problems += rank_order_violations(self.name, table_name, table)
        in_heap = {(block_hash, rank) for rank, _, block_hash in self._heap}
        problems += [
            f"{self.name}: block {block_hash!r:.80} is in _placed but not in _heap at its rank"
            for block_hash, rank in self._placed.items()
            if (block_hash, rank) not in in_heap
        ]
        bound = 2 * self.capacity + HEAP_SLACK
        return problems + bound_violations(
            self.name, "_heap", len(self._heap), bound, "2 * capacity + HEAP_SLACK"
        )

    def _ranking_tables(self) -> dict[str, Mapping[BlockHash, int]]:
        """Every table that ranks resident blocks, by name: eviction looks nowhere else."""
        return {"_used": self._used, "_placed": self._placed}

    def _evict_by_use(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        """Eviction when every block is ranked by use: a scan in rank order.

        ``_idle_by_use``'s scan, written out: the common eviction path, where
        a generator costs about 9% of the manager's whole hot path.
        """
        resident, picked = self.blocks, []
        for block_hash in self._used:
            if resident[block_hash].ref == 0 and block_hash not in protected:
                picked.append(block_hash)
                if len(picked) == n:
                    break
        else:
            return None
        used = self._used
        for block_hash in picked:
            del used[block_hash]
        return [(block_hash, resident.pop(block_hash)) for block_hash in picked]

    def _idle_by_use(self, protected: Container[BlockHash]) -> Iterator[_Candidate]:
        """Idle, unprotected blocks ranked by use, oldest first."""
        resident = self.blocks
        for block_hash, rank in self._used.items():
            if resident[block_hash].ref == 0 and block_hash not in protected:
                yield rank, 0, block_hash

    def _pop_idle_placed(
        self,
        protected: Container[BlockHash],
        held: list[_Candidate],
        chosen: Container[BlockHash],
    ) -> _Candidate | None:
        """The oldest idle, unprotected block ranked by a request, popped from the heap.

        Outdated entries are dropped; current ones that cannot leave now are
        kept in ``held``, to go back on the heap.
        """
        heap, placed, resident = self._heap, self._placed, self.blocks
        while heap:
            entry = heappop(heap)
            block_hash = entry[2]
            if placed.get(block_hash) != entry[0] or block_hash in chosen:
                continue
            if resident[block_hash].ref == 0 and block_hash not in protected:
                return entry
            held.append(entry)
        return None

    def _oldest_rank(self) -> int | None:
        """The oldest rank of a resident block in the LRU's tables (None: none).

        Outdated heap tops are dropped on the way (eviction would drop them
        anyway), so the answer is a live block's rank, not a moved one's.
        """
        heap, placed = self._heap, self._placed
        while heap and placed.get(heap[0][2]) != heap[0][0]:
            heappop(heap)
        by_use = next(iter(self._used.values()), None)
        if not heap:
            return by_use
        return heap[0][0] if by_use is None else min(by_use, heap[0][0])

    def _place(self, block_hash: BlockHash, rank: int) -> None:
        self._placed[block_hash] = rank
        heappush(self._heap, (rank, next(self._pushes), block_hash))

    def _request_order(self, request: RequestRecency) -> int:
        """The request's rank in this policy and generation, given on first need."""
        if request.owner is not self or request.generation != self._generation:
            self._order += 1
            request.owner, request.generation, request.rank = self, self._generation, self._order
        return request.rank

    def _compact(self) -> None:
        """Drop outdated heap entries once they outnumber the live ones."""
        if len(self._heap) > 2 * len(self._placed) + HEAP_SLACK:
            pushes = self._pushes
            self._heap = [(rank, next(pushes), h) for h, rank in self._placed.items()]
            heapify(self._heap)


def _places(request: RequestRecency, block_hashes: Sequence[BlockHash]) -> list[int | None]:
    """Each block's place in the request's prompt, every one asked and checked before any is
    used: a request that cannot place a block (vLLM's key lookup raising, or answering what
    is no position in [0, 2**48)) leaves the policy as it was."""
    places = list(map(request.position, block_hashes))
    for block_hash, place in zip(block_hashes, places, strict=True):
        if place is None:
            continue
        if not isinstance(place, int):
            raise TypeError(f"a block's position must be an int or None, not {place!r:.40}")
        if not 0 <= place < _PLACES:
            raise ValueError(f"block {block_hash!r:.80}'s position {place} is outside [0, 2**48)")
    return places
