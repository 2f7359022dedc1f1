"""One miniature model of the tier: a hash-only SLRU behind a reuse gate, in two forms.

``miniature.py`` says why the tier runs such models and how it follows them;
this is the model itself. Every request runs through each of the duel's
models, so the form in use is C (``_miniature.c``, built by ``pip install``
where a C compiler is), with the sample's hash test beside it; the Python
forms here keep the same contract where kvscope was installed without a
compiler, and tests hold both forms to the same requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from math import inf

from offload.base import BlockHash
from offload.cpu.policies.offer_history import OfferHistory
from offload.cpu.policies.residency import ResidencyAge

_MIX = 0x9E3779B97F4A7C15
"""Fibonacci hashing's multiplier: spreads consecutive ids over the sample."""


def oldest_offer(
    horizon: float | None, admit_continuations: bool, now: int, age: float | None, continues: bool
) -> float | None:
    """A gate's earliest previous offer that earns a block a slot (``Candidate.oldest_offer``)."""
    if horizon is None or age is None or (continues and admit_continuations):
        return None
    if horizon == inf:
        return -inf
    return now - horizon * age


class PyMiniature:
    """A hash-only model of the tier, in Python: ``slots`` blocks, SLRU with
    ``protected_slots`` protected, behind a reuse gate of ``horizon`` residency ages (None:
    no gate) that lets a continuing request's blocks through if ``admit_continuations``.

    Memory: at most ``slots`` resident hashes (probation and protected
    together) and what ``offers`` (its offer history) remembers.
    """

    __slots__ = (
        "admit_continuations",
        "clock",
        "hits",
        "horizon",
        "offers",
        "probation",
        "protected",
        "protected_slots",
        "residency",
        "slots",
    )

    def __init__(
        self,
        slots: int,
        horizon: float | None,
        protected_slots: int,
        admit_continuations: bool,
        offers: OfferHistory,
        turnovers: int,
    ) -> None:
        if slots < 1 or not 0 <= protected_slots <= slots or turnovers < 0:
            raise ValueError(
                "slots must be >= 1, protected_slots in [0, slots] and turnovers >= 0, "
                f"got {slots}, {protected_slots} and {turnovers}"
            )
        if horizon is not None and not horizon > 0:
            raise ValueError(f"horizon must be None or > 0, got {horizon!r}")
        self.slots = slots
        self.horizon = horizon
        self.protected_slots = protected_slots
        self.admit_continuations = admit_continuations
        self.probation: OrderedDict[BlockHash, int] = OrderedDict()
        """Blocks not reused since their store, oldest first: evicted first."""
        self.protected: OrderedDict[BlockHash, int] = OrderedDict()
        """Blocks reused since their store, oldest first (empty in plain LRU)."""
        self.offers = offers
        self.residency = ResidencyAge(slots, turnovers)
        self.clock = 0
        self.hits = 0.0

    @property
    def age(self) -> float | None:
        """The residency age; None until the model turned over."""
        return self.residency.age

    def __len__(self) -> int:
        return len(self.probation) + len(self.protected)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.probation or block_hash in self.protected

    def run(
        self, request: Sequence[BlockHash], decay: float, continues: bool, ends: bool = True
    ) -> None:
        """One request's sampled blocks, head first: its lookup, touch and store.

        ``continues`` is the tier's verdict (the request's first block was held), not the
        model's: a sample may leave out a request's head, and a shared system prompt left
        out would make every request look cold to the model while the tier sees each one
        continue, so the model would rank a candidate the tier does not run.

        ``ends``: the sample holds the request's last block. Only then is the last block
        the model stores the one the tier ranks oldest (``demote_last``); otherwise it
        stands in the middle of the tier's stored run, which the tier keeps as long as the
        rest, and demoting it would cost the model one of the few blocks it samples of
        every stored request, a loss the tier does not have.
        """
        for block_hash in request:  # every hash first, as the C form: a bad one changes nothing
            hash(block_hash)
        probation, protected = self.probation, self.protected
        hit = 0
        for block_hash in request:
            if block_hash not in probation and block_hash not in protected:
                break
            hit += 1
        self.hits = self.hits * decay + hit
        clock = self.clock
        segment = protected if self.protected_slots else probation
        absent = []  # the blocks not held, tail first: all behind the hits
        for block_hash in reversed(request):
            if block_hash in protected:
                protected.move_to_end(block_hash)
            elif block_hash in probation:
                del probation[block_hash]
            else:
                absent.append(block_hash)
                continue
            clock += 1
            segment[block_hash] = clock
        if len(protected) > self.protected_slots:  # a call only when there is work
            demote_overflow(protected, probation, self.protected_slots, clock)
        offered = list(dict.fromkeys(reversed(absent)))
        new = self._admit(offered, clock, continues)
        clock += len(offered)  # refused blocks were seen too, as in the tier
        if len(new) > self.slots:
            new = []  # the tier cannot make that much room: it refuses the store
        excess = len(probation) + len(protected) + len(new) - self.slots
        if excess > 0:
            # As the tier times an eviction: the oldest block's age, weighed by the count.
            oldest = next(iter((probation or protected).values()))
            from_probation = min(excess, len(probation))
            for _ in range(from_probation):
                probation.popitem(False)
            for _ in range(excess - from_probation):
                protected.popitem(False)
            self.residency.observe(clock - oldest, excess)
        for block_hash in reversed(new):  # head newest, as the tier ranks a stored run
            probation[block_hash] = clock
        if new and ends:
            demote_last(probation, new[-1])
        self.clock = clock

    def _admit(self, new: list[BlockHash], now: int, continues: bool) -> list[BlockHash]:
        """The tier's admission rule at this model's horizon (see GatedLRUCachePolicy);
        ``continues``: the request's head was held, so its store continues a held chain."""
        if self.horizon is None:
            return new
        oldest = oldest_offer(
            self.horizon, self.admit_continuations, now, self.residency.age, continues
        )
        return self.offers.admit(new, now, self.slots - len(self), oldest)[0]

    def invariant_violations(self) -> list[str]:
        """Each block in one segment, the model within its slots and the protected segment
        within its share (the C form also checks its tables' links); its offer history
        checks itself."""
        probation, protected = self.probation, self.protected
        problems = [
            f"block {block_hash!r:.80} is in both probation and protected"
            for block_hash in protected
            if block_hash in probation
        ]
        if len(self) > self.slots:
            problems.append(f"holds {len(self)} blocks, over its {self.slots} slots")
        if len(protected) > self.protected_slots:
            problems.append(
                f"protected holds {len(protected)} blocks, over its {self.protected_slots} slots"
            )
        return problems

    def clear(self) -> None:
        self.probation.clear()
        self.protected.clear()
        self.offers.clear()
        self.residency.clear()
        self.clock = 0
        self.hits = 0.0


