"""LRU behind an admission gate whose horizon miniature simulations choose.

Most blocks offered to a KV tier are never loaded: a prompt's tail is new
text that no later request repeats. Storing them evicts blocks that would
have been reused. The gate admits a new block (while the tier is full) when
it was offered before within a horizon of some number of residency ages
(how old blocks are when the LRU evicts them): a block whose reuse gap is
longer than the tier could hold it would be evicted before it is used. A
block offered ``PROVEN_OFFERS`` times has shown it recurs, and is admitted
whatever its gap.

Which horizon pays depends on the workload: where sessions come back soon,
refusing first offers loses a turn of hits, and admitting everything (plain
LRU) is best. So the horizon (or no gate at all) is the one whose miniature
model of the tier has had the most recent hits (``MiniatureDuel``): the tier
follows the best candidate instead of betting on one.

Admission walks a store's blocks in prompt order and stops at the first
refusal: a block is useful only while every block before it is present, so
storing the rest of a chain behind a refused block would fill slots that no
lookup can reach. While there are free slots, blocks are admitted: a free
slot costs nothing to fill.

Eviction is the LRU's (tail of a chain before its head). The clock is the
LRU's own order, which every touched, stored or refused block advances.
Memory beyond the LRU's: the offer history, at most
``OFFERS_PER_SLOT * capacity`` hashes, one float, and the miniatures, whose
size does not grow with the tier (see ``MiniatureDuel``).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence

from offload.base import BlockHash
from offload.cpu.block_pool import Block
from offload.cpu.policies.lru import _POSITION_BITS, LRUCachePolicy
from offload.cpu.policies.miniature import MiniatureDuel, demote_last
from offload.cpu.policies.offer_history import OfferHistory, earns_a_slot
from offload.cpu.policies.residency import ResidencyAge
from offload.cpu.request_recency import RequestRecency


class GatedLRUCachePolicy(LRUCachePolicy):
    """LRU whose stores pass a reuse-horizon admission gate; see the module docstring."""

    name = "gated"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.offers = OfferHistory(capacity)
        self.residency = ResidencyAge(capacity)
        self.duel = MiniatureDuel(capacity)
        self._touched: list[BlockHash] | None = None
        """The last touch's request, fed to the models with the store that follows it."""

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        block_hashes = list(block_hashes)
        self._feed_touched()
        self._touched = block_hashes
        super().touch(block_hashes)

    def insert(
        self,
        block_hashes: Sequence[BlockHash],
        blocks: Sequence[Block],
        request: RequestRecency | None = None,
    ) -> None:
        """As the LRU, but a store's last block goes to the eviction end.

        A store ends where its prompt ends, in a block the next turn sees under
        a new hash (a partial block, completed later): it is the block least
        likely to be loaded. A store that names its request is ranked by the
        request instead (vLLM's connector, which never stores a partial block).
        """
        super().insert(block_hashes, blocks, request)
        if request is None:
            demote_last(self._used, block_hashes[-1])

    def finish(self, block_hashes: Sequence[BlockHash], reused: Container[BlockHash]) -> None:
        """The request's use, for the tier's recency only: its blocks were already seen."""
        super().touch(block_hashes)

    def admit(self, block_hashes: list[BlockHash], free: int) -> list[BlockHash]:
        # A request that hit was touched whole; one that did not is offered whole.
        request, self._touched = self._touched or block_hashes, None
        self.duel.run(request)
        horizon = self.duel.horizon
        now = self._order
        age = self.residency.age
        oldest = None if age is None or horizon is None else now - horizon * age
        offer = self.offers.offer
        admitted: list[BlockHash] = []
        refused = 0
        for block_hash in block_hashes:
            previous = offer(block_hash, now)
            if refused:
                refused += 1
            elif free > len(admitted) or oldest is None or earns_a_slot(previous, oldest):
                admitted.append(block_hash)
            else:
                refused = 1
        self.offers.trim()
        # Refused blocks were seen too: they advance the clock as stored ones do.
        self._order = now + refused
        return block_hashes if not refused else admitted

    def evict(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        oldest = next(iter(self._used.values()), None)
        if oldest is None and self._heap:
            oldest = self._heap[0][0]
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

    def _feed_touched(self) -> None:
        """A touched request that stored nothing still counts in the models."""
        if self._touched is not None:
            self.duel.run(self._touched)
            self._touched = None
