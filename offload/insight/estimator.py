"""A sampled access stream -> the hit-ratio curve of the full one.

The worker keeps a spatial sample of its block references (sampling.py) and
counts every reference; this side replays the sample on tiers ``rate``
times the size: LRU on one stack (stack_distance.py), every other policy on
shadow tiers (shadow.py). A capacity c becomes ``rate * c`` blocks of
sample: the stack compares distances with it exactly (a distance d fits
when d <= rate * c), a shadow takes it rounded (at least one block).

A shadow at ``rate * c`` stands for the policy at ``c`` only when the
policy's decisions scale with its capacity (LRU, ARC: every size they keep
is proportional to it). A policy with sizes of its own that do not scale
(a fixed-size model, a fixed window) behaves differently on a smaller tier,
and its sampled curve must be checked against a sweep before it is trusted.

Prefix hits survive the sampling because a tier keeps a chain's head at
least as long as its tail (an LRU touch, vLLM's hash chains): a sampled
block's leading run on the sample stands for the chain's. On a stream whose
blocks do not form chains it does not, and the curve reads above the tier, under
every policy; ``prefix_check`` (prefix_check.py) tells, on the estimator's sample
whichever policies it simulates.

The sample's size is itself random: one hot block (every conversation's
first block) in or out of it moves the sampled references far from
``rate`` times all of them. SHARDS-adj (Waldspurger et al., FAST'15) puts
the difference in the smallest distance, as hits at every capacity, which
is where a block that hot sits; the worker's count of all references makes
that possible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from offload.base import BlockHash
from offload.cpu.policies.registry import policy_names
from offload.insight.curve import DEFAULT_MULTIPLES, HitRatioCurve, scaled_capacities
from offload.insight.prefix_check import PrefixCheck
from offload.insight.sampling import DEFAULT_RATE, check_rate
from offload.insight.shadow import ShadowTiers
from offload.insight.stack_distance import LRUStackCurve
from offload.insight.uncertainty import capacity_errors, point_errors

STACK_POLICY = "lru"
"""The policy the stack answers; every other one gets shadow tiers."""


def scaled_blocks(rate: float, capacity: int, *, stacked: bool) -> int:
    """The sampled blocks a tier of ``capacity`` blocks holds at ``rate``: on the stack
    ``rate * capacity`` floored (a distance d fits when d <= rate * capacity), on a shadow
    tier rounded, at least one block (a tier holds whole blocks)."""
    scaled = rate * capacity
    return math.floor(scaled) if stacked else max(1, round(scaled))


def scaled_tiers(rate: float, capacities: Sequence[int], *, stacked: bool) -> list[int]:
    """``scaled_blocks`` at each of ``capacities``: the sampled tiers a curve's points stand on."""
    return [scaled_blocks(rate, c, stacked=stacked) for c in capacities]


