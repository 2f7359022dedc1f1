"""When each recently offered block was last offered: the admission gate's memory.

A block stored at its first sight is, on these workloads, mostly a block that
never comes back; one offered again soon is likely to come back again. The
gate therefore needs the time of a block's previous offer and how many offers
it has had, kept for a bounded number of recent blocks so its memory is a
fixed function of the tier's size.
"""

from __future__ import annotations

from collections import OrderedDict

from offload.base import BlockHash

OFFERS_PER_SLOT = 64
"""Blocks remembered per slot of the tier: the bound on the history's length."""
PROVEN_OFFERS = 3
"""Offers (this one included) after which a block is admitted whatever its reuse gap."""


Offer = tuple[int, int]
"""(time of the last offer, offers remembered so far)."""


class OfferHistory:
    """Last offer time and offer count of at most ``limit`` blocks.

    The least recently offered are forgotten first.
    """

    __slots__ = ("_last", "limit")

    def __init__(self, capacity: int) -> None:
        self.limit = OFFERS_PER_SLOT * capacity
        self._last: OrderedDict[BlockHash, Offer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def admit(
        self, block_hashes: list[BlockHash], now: int, free: int, oldest: float | None
    ) -> tuple[list[BlockHash], int]:
        """Offer each block at ``now``; the ones the reuse-horizon rule admits, and how many
        it refused.

        Blocks are admitted while ``free`` slots last, or all when ``oldest`` is None
        (no horizon yet, or none asked); past that, a block earns a slot only by the
        rule, and the first refused one refuses the rest of the chain, which would be
        unreachable behind it. Every block is recorded as offered all the same. The
        tier's gate and each of its models run this once per store, so the offers are
        recorded inline rather than by a call per block.
        """
        last = self._last
        pop = last.pop
        admitted: list[BlockHash] = []
        refused = 0
        for block_hash in block_hashes:
            previous = pop(block_hash, None)
            last[block_hash] = (now, 1) if previous is None else (now, previous[1] + 1)
            if refused:
                refused += 1
            elif free > len(admitted) or oldest is None or earns_a_slot(previous, oldest):
                admitted.append(block_hash)
            else:
                refused = 1
        self.trim()
        return admitted, refused

    def trim(self) -> None:
        """Forget the least recently offered blocks beyond the limit (once per batch)."""
        last = self._last
        for _ in range(len(last) - self.limit):
            last.popitem(last=False)

    def clear(self) -> None:
        self._last.clear()


def earns_a_slot(previous: Offer | None, oldest: float) -> bool:
    """The reuse-horizon rule: offered before at or after ``oldest``, or often enough.

    A block whose previous offer lies within the horizon comes back before
    the tier would evict it; one offered ``PROVEN_OFFERS`` times recurs,
    whatever its gap.
    """
    return previous is not None and (previous[0] >= oldest or previous[1] >= PROVEN_OFFERS - 1)