def demote_overflow(
    protected: OrderedDict[BlockHash, int],
    probation: OrderedDict[BlockHash, int],
    limit: int,
    rank: int,
) -> None:
    """Move the protected segment's oldest blocks beyond ``limit`` to probation's newest end.

    SLRU's demotion: a reused block that has not been used again for a whole
    protected segment's worth of uses gets one more probation turn before it
    can leave. It keeps ``rank`` (the current time) without advancing the
    clock, so demotions do not stretch the age of evicted blocks.
    """
    for _ in range(len(protected) - limit):
        block_hash, _ = protected.popitem(last=False)
        probation[block_hash] = rank


def demote_last(order: OrderedDict[BlockHash, int], block_hash: BlockHash) -> None:
    """Move a just-stored block to the eviction end, ranked as the oldest block there.

    Its rank becomes the oldest's, so the age of evicted blocks (the gate's
    residency) is not stretched by it.
    """
    oldest = next(iter(order.values()))
    order.move_to_end(block_hash, last=False)
    order[block_hash] = oldest


def py_sampled(block_hashes: Sequence[BlockHash], mask: int) -> list[BlockHash]:
    """The blocks the models see: those whose mixed hash has no bit of ``mask`` set."""
    return [h for h in block_hashes if (hash(h) * _MIX >> 32) & mask == 0]


try:
    from offload.cpu.policies._miniature import Miniature as BaseMiniature
    from offload.cpu.policies._miniature import sampled
except ImportError:  # installed without a C compiler
    BaseMiniature = PyMiniature  # type: ignore[misc,assignment]
    sampled = py_sampled
"""The forms in use: C where they were built (``_miniature.c``, the same model and sample
without the interpreter's cost per block, which every request pays in each model)."""
