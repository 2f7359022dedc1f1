"""SLRU behind an admission gate, or admitting everything, as miniature simulations choose.

Most blocks offered to a KV tier are never loaded: a prompt's tail is new
text that no later request repeats. Storing them evicts blocks that would
have been reused. The gate admits a new block (while the tier is full) when
it was offered before within a horizon of some number of residency ages
(how old blocks are when the LRU evicts them): a block whose reuse gap is
longer than the tier could hold it would be evicted before it is used. A
block offered ``PROVEN_OFFERS`` times has shown it recurs, and is admitted
whatever its gap.

Which horizon pays depends on the workload: where sessions come back soon,
refusing first offers loses a turn of hits, and admitting everything is
best; where only the requests that continue a held chain come back soon,
gating the others and admitting theirs is. Either way a protected segment
(SLRU) keeps blocks reused since their store apart, so blocks not reused
churn only the probation segment; its share is the candidate's. So the tier
runs as the candidate (a horizon, or admit everything, each with its
protected share) whose miniature model has
had the most recent hits (``MiniatureDuel``): it follows the best candidate
instead of betting on one.

Admission walks a store's blocks in prompt order and stops at the first
refusal: a block is useful only while every block before it is present, so
storing the rest of a chain behind a refused block would fill slots that no
lookup can reach. While there are free slots, blocks are admitted: a free
slot costs nothing to fill. Nor does the tier refuse anything until it has
turned over one more time than the models wait (``MODEL_TURNOVERS``): the
models refuse first, and the tier follows their verdict, not a guess.

Eviction is the LRU's (tail of a chain before its head, a stored run's too)
over the probation segment, the protected one's oldest only when probation
has no idle block; within the protected segment, a block on a shared prefix
(``SharedPrefixes``) goes back to probation first only once it is
``SHARED_AGE_FACTOR`` times older than the others. The clock is the LRU's own
order, which every touched, stored or refused block advances. Memory beyond
the LRU's: the offer history, at most ``OFFERS_PER_SLOT * capacity`` hashes,
a few numbers, the protected segment and what ``SharedPrefixes`` learnt
(resident blocks only; the segment's are moved out of the LRU's tables), the
last blocks of the latest ``capacity`` stores (``PromptEnds``), the
miniatures, whose size does not grow with the tier (see ``MiniatureDuel``),
and, for a caller that names requests but never touches (vLLM 0.33's
connector), what running requests met since their last store: at most
``MET_REQUESTS`` requests and ``MET_CAPACITIES`` tiers' worth of blocks beyond
one request's own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Mapping, Sequence
from itertools import chain

from offload.base import BlockHash
from offload.cpu.block_pool import Block
from offload.cpu.policies.cache_policy import take_idle
from offload.cpu.policies.lru import _POSITION_BITS, LRUCachePolicy
from offload.cpu.policies.metadata_bound import MetadataBound
from offload.cpu.policies.miniature import MODEL_SLOTS, MODEL_TURNOVERS, MiniatureDuel
from offload.cpu.policies.miniature_model import demote_last
from offload.cpu.policies.offer_history import OfferHistory
from offload.cpu.policies.prompt_ends import PromptEnds
from offload.cpu.policies.residency import ResidencyAge
from offload.cpu.policies.self_check import bound_violations
from offload.cpu.policies.shared_prefix import SharedPrefixes
from offload.cpu.request_recency import RequestRecency

MET_REQUESTS = 4096
"""Running requests whose met blocks wait for their next store, at most (vLLM runs a few
hundred at once); past it, or past ``MET_CAPACITIES`` tiers' worth of blocks, the oldest
request's blocks go to the models early."""
MET_CAPACITIES = 4
"""Tiers' worth of blocks ``_met`` holds, at most (beyond a single request's own), and
requests per slot (a request that met nothing yet waits too)."""
MET_REQUEST_BYTES = 528
"""The most one request waiting in ``_met`` keeps with its first block, once its request is
gone: its ``RequestRecency`` and the rank it holds, its pair and its list, its OrderedDict
node and share of the table (which grows to under six times the most entries it held, 26
bytes a slot, and never shrinks), and the block's hash (97 bytes at the longest)."""
MET_BLOCK_BYTES = 128
"""The most each further block waiting in ``_met`` keeps: its hash and its list slot, which
a list over-allocates."""
MET_CAPPED = MET_REQUESTS // (2 * MODEL_SLOTS)
"""Requests ``_met`` keeps per slot of the models' capped part: ``min(MET_REQUESTS,
MET_CAPACITIES * c)`` is at most ``MET_CAPPED * (min(c, 2 * MODEL_SLOTS - 1) + 1)``, so the
requests' cost fits the bound's one capped part (twice their count below
``2 * MODEL_SLOTS``, where the models' part dwarfs it)."""
SHARED_AGE_FACTOR = 8
"""A protected block on a shared prefix goes back to probation before the other protected
blocks only once it is this many times older than their oldest: it serves every chain that
branches below it, but a prefix that none has used for that long (a document gone out of use)
should not hold its slot for ever."""