class CurveEstimator:
    """The curve around ``current`` (blocks) from a stream sampled at ``rate``.

    Memory: the stack holds at most ``rate`` x the largest capacity hashes,
    and each shadow at most its scaled capacity (plus what its policy keeps
    of history, bounded by the policy at that capacity: ARC's ghost lists);
    ``held_blocks`` reads it, ``max_held_blocks`` is the bound, and
    ``shadow_bytes`` the shadows' bytes at what each policy states per slot.
    The prefix check keeps a predecessor per block, as many as the largest
    tier holds (and one request's more: prefix_check.py).
    """

    def __init__(
        self,
        current: int,
        rate: float = DEFAULT_RATE,
        policies: Sequence[str] | None = None,
        multiples: Sequence[float] = DEFAULT_MULTIPLES,
        *,
        check_prefixes: bool = True,
        checked_from: float | None = None,
    ) -> None:
        self.rate = check_rate(rate)
        self.capacities = scaled_capacities(current, multiples)
        if checked_from is not None and not checked_from > 0:
            raise ValueError(f"checked_from must be a positive multiple, got {checked_from}")
        smallest = (
            self.capacities[0] if checked_from is None else max(1, round(current * checked_from))
        )
        self.current = current
        self.policies = list(dict.fromkeys(policy_names() if policies is None else policies))
        known = policy_names()
        unknown = [p for p in self.policies if p not in known]
        if unknown:
            raise ValueError(f"unknown cache policy {unknown[0]!r}; known: {', '.join(known)}")
        self._stack = (
            LRUStackCurve(scaled_tiers(self.rate, self.capacities, stacked=True))
            if STACK_POLICY in self.policies
            else None
        )
        self._shadows = ShadowTiers(
            [p for p in self.policies if p != STACK_POLICY],
            scaled_tiers(self.rate, self.capacities, stacked=False),
        )
        checker = self._shadows if self._stack is None else self._stack
        reach = scaled_blocks(self.rate, smallest, stacked=self._stack is not None)
        self.prefix_check = (
            PrefixCheck(max(1, checker.capacities[-1]), reach) if check_prefixes else None
        )
        """Whether the sample keeps the premise of its prefix hits (prefix_check.py), as many
        blocks as the largest simulated tier holds, for tiers from ``checked_from`` times
        ``current`` up (None: the curve's smallest capacity), at the scale of the tiers it
        runs beside; None where ``check_prefixes`` is off (another estimator checks the
        same stream)."""
        self.block_refs = 0
        self.sampled_refs = 0

    @property
    def held_blocks(self) -> int:
        stack = self._stack.held_blocks if self._stack else 0
        return stack + self._shadows.held_blocks

    @property
    def shadow_bytes(self) -> int:
        """The shadow tiers' memory now, estimated (``ShadowTiers.estimated_bytes``)."""
        return self._shadows.estimated_bytes

    @property
    def touched_blocks(self) -> int:
        """Distinct sampled blocks seen, up to the largest scaled capacity: a tier whose
        scaled size is above this has never been full, has missed only first uses, and
        would hit the same at any larger size so far."""
        stack = self._stack.held_blocks if self._stack else 0
        return max(stack, self._shadows.touched_blocks)

    @property
    def max_held_blocks(self) -> int:
        stack = self._stack.capacities[-1] if self._stack else 0
        return stack + len(self._shadows.policies) * sum(self._shadows.capacities)

    def record(self, sampled: Sequence[BlockHash], block_refs: int) -> None:
        """One request: its sampled blocks in prompt order, and how many blocks it had in all."""
        if block_refs < len(sampled):
            raise ValueError(f"a request of {block_refs} blocks cannot have {len(sampled)} sampled")
        self.record_many([sampled], block_refs)

    def record_many(self, requests: Sequence[Sequence[BlockHash]], block_refs: int) -> None:
        """Requests in order, each its sampled blocks in prompt order (empty: none sampled), and
        how many blocks they had in all.

        A sample frame's worth in one call, as the ingest thread feeds the stack: the
        calls and the look-ups of the stack's parts are paid once per frame, not once per
        request. Each request's own bound (no more sampled blocks than blocks) is the
        caller's to check; a sample frame's decoder does.
        """
        sampled_refs = sum(map(len, requests))
        if block_refs < sampled_refs:
            raise ValueError(f"requests of {block_refs} blocks cannot have {sampled_refs} sampled")
        self.block_refs += block_refs
        if not sampled_refs:
            return
        self.sampled_refs += sampled_refs
        if self._stack is not None:
            self._stack.add_many(requests)
        if self.prefix_check is not None:
            self.prefix_check.add_many(requests)
        if self._shadows.policies:
            add = self._shadows.add
            for sampled in requests:
                if sampled:
                    add(sampled)

    def curve(self) -> HitRatioCurve:
        """Hit ratio per policy at each capacity, corrected for the sample's size."""
        ratios: dict[str, tuple[float, ...]] = {}
        for policy in self.policies:
            if policy == STACK_POLICY and self._stack is not None:
                hits = self._stack.hits
            else:
                hits = self._shadows.hits(policy)
            ratios[policy] = tuple(
                adjusted_ratio(h, self.sampled_refs, self.block_refs, self.rate) for h in hits
            )
        return HitRatioCurve(self.capacities, ratios, self.current, exact=self.rate == 1.0)

    def errors(self, curve: HitRatioCurve) -> dict[str, tuple[float, ...]]:
        """Per policy, each of ``curve``'s points' standard error (0..1) from this sample
        (uncertainty.py): ``curve`` is this estimator's, read at the same moment."""
        expected = self.rate * self.block_refs
        return {
            policy: point_errors(ratios, curve.capacities, self._held(policy), self.rate, expected)
            for policy, ratios in curve.hit_ratios.items()
        }

    def capacity_errors(self, curve: HitRatioCurve) -> dict[str, tuple[float, ...]]:
        """Per policy, the part of each point's error (0..1) from its scaled tier's size, which
        a difference between two points carries from each (``uncertainty.difference_error``)."""
        return {
            policy: capacity_errors(ratios, curve.capacities, self._held(policy), self.rate)
            for policy, ratios in curve.hit_ratios.items()
        }

    def _held(self, policy: str) -> list[int]:
        """The sampled blocks ``policy``'s tier holds at each capacity."""
        stacked = policy == STACK_POLICY and self._stack is not None
        return scaled_tiers(self.rate, self.capacities, stacked=stacked)


def adjusted_ratio(hits: int, sampled_refs: int, block_refs: int, rate: float) -> float:
    """Hits on a sample of ``sampled_refs`` references as the full stream's hit ratio (0..1).

    SHARDS-adj: the sample's surplus or shortfall against ``rate`` times the
    ``block_refs`` it stands for is put in as hits (see the module's text).
    """
    expected = rate * block_refs
    if expected <= 0:
        return 0.0
    return min(1.0, max(0.0, (hits + (expected - sampled_refs)) / expected))
