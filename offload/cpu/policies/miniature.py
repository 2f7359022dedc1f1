"""Miniature simulations: which admission horizon and protected share the workload rewards now.

No single policy suits every workload: where a conversation returns long
after its tier would have evicted its new blocks, refusing first offers
keeps reusable blocks resident; where sessions return quickly, a refused
block is a lost hit; where long one-off prompts (scans) pass through, only a
segment of blocks already reused (SLRU's protected segment) keeps the reused
ones from being flushed. The tier therefore runs small models of itself, one
per candidate (a reuse gate at a few horizons, or admit everything with a
protected segment),
on a hash-sampled share of the blocks at the same share of the capacity
(Waldspurger et al., "Cache Modeling and Optimization using Miniature
Simulations", ATC'17), and follows the one with the most recent hits (the
set-dueling idea of Qureshi et al.'s DIP, ISCA'07).

A prefix cache hits a block only when every block before it is stored, so a
model counts the leading run of a request's sampled blocks it holds, not
each block on its own. Sampling by hash keeps a block in or out of the
sample for good, so every model sees the same blocks. The model itself, in
its C and Python forms, is ``miniature_model.py``; here are the candidates
and the duel.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf, sqrt
from typing import NamedTuple

from offload.base import BlockHash
from offload.cpu.policies.miniature_model import BaseMiniature, oldest_offer, sampled
from offload.cpu.policies.offer_history import OfferHistory


class Candidate(NamedTuple):
    """One way to run the tier: its admission horizon and its protected share."""

    horizon: float | None
    """Reuse horizon in residency ages; ``inf``: any gap the offer history remembers (vLLM's
    reuse filter); None admits every block."""
    protected_share: float
    """Share of the slots that blocks reused since their store may hold, safe from
    eviction while others remain (SLRU's protected segment); 0 is plain LRU."""
    admit_continuations: bool = False
    """Admit a store's blocks whatever the horizon when its request's head was held: the
    request continues a chain the tier serves (a live conversation, say), so what it adds
    is the next turn's prefix."""

    @property
    def label(self) -> str:
        """The candidate's name in metrics: ``admit_all``, ``reuse_filter`` (no horizon: a
        second offer at any gap, as vLLM's filter), or ``horizon_<ages>`` with
        ``_continuations`` where continuing requests' blocks pass."""
        if self.horizon is None:
            return "admit_all"
        if self.horizon == inf:
            return "reuse_filter"
        return f"horizon_{self.horizon:g}" + ("_continuations" if self.admit_continuations else "")

    @property
    def openness(self) -> int:
        """How much of what it is offered this candidate may store, as a rank: 0 for a
        gate with a horizon, 1 for the gate without one (every second offer), 2 for
        admitting everything. Moving to a more open candidate floods the tier
        (``FLOOD_NOISE``)."""
        if self.horizon is None:
            return 2
        return 1 if self.horizon == inf else 0

    def oldest_offer(self, now: int, age: float | None, continues: bool) -> float | None:
        """The earliest previous offer that earns a block a slot at ``now``; None admits
        every block: this candidate has no gate, the tier has no residency age yet (it
        is still filling), or the request continues a held chain and this candidate
        admits such requests' blocks."""
        return oldest_offer(self.horizon, self.admit_continuations, now, age, continues)


CANDIDATES: tuple[Candidate, ...] = (
    Candidate(2, 0.25),
    Candidate(None, 0.5),
    Candidate(1, 0.25),
    Candidate(2, 0.25, True),
    Candidate(inf, 0.25),
)
"""The first leads until a model has hits: the gate's reasoned default (a block
back within two residencies would likely still be resident). Admit everything
protects half the tier for reused blocks, so a scan of one-off blocks churns
only the other half (SLRU's split, Karedla et al., 1994). The gates protect a
quarter: what they admit was offered before, so fewer one-offs churn
probation, but a block reused since its store still outlives one that was
not; half would hold blocks past their reuse that the gate's newer
admissions need room for. The fourth gates only requests that start cold: one
whose head was held continues a chain in use, and where such chains come
back before the gate's second offer would, refusing their new blocks loses
a turn of hits each time; where they come back late (a conversation trace
whose sessions outlast the tier), storing them evicts what would have been
reused, and the duel leaves it. The last stores a block at its second offer
whatever the gap, as vLLM's reuse filter does: where documents come back
several times, each long after the tier would have evicted it, the short
horizons refuse their second offers and admit-everything has evicted them;
without it the duel could not follow that filter where it is the best."""
MODEL_SLOTS = 256
"""Sampled slots a model keeps at least (when the tier has that many): enough
for its hit count to rank horizons, few enough that its cost stays small."""
WINDOW_CAPACITIES = 16
"""Hits count over about this many model capacities of sampled references.
A change of candidate costs the tier what the dropped candidate built (the
protected segment, or the gate's selection), which no model counts, so the
lead must last: over a few turnovers only, a mix of scans and reuse flips the
tier back and forth and leaves it below both candidates. A change of workload
still moves the choice within this many turnovers."""
MODEL_TURNOVERS = 1
"""Turnovers a model waits before its gate refuses (``ResidencyAge``): one, so
its residency age is the steady state's, not the fill's. The tier waits one
more (``GatedLRUCachePolicy``): by the time it could refuse a block, the gate
models have refused blocks for a whole turnover, so where refusing loses
(sessions that return at once), the duel has already left the gate."""
FLOOD_NOISE = 3.0
"""Times the noise by which a more open candidate (``Candidate.openness``: admit-everything
over any gate, the gate without a horizon over one with) must lead to take over (any other
change needs a lead of once the noise). Opening the gate floods the tier: what it then
stores (every block, or every block offered twice however long ago) evicts the selection
the stricter gate built, which no switch back restores, while a stricter gate only starts
refusing. A workload whose phases favour each in turn shows this most: the open candidate's
model leads through one phase, and the tier, flooded, pays in the next. And the evidence
against a gate comes first: just after the models' gates start refusing, they show the cost
(refused blocks that return soon) before the gain (what their selection keeps), so a few
whole-prefix hits could otherwise tip the tier into flooding for a whole window of hits."""
FLOOD_TURNOVERS = WINDOW_CAPACITIES // 4
"""Model turnovers for which a more open candidate leading by more than once the noise
takes over all the same: a lead that lasts a quarter of the window the hits count over is
the workload's, not the gates' start-up cost (which shows for a turnover or so), and where
admit-everything is right (sessions that come back at once) waiting for three times the noise
leaves the tier gated, refusing what comes back, for thousands of requests."""


def sampling_rate(capacity: int) -> int:
    """One in how many hashes the models see: a power of two leaving them >= MODEL_SLOTS slots."""
    rate = 1
    while capacity // (rate * 2) >= MODEL_SLOTS:
        rate *= 2
    return rate


class Miniature(BaseMiniature):
    """A hash-only model of the tier run as one candidate, in ``slots`` sampled slots.

    Memory: at most ``slots`` resident hashes (probation and protected
    together) and ``OFFERS_PER_SLOT * slots`` remembered offers.
    """

    __slots__ = ("candidate",)

    def __init__(self, slots: int, candidate: Candidate) -> None:
        slots = max(1, slots)
        super().__init__(
            slots,
            candidate.horizon,
            int(candidate.protected_share * slots),
            candidate.admit_continuations,
            OfferHistory(slots),
            MODEL_TURNOVERS,
        )
        self.candidate = candidate


class MiniatureDuel:
    """The candidates' models, and the one the tier follows.

    The tier changes candidate only when another model is ahead by more than
    the noise of two hit counts (the square root of their sum, a count's
    standard deviation), ``FLOOD_NOISE`` times that to a more open candidate
    unless that lead beyond the noise has lasted ``FLOOD_TURNOVERS`` model
    turnovers: a change costs the tier more than either model shows, since
    the segment or the gate it drops is rebuilt only over time.

    Memory: ``len(CANDIDATES)`` models of at most ``2 * MODEL_SLOTS`` slots
    each, whatever the tier's capacity.
    """

    __slots__ = (
        "_decay_per_block",
        "_flood_since",
        "_mask",
        "_recent_references",
        "_references",
        "leader",
        "models",
        "switches",
    )

    def __init__(self, capacity: int) -> None:
        rate = sampling_rate(capacity)
        self._mask = rate - 1
        slots = max(1, capacity // rate)
        self.models = [Miniature(slots, candidate) for candidate in CANDIDATES]
        self._decay_per_block = 1.0 / (WINDOW_CAPACITIES * slots)
        self.leader: Candidate = CANDIDATES[0]
        self._references = 0
        """Sampled blocks run so far: the models' clock for how long a lead lasts."""
        self._flood_since: int | None = None
        """Since when (in ``_references``) a more open candidate has led the one the tier
        follows by more than the noise; None while none does."""
        self._recent_references = 0.0
        """Sampled blocks run, decayed as the models' hits are: their hit counts' denominator."""
        self.switches = 0
        """Times the tier changed the candidate it follows."""

    def run(self, request: Sequence[BlockHash], continues: bool) -> None:
        """Feed one request (head first) to every model and follow the leader;
        ``continues``: its first block was held in the tier."""
        ends = True
        if self._mask:
            ends = bool(sampled(request[-1:], self._mask))
            request = sampled(request, self._mask)
            if not request:
                return
        self._references += len(request)
        decay = max(0.0, 1.0 - len(request) * self._decay_per_block)
        self._recent_references = self._recent_references * decay + len(request)
        leader = None
        for model in self.models:
            model.run(request, decay, continues, ends)
            if model.candidate == self.leader:
                leader = model
        best = max(self.models, key=_hits)
        if leader is None:
            self.leader = best.candidate
            return
        lead, noise = best.hits - leader.hits, sqrt(best.hits + leader.hits)
        if best.candidate.openness <= leader.candidate.openness:
            self._flood_since = None
            switch = lead > noise
        elif lead <= noise:
            self._flood_since = None
            switch = False
        else:
            if self._flood_since is None:
                self._flood_since = self._references
            lasted = self._references - self._flood_since >= FLOOD_TURNOVERS * best.slots
            switch = lasted or lead > FLOOD_NOISE * noise
        if switch:
            self.leader = best.candidate
            self._flood_since = None
            self.switches += 1

    def hit_ratios(self) -> list[tuple[Candidate, float]]:
        """Each candidate's recent hit ratio in its model (0 before any request): what the
        tier would hit, running as that candidate, over the window the duel weighs."""
        references = self._recent_references
        return [
            (model.candidate, model.hits / references if references else 0.0)
            for model in self.models
        ]

    def clear(self) -> None:
        for model in self.models:
            model.clear()
        self.leader = CANDIDATES[0]
        self._references = 0
        self._flood_since = None
        self._recent_references = 0.0
        self.switches = 0


def _hits(model: Miniature) -> float:
    return model.hits