class GatedLRUCachePolicy(LRUCachePolicy):
    """SLRU behind a reuse-horizon gate, or admitting everything; see the module docstring."""

    name = "gated"
    metadata_bound = MetadataBound(
        96 * 1024 + MET_CAPPED * MET_REQUEST_BYTES,
        22 * 1024 + MET_CAPACITIES * MET_BLOCK_BYTES,
        60 * 1024 + MET_CAPPED * MET_REQUEST_BYTES,
        2 * MODEL_SLOTS - 1,
    )
    """Mostly offer histories of ``OFFERS_PER_SLOT`` hashes per slot: the tier's, growing
    with it, and each model's, whose slots are the tier's own below ``2 * MODEL_SLOTS`` and
    fewer than that past it (``sampling_rate``): so the models' part stops there. The larger
    of the C and Python forms' cost, rounded up, plus what vLLM's running requests met
    (``_met``), stated from its caps: at most
    ``min(MET_REQUESTS, MET_CAPACITIES * capacity)`` requests (``MET_CAPPED``) and
    ``MET_CAPACITIES`` blocks a slot, each a hash nothing else may keep. A single request's
    blocks past that are its own prompt's, which its request keeps anyway.
    tests/offload/test_policy_memory.py holds it above and below where the models' part
    stops, driven as the shadow tiers are and as vLLM drives a worker's tier with ``_met``
    full."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.offers = OfferHistory(capacity)
        self.residency = ResidencyAge(capacity, MODEL_TURNOVERS + 1)
        self.duel = MiniatureDuel(capacity)
        self._touched: list[BlockHash] | None = None
        """The last touch's request, fed to the models with the store that follows it."""
        self._continues = False
        """That request's head was held when it was touched: its store continues a chain the
        tier holds."""
        self._met: OrderedDict[RequestRecency, tuple[bool, list[BlockHash]]] = OrderedDict()
        """For a caller that never touches but names requests (vLLM 0.33's connector): per
        running request, whether the first block it met was held, and the blocks it met since
        its last store, in the order met (loads, then offers), for the models at its next store
        or its end; least recently met first."""
        self._met_blocks = 0
        """Blocks in ``_met``."""
        self._protected: OrderedDict[BlockHash, int] = OrderedDict()
        """Resident blocks reused since their store -> rank, oldest first; they are
        in none of the LRU's tables (the probation segment)."""
        self._protected_slots = 0
        """The leader's protected share of the capacity, in slots."""
        self._shared: OrderedDict[BlockHash, int] = OrderedDict()
        """Protected blocks on a shared prefix -> rank, oldest first; they outlast the
        rest of the protected segment (``SHARED_AGE_FACTOR``)."""
        self.shared_prefixes = SharedPrefixes()
        self.prompt_ends = PromptEnds(capacity)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        block_hashes = list(block_hashes)
        self._feed_touched()
        self._promote(block_hashes, None)
        # Kept for the models only once the touch went through: _promote looked up every
        # hash, and an unhashable one kept here would fail every later touch and store.
        self._touched = block_hashes
        self._continues = bool(block_hashes) and block_hashes[0] in self.blocks

    def insert(
        self,
        block_hashes: Sequence[BlockHash],
        blocks: Sequence[Block],
        request: RequestRecency | None = None,
    ) -> None:
        """As the LRU, but a stored run loses its tail first, its last block soonest.

        The run is ranked head newest, as a touch ranks a chain: a lookup
        needs the head before anything behind it, so evicting the head first
        would strand the rest of the run where no lookup reaches it. A store
        ends where its prompt ends, in a block the next turn sees under a new
        hash (a partial block, completed later): it is the block least likely
        to be loaded, so it goes to the eviction end, unless a recent store
        ended in it too (``PromptEnds``): then the prompt was sent again, and
        will be again. A store that names its request is ranked by the
        request instead (vLLM's connector, which never stores a partial
        block).
        """
        if request is not None:
            super().insert(block_hashes, blocks, request)
            return
        super().insert(block_hashes[::-1], blocks[::-1])
        if not self.prompt_ends.ended_before(block_hashes[-1]):
            demote_last(self._used, block_hashes[-1])

    def finish(
        self,
        block_hashes: Sequence[BlockHash],
        reused: Container[BlockHash],
        request: RequestRecency | None = None,
    ) -> None:
        """The request's use, for the tier's recency only: its blocks were already seen.

        Only the blocks it found stored were reused: the ones it stored itself
        stay in probation. What it met since its last store goes to the models.
        """
        met = self._take_met(request)
        if met is not None:
            self._follow(met[1], met[0])
        self._promote(block_hashes, reused)

    def observe(self, block_hashes: Iterable[BlockHash], request: RequestRecency) -> None:
        """As the LRU, for probation blocks: a protected block keeps its segment's order.

        The blocks also wait, in the order met, for the models (see ``_met``).
        """
        block_hashes = list(block_hashes)
        protected, shared = self._protected, self._shared
        super().observe(
            [h for h in block_hashes if h not in protected and h not in shared], request
        )
        waiting = self._met
        met = waiting.pop(request, None)
        if met is None:
            met = (bool(block_hashes) and block_hashes[0] in self.blocks, [])
        met[1].extend(block_hashes)
        waiting[request] = met
        self._met_blocks += len(block_hashes)
        limit = MET_CAPACITIES * self.capacity
        most = min(MET_REQUESTS, limit)  # requests that met nothing hold no block, but cost
        while len(waiting) > most or (self._met_blocks > limit and len(waiting) > 1):
            held, oldest = waiting.popitem(last=False)[1]
            self._met_blocks -= len(oldest)
            self._follow(oldest, held)

    def admit(
        self, block_hashes: list[BlockHash], free: int, request: RequestRecency | None = None
    ) -> list[BlockHash]:
        # A request that hit was touched whole, or met its blocks by loads and offers that
        # named it; one that did neither is offered whole.
        met = self._take_met(request)
        if self._touched is not None and block_hashes and block_hashes[0] not in self._touched:
            # The touched request was found whole and stored nothing: this store is another's.
            self._feed_touched()
        if self._touched is not None:
            continues, stream = self._continues, self._touched
            self._touched = None
        elif met is not None:
            continues, stream = met
        else:
            continues, stream = False, block_hashes
        self._follow(stream, continues)
        now = self._order
        oldest = self.duel.leader.oldest_offer(now, self.residency.age, continues)
        admitted, refused = self.offers.admit(block_hashes, now, free, oldest)
        # Refused blocks were seen too: they advance the clock as stored ones do.
        self._order = now + refused
        return block_hashes if not refused else admitted

    def evict(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        evicted = self._evict_probation(n, protected)
        if (
            evicted is None
            and (self._protected or self._shared)
            and self._release_protected(n, protected)
        ):
            evicted = self._evict_probation(n, protected)
        if evicted:
            for block_hash, _ in evicted:
                self.shared_prefixes.forget(block_hash)
        return evicted

    def remove(self, block_hash: BlockHash) -> Block:
        self.shared_prefixes.forget(block_hash)
        if not self._unprotect(block_hash):
            return super().remove(block_hash)
        return self.blocks.pop(block_hash)

    def invariant_violations(self) -> list[str]:
        """The LRU's checks with the protected parts as two more ranking tables, what is
        learnt of shared prefixes about resident blocks only, and every memory beyond the
        resident blocks within its bound (see the module docstring)."""
        name, resident = self.name, self.blocks
        problems = super().invariant_violations()
        prefixes = self.shared_prefixes
        problems += [
            f"{name}: block {block_hash!r:.80} is in _shared but on no shared prefix"
            for block_hash in self._shared
            if block_hash not in prefixes
        ]
        problems += [
            f"{name}: shared_prefixes remembers block {block_hash!r:.80}, which is not resident"
            for block_hash in prefixes.tracked()
            if block_hash not in resident
        ]
        capacity = self.capacity
        problems += bound_violations(
            name, "prompt_ends", len(self.prompt_ends), capacity, "capacity"
        )
        problems += [f"{name}: offers: {problem}" for problem in self.offers.invariant_violations()]
        problems += bound_violations(
            name,
            "_met",
            len(self._met),
            min(MET_REQUESTS, MET_CAPACITIES * capacity),
            "MET_REQUESTS or MET_CAPACITIES a slot",
        )
        waiting = sum(len(met[1]) for met in self._met.values())
        if waiting != self._met_blocks:
            problems.append(f"{name}: _met holds {waiting} blocks but counts {self._met_blocks}")
        if len(self._met) > 1:
            problems += bound_violations(
                name, "_met's blocks", waiting, MET_CAPACITIES * capacity, "MET_CAPACITIES tiers"
            )
        for model in self.duel.models:
            label = model.candidate.label
            problems += [f"{name}: model {label}: {p}" for p in model.invariant_violations()]
            problems += [
                f"{name}: model {label}: offers: {p}" for p in model.offers.invariant_violations()
            ]
        return problems

    def _ranking_tables(self) -> dict[str, Mapping[BlockHash, int]]:
        """The protected parts too: their blocks are in none of the LRU's tables."""
        return {**super()._ranking_tables(), "_protected": self._protected, "_shared": self._shared}

    def _evict_probation(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        """The LRU's eviction over the probation segment, timing the age of what leaves."""
        oldest = self._oldest_rank()
        evicted = super().evict(n, protected)
        if evicted and oldest is not None:
            self.residency.observe(self._order - (oldest >> _POSITION_BITS), len(evicted))
        return evicted

    def reset(self) -> None:
        super().reset()
        self.offers.clear()
        self.residency.clear()
        self.duel.clear()
        self._touched = None
        self._met.clear()
        self._met_blocks = 0
        self._protected.clear()
        self._protected_slots = 0
        self._shared.clear()
        self.shared_prefixes.clear()
        self.prompt_ends.clear()

    def _take_met(self, request: RequestRecency | None) -> tuple[bool, list[BlockHash]] | None:
        """The request's wait in ``_met``, ended (None: it has none)."""
        met = None if request is None else self._met.pop(request, None)
        if met is not None:
            self._met_blocks -= len(met[1])
        return met

    def _feed_touched(self) -> None:
        """A touched request that stored nothing still counts in the models."""
        if self._touched is not None:
            self._follow(self._touched, self._continues)
            self._touched = None

    def _follow(self, request: list[BlockHash], continues: bool) -> None:
        """Feed one request to the models and take the leader's protected share;
        ``continues``: its first block was held here (the models' sample may omit it)."""
        self.duel.run(request, continues)
        self._protected_slots = int(self.duel.leader.protected_share * self.capacity)

    def _promote(self, block_hashes: list[BlockHash], reused: Container[BlockHash] | None) -> None:
        """A use, SLRU's way: reused blocks join the protected segment, newest rank.

        ``reused`` (None: every resident block) are those that count as reused;
        the others only move to probation's newest end. A block still being
        written has not been used yet. The chain is walked tail first, so its
        head ends newest, as in the LRU. Reused blocks on a shared prefix
        (``SharedPrefixes``) join ``_shared`` instead, which outlasts the rest of
        the protected segment (``_demote_overflow``).
        """
        used, placed, protected, resident = self._used, self._placed, self._protected, self.blocks
        shared, prefixes = self._shared, self.shared_prefixes
        hit = 0
        for block_hash in block_hashes:
            if not _counts_as_reused(resident.get(block_hash), block_hash, reused):
                break
            hit += 1
        prefixes.note_hit(block_hashes, hit)
        order = self._order
        try:
            for block_hash in reversed(block_hashes):
                if block_hash in protected:
                    del protected[block_hash]
                    segment = shared if block_hash in prefixes else protected
                elif block_hash in shared:
                    del shared[block_hash]
                    segment = shared
                elif block_hash in used:
                    del used[block_hash]
                    segment = used
                elif block_hash in placed:
                    del placed[block_hash]
                    segment = used
                else:
                    continue
                if segment is used and _counts_as_reused(resident[block_hash], block_hash, reused):
                    segment = shared if block_hash in prefixes else protected
                order += 1
                segment[block_hash] = order << _POSITION_BITS
        finally:
            self._order = order  # as in the LRU's touch: past the ranks given before a bad hash
        self._demote_overflow(order << _POSITION_BITS)
        if placed:
            self._compact()

    def _demote_overflow(self, rank: int) -> None:
        """SLRU's demotion over both protected parts, one block at a time to probation's
        newest end at ``rank``: the oldest of ``_protected`` leaves first unless ``_shared``'s
        oldest is over ``SHARED_AGE_FACTOR`` times older."""
        protected, shared = self._protected, self._shared
        for _ in range(len(protected) + len(shared) - self._protected_slots):
            segment = protected if protected else shared
            if protected and shared:
                age = rank - next(iter(protected.values()))
                if rank - next(iter(shared.values())) > SHARED_AGE_FACTOR * age:
                    segment = shared
            block_hash, _ = segment.popitem(last=False)
            self._used[block_hash] = rank

    def _unprotect(self, block_hash: BlockHash) -> bool:
        """Take the block out of whichever protected part holds it; False: neither does."""
        return (
            self._protected.pop(block_hash, None) is not None
            or self._shared.pop(block_hash, None) is not None
        )

    def _release_protected(self, n: int, protected: Container[BlockHash]) -> bool:
        """Move protected blocks to probation's eviction end so that n idle blocks can leave.

        Probation had too few idle blocks: the protected segment's oldest idle
        ones make up the difference. Nothing moves when even that is not
        enough (the eviction fails, and a failed eviction changes nothing).
        """
        resident = self.blocks
        idle = sum(
            1
            for block_hash in chain(self._used, self._placed)
            if resident[block_hash].ref == 0 and block_hash not in protected
        )
        oldest_first = {
            block_hash: resident[block_hash] for block_hash in chain(self._protected, self._shared)
        }
        released = take_idle(oldest_first, protected, n - idle)
        if len(released) < n - idle:
            return False
        used = self._used
        floor = next(iter(used.values()), self._order << _POSITION_BITS)
        for block_hash, _ in released:
            self._unprotect(block_hash)
            used[block_hash] = floor
            used.move_to_end(block_hash, last=False)
        return True


def _counts_as_reused(
    block: Block | None, block_hash: BlockHash, reused: Container[BlockHash] | None
) -> bool:
    """The block is resident, written, and among ``reused`` (None: every resident block)."""
    return block is not None and block.ref >= 0 and (reused is None or block_hash in reused)
