"""When each recently offered block was last offered: the admission gate's memory.

A block stored at its first sight is, on these workloads, mostly a block that
never comes back; one offered again soon is likely to come back again. The
gate therefore needs the time of a block's previous offer and how many offers
it has had, kept for a bounded number of recent blocks so its memory is a
fixed function of the tier's size.

The gated tier and its gated models offer every block of every store, so
the form in use is C (``_offer_history.c``, built by ``pip install`` where a
C compiler is): one call per store, the blocks found in a table of their own
with the recency order in C. ``PyOfferHistory`` keeps the same contract where
kvscope was installed without a compiler; tests hold both forms to the same
sequences.
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


class PyOfferHistory:
    """Last offer time and offer count of at most ``limit`` blocks, in Python.

    The least recently offered are forgotten first. A block offered
    ``proven_offers`` times is admitted whatever its gap.
    """

    __slots__ = ("_last", "_proven", "limit")

    def __init__(self, limit: int, proven_offers: int) -> None:
        if limit < 0 or proven_offers < 1:
            raise ValueError(
                f"limit must be >= 0 and proven_offers >= 1, got {limit} and {proven_offers}"
            )
        self.limit = limit
        self._proven = proven_offers
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
        rule (``earns_a_slot``), and the first refused one refuses the rest of the
        chain, which would be unreachable behind it. Every block is recorded as offered
        all the same, and the least recently offered beyond the limit are forgotten.
        """
        last = self._last
        pop = last.pop
        proven = self._proven
        admitted: list[BlockHash] = []
        refused = 0
        for block_hash in block_hashes:
            previous = pop(block_hash, None)
            last[block_hash] = (now, 1) if previous is None else (now, previous[1] + 1)
            if len(last) > self.limit:  # forgotten as the offers come, as in the C form
                last.popitem(last=False)
            if refused:
                refused += 1
            elif free > len(admitted) or oldest is None or earns_a_slot(previous, oldest, proven):
                admitted.append(block_hash)
            else:
                refused = 1
        return admitted, refused

    def invariant_violations(self) -> list[str]:
        """The history within its limit (the C form also checks its recency order)."""
        if len(self._last) <= self.limit:
            return []
        return [f"holds {len(self._last)} blocks, over its limit of {self.limit}"]

    def clear(self) -> None:
        self._last.clear()


try:
    from offload.cpu.policies._offer_history import OfferHistory as BaseOfferHistory
except ImportError:  # installed without a C compiler
    BaseOfferHistory = PyOfferHistory  # type: ignore[misc,assignment]
"""The form in use, sized by ``(limit, proven_offers)``: C where it was built."""


class OfferHistory(BaseOfferHistory):
    """The offers of a tier (or a model) of ``capacity`` slots: at most
    ``OFFERS_PER_SLOT * capacity`` blocks, proven after ``PROVEN_OFFERS`` offers."""

    __slots__ = ()

    def __init__(self, capacity: int) -> None:
        super().__init__(OFFERS_PER_SLOT * capacity, PROVEN_OFFERS)


def earns_a_slot(previous: Offer | None, oldest: float, proven_offers: int = PROVEN_OFFERS) -> bool:
    """The reuse-horizon rule: offered before at or after ``oldest``, or often enough.

    A block whose previous offer lies within the horizon comes back before
    the tier would evict it; one offered ``proven_offers`` times (this one
    included) recurs, whatever its gap.
    """
    return previous is not None and (previous[0] >= oldest or previous[1] >= proven_offers - 1)
