"""LRU behind an admission gate that knows how long the tier keeps a block.

Most blocks offered to a KV tier are never loaded: a prompt's tail is new
text that no later request repeats. Storing them evicts blocks that would
have been reused. The gate admits a new block (while the tier is full) when
it was offered before within a horizon of ``HORIZON_RESIDENCIES`` times the
tier's residency age (how old blocks are when the LRU evicts them): a block
whose reuse gap is longer than the tier could hold it would be evicted before
it is used. Small tiers evict young blocks, so their gate is strict; large
tiers hold blocks long, so theirs admits more. Nothing is tuned to a trace:
the horizon follows the residency the workload produces. A block offered
``PROVEN_OFFERS`` times has shown it recurs, and is admitted whatever its gap.

Admission walks a store's blocks in prompt order and stops at the first
refusal: a block is useful only while every block before it is present, so
storing the rest of a chain behind a refused block would fill slots that no
lookup can reach. While there are free slots, blocks are admitted: a free
slot costs nothing to fill.

Eviction is the LRU's (tail of a chain before its head). The clock is the
LRU's own order, which every touched, stored or refused block advances.
Memory beyond the LRU's: the offer history, at most
``OFFERS_PER_SLOT * capacity`` hashes, and one float.
"""

from __future__ import annotations

from collections.abc import Container

from offload.base import BlockHash
from offload.cpu.block_pool import Block
from offload.cpu.policies.lru import _POSITION_BITS, LRUCachePolicy
from offload.cpu.policies.offer_history import OfferHistory
from offload.cpu.policies.residency import ResidencyAge

HORIZON_RESIDENCIES = 2
"""How many residency ages back a previous offer may lie and still earn a slot."""
PROVEN_OFFERS = 3
"""Offers (this one included) after which a block is admitted whatever its reuse gap."""


class GatedLRUCachePolicy(LRUCachePolicy):
    """LRU whose stores pass a reuse-horizon admission gate; see the module docstring."""

    name = "gated"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.offers = OfferHistory(capacity)
        self.residency = ResidencyAge(capacity)

    def admit(self, block_hashes: list[BlockHash], free: int) -> list[BlockHash]:
        now = self._order
        age = self.residency.age
        oldest = None if age is None else now - HORIZON_RESIDENCIES * age
        offer = self.offers.offer
        admitted: list[BlockHash] = []
        refused = 0
        for block_hash in block_hashes:
            previous = offer(block_hash, now)
            if refused:
                refused += 1
            elif (
                free > len(admitted)
                or oldest is None
                or (
                    previous is not None
                    and (previous[0] >= oldest or previous[1] >= PROVEN_OFFERS - 1)
                )
            ):
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
