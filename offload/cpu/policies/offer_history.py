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

    def offer(self, block_hash: BlockHash, now: int) -> Offer | None:
        """Record an offer at ``now``; returns the previous state, if remembered."""
        last = self._last
        previous = last.pop(block_hash, None)
        last[block_hash] = (now, 1) if previous is None else (now, previous[1] + 1)
        return previous

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
