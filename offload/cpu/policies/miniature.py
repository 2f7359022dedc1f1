"""Miniature simulations: which admission horizon the workload rewards right now.

No single gate suits every workload: where a conversation returns long
after its tier would have evicted its new blocks, refusing first offers
keeps reusable blocks resident; where sessions return quickly, a refused
block is a lost hit. The tier therefore runs small models of itself, one per
candidate horizon (admit everything, or the reuse gate at a few horizons),
on a hash-sampled share of the blocks at the same share of the capacity
(Waldspurger et al., "Cache Modeling and Optimization using Miniature
Simulations", ATC'17), and follows the one with the most recent hits (the
set-dueling idea of Qureshi et al.'s DIP, ISCA'07).

A prefix cache hits a block only when every block before it is stored, so a
model counts the leading run of a request's sampled blocks it holds, not
each block on its own. Sampling by hash keeps a block in or out of the
sample for good, so every model sees the same blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from offload.base import BlockHash
from offload.cpu.policies.offer_history import OfferHistory, earns_a_slot
from offload.cpu.policies.residency import ResidencyAge

HORIZONS: tuple[int | None, ...] = (2, None, 1)
"""Candidate horizons in residency ages; None admits every block. The first
one leads until a model has hits: it is the gate's reasoned default (a block
back within two residencies would likely still be resident)."""
MODEL_SLOTS = 256
"""Sampled slots a model keeps at least (when the tier has that many): enough
for its hit count to rank horizons, few enough that its cost stays small."""
WINDOW_CAPACITIES = 4
"""Hits count over about this many model capacities of sampled references:
a few turnovers of the tier, so one burst does not flip the choice, yet a
change of workload does within a few turnovers."""
_MIX = 0x9E3779B97F4A7C15
"""Fibonacci hashing's multiplier: spreads consecutive ids over the sample."""


def sampling_rate(capacity: int) -> int:
    """One in how many hashes the models see: a power of two leaving them >= MODEL_SLOTS slots."""
    rate = 1
    while capacity // (rate * 2) >= MODEL_SLOTS:
        rate *= 2
    return rate


class Miniature:
    """A hash-only model of the LRU tier behind a gate of one horizon.

    Memory: at most ``slots`` resident hashes and ``OFFERS_PER_SLOT * slots``
    remembered offers.
    """

    __slots__ = ("clock", "hits", "horizon", "offers", "residency", "resident", "slots")

    def __init__(self, slots: int, horizon: int | None) -> None:
        self.slots = max(1, slots)
        self.horizon = horizon
        self.resident: OrderedDict[BlockHash, int] = OrderedDict()
        self.offers = OfferHistory(self.slots)
        self.residency = ResidencyAge(self.slots)
        self.clock = 0
        self.hits = 0.0

    def run(self, request: Sequence[BlockHash], decay: float) -> None:
        """One request's sampled blocks, head first: its lookup, touch and store."""
        resident = self.resident
        hit = 0
        for block_hash in request:
            if block_hash not in resident:
                break
            hit += 1
        self.hits = self.hits * decay + hit
        clock = self.clock
        for block_hash in reversed(request):
            if block_hash in resident:
                resident.move_to_end(block_hash)
                clock += 1
                resident[block_hash] = clock
        offered = list(dict.fromkeys([h for h in request[hit:] if h not in resident]))
        new = self._admit(offered, clock)
        clock += len(offered)  # refused blocks were seen too, as in the tier
        if len(new) > self.slots:
            new = []  # the tier cannot make that much room: it refuses the store
        for _ in range(len(resident) + len(new) - self.slots):
            _, last_use = resident.popitem(last=False)
            self.residency.observe(clock - last_use, 1)
        for block_hash in new:
            resident[block_hash] = clock
        if new:
            demote_last(resident, new[-1])
        self.clock = clock

    def _admit(self, new: list[BlockHash], now: int) -> list[BlockHash]:
        """The tier's admission rule at this model's horizon (see GatedLRUCachePolicy)."""
        if self.horizon is None:
            return new
        offer = self.offers.offer
        free = self.slots - len(self.resident)
        age = self.residency.age
        oldest = None if age is None else now - self.horizon * age
        admitted: list[BlockHash] = []
        refused = False
        for block_hash in new:
            previous = offer(block_hash, now)
            if refused:
                continue
            if free > len(admitted) or oldest is None or earns_a_slot(previous, oldest):
                admitted.append(block_hash)
            else:
                refused = True  # the rest of the chain is unreachable behind it
        self.offers.trim()
        return admitted

    def clear(self) -> None:
        self.resident.clear()
        self.offers.clear()
        self.residency.clear()
        self.clock = 0
        self.hits = 0.0


class MiniatureDuel:
    """The candidate horizons' models, and the one currently ahead.

    Memory: ``len(HORIZONS)`` models of at most ``2 * MODEL_SLOTS`` slots
    each, whatever the tier's capacity.
    """

    __slots__ = ("_decay_per_block", "_mask", "horizon", "models")

    def __init__(self, capacity: int) -> None:
        rate = sampling_rate(capacity)
        self._mask = rate - 1
        slots = max(1, capacity // rate)
        self.models = [Miniature(slots, horizon) for horizon in HORIZONS]
        self._decay_per_block = 1.0 / (WINDOW_CAPACITIES * slots)
        self.horizon: int | None = HORIZONS[0]

    def run(self, request: Sequence[BlockHash]) -> None:
        """Feed one request (head first) to every model and follow the leader."""
        mask = self._mask
        if mask:
            request = [h for h in request if (hash(h) * _MIX >> 32) & mask == 0]
            if not request:
                return
        decay = max(0.0, 1.0 - len(request) * self._decay_per_block)
        for model in self.models:
            model.run(request, decay)
        leader = max(self.models, key=_hits)  # the first of equals: HORIZONS' order
        self.horizon = leader.horizon

    def clear(self) -> None:
        for model in self.models:
            model.clear()
        self.horizon = HORIZONS[0]


def demote_last(order: OrderedDict[BlockHash, int], block_hash: BlockHash) -> None:
    """Move a just-stored block to the eviction end, ranked as the oldest block there.

    Its rank becomes the oldest's, so the age of evicted blocks (the gate's
    residency) is not stretched by it.
    """
    oldest = next(iter(order.values()))
    order.move_to_end(block_hash, last=False)
    order[block_hash] = oldest


def _hits(model: Miniature) -> float:
    return model.hits
