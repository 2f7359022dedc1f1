"""What a publisher's curve and counts say, in plain words and as fields.

Computed by the sidecar, not the page, so every reader (the page, a script,
an alert) gets the same sentence from the same numbers. Each verdict has a
``kind`` and the figures its sentence states, so a program need not parse
the text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from offload.insight.curve import HitRatioCurve
from offload.insight.estimator import scaled_blocks, scaled_tiers
from offload.insight.uncertainty import capacity_errors, difference_error, point_errors
from offload.insight.window_optimum import WindowResult

VerdictKind = Literal[
    "warming_up",
    "fits",
    "sample_small",
    "not_simulated",
    "shed",
    "long_requests",
    "unchained",
    "capacity",
    "policy",
    "optimum",
    "admission",
    "stranded",
    "stale",
]

MIN_SAMPLED_REFS: Final = 100
"""Sampled references a simulation needs before its curve is worth a verdict."""
MIN_SCALED_BLOCKS: Final = 16
"""The fewest sampled blocks a simulated tier may hold for a verdict on it: below, one
block is over 6% of the tier, and the scaled tier no longer behaves as the real one."""
CAUGHT_UP: Final = 0.9
"""Two policies are compared once the one behind has replayed this share of the other's
sampled references (the shadow thread may lag the stack)."""
POLICY_POINTS: Final = 0.5
"""A policy that differs from the tier's by less than this (points of hit ratio) is no news."""
NO_CHANGE_POINTS: Final = 0.05
"""A change below this shows as 0.0 points: said as no change instead."""
SAMPLED_RESOLUTION_POINTS: Final = 1.0
"""The least a sampled curve is said to tell apart: where a difference's own error
(offload/insight/uncertainty.py) is smaller, as on large tiers, the curve is still held
to this (README, "The hit-ratio curve"); where it is larger, to the error."""
DEAD_WRITES_WORTH_SAYING: Final = 0.1
"""A share of stores never read from which admission is worth a sentence."""
MAX_SHED_SHARE: Final = 0.1
"""The share of the stream's block references a simulation may have lost to a full shadow
queue and still be compared: its tiers never saw a shed frame's blocks, so their later
uses miss there while what the frame would have evicted stays, and its hit ratio is off,
either way, by more the more it lost."""
FITS_TIER_REFS: Final = 2
"""Tiers' worth of sampled references a simulation must have replayed with its tier never
full before the stream is said to fit the tier. Below one tier's worth, a stream of only
new blocks could not have filled it yet, so a tier not full says nothing; from twice its
size on, more than half of the references went to blocks already seen (fewer distinct
ones than the tier holds were touched), so the stream is reusing what it holds rather
than still growing into the tier. Counted in the tier's own size, so no workload's scale
sets it."""
LITTLE_TO_GAIN: Final = 0.95
"""An efficiency against the optimum from which a policy change has little hit ratio to win."""
HALVING: Final = 0.5
"""The smallest multiple of the tier's size a verdict speaks of (halving it): the prefix
check speaks for tiers from there up (``CurveEstimator``'s ``checked_from``), so the
unchained verdict that stands in for the others is said of the sizes they speak of."""


@dataclass(frozen=True, slots=True)
class Simulation:
    """What one simulation of the curve (the stack, or the shadow tiers) rests on.

    ``rate``: the rate it runs at (a capacity c is about ``rate * c`` sampled
    blocks there; the stack and the shadows may run at different ones);
    ``sampled_refs`` and ``block_refs``: sampled references and block references
    it replayed; ``shed_block_refs``: block references of frames the shadow queue
    had no room for; ``touched_blocks``: distinct sampled blocks seen, up to its
    largest scaled capacity (``CurveEstimator.touched_blocks``); ``stacked``: the
    LRU stack, not shadow tiers (they scale a capacity differently:
    ``scaled_blocks``); ``longest_request``: the most blocks (sampled or not) of a
    request it replayed, counted on the stack only (``outgrown``).
    """

    rate: float
    sampled_refs: int
    block_refs: int
    shed_block_refs: int
    touched_blocks: int
    stacked: bool
    longest_request: int = 0
    prefix_checked: int = 0
    prefix_broken: int = 0

    @property
    def covered_block_refs(self) -> int:
        """The stream's block references it has dealt with, replayed or shed: rate-free, so
        two simulations at different rates compare on it (the one behind has frames queued)."""
        return self.block_refs + self.shed_block_refs

    @property
    def unchained(self) -> bool:
        """Whether its sample shows a stream whose blocks do not form prefix chains: over
        ``MIN_SAMPLED_REFS`` references checked, a share the curve would resolve of
        predecessors changed to a less recent block that a tier of half the size may have
        let go (``PrefixCheck.broken``: each such reference may be counted as a hit the
        tier does not get), below rate 1 (a replay of every block follows every prefix, as
        the tier does)."""
        return (
            self.rate < 1.0
            and self.prefix_checked >= MIN_SAMPLED_REFS
            and self.prefix_broken >= SAMPLED_RESOLUTION_POINTS / 100 * self.prefix_checked
        )

    def too_small(self, capacity: int) -> bool:
        """Whether a tier of ``capacity`` blocks is too few sampled blocks here (never at
        rate 1: the replay is then the tier's own, block for block)."""
        return _too_few_sampled(self.rate, capacity)

    def outgrown(self, capacity: int) -> bool:
        """Whether a request longer than a tier of ``capacity`` blocks reached the stack.

        A tier cannot store a request with more blocks than it holds whole (kvscope's
        refuses it: it cannot make room without evicting the request's own blocks), while
        the stack, one recency order for every capacity, puts the request's head on top at
        each: from then on its point at that capacity is not an lru tier's (on long prompts,
        several points off it). Shadow tiers are managers, which refuse as the tier does.
        """
        return self.stacked and self.longest_request > capacity

    def resolves(self, capacity: int) -> bool:
        """Whether its point at ``capacity`` blocks stands for a tier of that size: enough
        sampled blocks, and no request longer than the tier on the stack."""
        return not (self.too_small(capacity) or self.outgrown(capacity))

    def held(self, capacity: int) -> int:
        """The sampled blocks a tier of ``capacity`` blocks holds here."""
        return scaled_blocks(self.rate, capacity, stacked=self.stacked)

    @property
    def expected_refs(self) -> float:
        """The sampled references its replay stands for: ``rate`` times its block references."""
        return self.rate * self.block_refs

    def capacity_errors(self, curve: HitRatioCurve, policy: str) -> tuple[float, ...]:
        """Each of ``policy``'s points' error (0..1) from its scaled tier's size here
        (``uncertainty.capacity_errors``)."""
        held = scaled_tiers(self.rate, curve.capacities, stacked=self.stacked)
        return capacity_errors(curve.hit_ratios[policy], curve.capacities, held, self.rate)

    def point_errors(self, curve: HitRatioCurve, policy: str) -> tuple[float, ...]:
        """Each of ``policy``'s points' standard error (0..1) here (``uncertainty.point_errors``;
        0 at rate 1)."""
        held = scaled_tiers(self.rate, curve.capacities, stacked=self.stacked)
        ratios = curve.hit_ratios[policy]
        return point_errors(ratios, curve.capacities, held, self.rate, self.expected_refs)

    def unfilled(self, capacity: int) -> int | None:
        """The sampled blocks a tier of ``capacity`` blocks holds here, while the stream has
        touched fewer (the tier has never been full); None once it has been."""
        held = self.held(capacity)
        return held if self.touched_blocks < held else None

    def fits(self, capacity: int) -> bool:
        """Whether the stream fits a tier of ``capacity`` blocks here: the tier has never
        been full over ``FITS_TIER_REFS`` times as many sampled references as it holds
        sampled blocks, so it has held every block the stream touched while the stream
        came back to them."""
        held = self.unfilled(capacity)
        return held is not None and self.sampled_refs >= FITS_TIER_REFS * held


@dataclass(frozen=True, slots=True)
class CurveBasis:
    """What a curve rests on, for the verdicts it can bear: each simulated policy's
    simulation (one not built yet counts what it shed, and nothing replayed), the policies
    in the curve's order, the worker's sample rate (a simulation may run below it, to fit
    the memory bound), and the block references the stream has brought since the
    simulations began (what a lagging shadow has not dealt with yet is queued, not lost)."""

    simulations: Mapping[str, Simulation]
    policies: tuple[str, ...]
    worker_rate: float
    block_refs: int

    def shed_share(self, simulation: Simulation) -> float:
        """The share of the stream ``simulation`` lost to a full shadow queue so far."""
        return simulation.shed_block_refs / self.block_refs if self.block_refs else 0.0

    @property
    def unchained(self) -> tuple[str, Simulation] | None:
        """The first simulation (and its policy) whose sample shows the stream's blocks do
        not form prefix chains (``Simulation.unchained``): the stream's, not the
        simulation's, so it holds back every figure that counts prefix hits on the sample."""
        return next(((p, s) for p, s in self.simulations.items() if s.unchained), None)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One finding: its sentence and the figures in it.

    ``points``: hit-ratio points gained (negative: lost); ``multiple``: the
    capacity it speaks of over the current one (the curve's multiple at that
    capacity: whole blocks, so an odd tier's half is not 0.5); ``share``: a
    ratio in 0..1 (dead writes, the tier's hits over the optimum's, the stream's share a
    simulation shed, the share of the tier a stream that fits it touched, or the share of
    sampled blocks met again behind another, less recent predecessor, out of a half tier's
    reach, on an unchained stream);
    ``blocks``: a block count (stranded blocks, the capacity a multiple stands for, or
    the tier size a long_requests verdict speaks of); ``error``: the standard error of
    ``points`` from the sample (``uncertainty.difference_error``), on a sampled curve, or of
    an optimum verdict's ``share``, in points (``uncertainty.quotient_error``), below rate 1.
    """

    kind: VerdictKind
    text: str
    policy: str | None = None
    multiple: float | None = None
    points: float | None = None
    share: float | None = None
    blocks: int | None = None
    medium: str | None = None
    error: float | None = None


def _blocks(count: int) -> str:
    """``count`` blocks, "1 block" for one (a tier of 2 blocks halves to 1)."""
    return "1 block" if count == 1 else f"{count:,} blocks"


def _points(value: float) -> str:
    return f"~{abs(value):.1f} points"


def _percent(share: float) -> str:
    """``share`` (0..1) as a percent by the page's rule for every number it shows
    (app/static/js/format.js, ``decimal`` and ``withUnit``): three significant figures, no
    trailing zeros, the sign against the number ("97.7%"). The page sets a verdict beside
    the figure it states (the dead-write ratio, the efficiency): "98%" there read as another
    figure than the page's "97.7 %", and a page writing "97.7 %" beside a verdict's "97.7%"
    wrote one figure two ways."""
    value = 100 * share
    if value >= 100 or value == 0:
        decimals = 0
    elif value >= 10:
        decimals = 1
    elif value >= 1:
        decimals = 2
    else:
        decimals = 2 - math.floor(math.log10(value))
    text = f"{value:.{decimals}f}"
    return f"{text.rstrip('0').rstrip('.') if '.' in text else text}%"


def _too_few_sampled(rate: float, capacity: int) -> bool:
    return rate < 1.0 and rate * capacity < MIN_SCALED_BLOCKS


def _tenths_under(value: float, bound: int) -> str:
    """``value``, below ``bound``, to one decimal, never rounded up to the bound (15.96
    sampled blocks once read "16.0 sampled blocks, under the 16")."""
    return f"{min(round(value, 1), bound - 0.1):.1f}"


def _rate_up(rate: float) -> float:
    """``rate`` rounded up to two significant digits (to nearest could fall short), at most 1."""
    scale = 10.0 ** (1 - math.floor(math.log10(rate)))
    return min(1.0, math.ceil(round(rate * scale, 9)) / scale)


def _too_small(what: str, capacity: int, rate: float, worker_rate: float | None) -> Verdict:
    """No verdict on ``what``: the tier of ``capacity`` blocks is too few sampled blocks at
    ``rate``, which the memory bound may have set below the worker's (``worker_rate``):
    the sentence names what must rise, the bound, the worker's rate, or both."""
    needed = _rate_up(MIN_SCALED_BLOCKS / capacity)
    narrowed = worker_rate is not None and rate < worker_rate
    if narrowed and needed <= worker_rate:
        remedy = (
            "KVSCOPE_INSIGHT_MAX_BYTES: the sidecar runs this simulation below the worker's "
            f"sample_rate of {worker_rate:g} to fit it"
        )
    elif narrowed:
        remedy = (
            f"the worker's sample_rate, now {worker_rate:g}, and KVSCOPE_INSIGHT_MAX_BYTES: "
            "the sidecar runs this simulation below the worker's rate to fit it"
        )
    else:
        remedy = "the worker's sample_rate, within the sidecar's KVSCOPE_INSIGHT_MAX_BYTES"
    return Verdict(
        "sample_small",
        f"no verdict on {what}: at a sample rate of {rate:g}, {_blocks(capacity)} "
        f"{'is' if capacity == 1 else 'are'} "
        f"{_tenths_under(rate * capacity, MIN_SCALED_BLOCKS)} sampled blocks, under the "
        f"{MIN_SCALED_BLOCKS} a simulated tier needs; a rate of at least {needed:g} would do "
        f"({remedy})",
        blocks=capacity,
    )


def _shed(policy: str, share: float, what: str) -> Verdict:
    return Verdict(
        "shed",
        f"no verdict on {what}: {policy}'s simulation lost {_percent(share)} of "
        "the stream's block references to a full shadow queue (the shadow thread is behind: "
        "KVSCOPE_INSIGHT_CPU_SHARE, KVSCOPE_INSIGHT_QUEUE_BYTES), so its hit ratio is off by "
        "an amount the sidecar cannot tell",
        policy=policy,
        share=share,
    )


def _outgrown(policy: str, capacity: int, simulation: Simulation, what: str) -> Verdict:
    return Verdict(
        "long_requests",
        f"no verdict on {what}: requests of up to {simulation.longest_request:,} blocks came, "
        f"more than the {capacity:,} a tier of that size holds; such a tier cannot store one "
        f"whole (a tier of {simulation.longest_request:,} blocks or more can), which {policy}'s "
        "simulation (one recency stack for every size, each request's head kept on top) "
        "cannot model, so its hit ratio there is not what the tier would hit",
        policy=policy,
        blocks=capacity,
    )


def _not_full(policy: str, held: int, simulation: Simulation) -> Verdict:
    return Verdict(
        "warming_up",
        f"the tier has not been full yet in {policy}'s simulation "
        f"({simulation.touched_blocks:,} distinct sampled blocks seen of the {held:,} it "
        "holds at its rate): every miss so far is a first use, and its verdicts wait until "
        f"it fills, or until it has replayed {FITS_TIER_REFS * held:,} sampled references "
        "without filling (the stream then fits the tier)",
        policy=policy,
    )


def _fits(policy: str, held: int, simulation: Simulation) -> Verdict:
    """The stream fits the tier: every miss was a block's first use, which no tier and no
    policy turns into a hit (a cache hits only what it has seen), so what would raise the
    hit ratio is in the workload, not in the tier."""
    share = simulation.touched_blocks / held
    return Verdict(
        "fits",
        f"the stream fits the tier: in {policy}'s simulation the tier has never been full "
        f"over {simulation.sampled_refs:,} sampled references, which touched "
        f"{simulation.touched_blocks:,} distinct sampled blocks, {_percent(share)} of the "
        f"{held:,} it holds at its rate; every miss was a block's first use (cold) or one "
        "never offered to the tier, so neither a larger tier nor another policy would raise "
        "the hit ratio: only more reuse in the workload would (longer shared prefixes, "
        "prompts sent again)",
        policy=policy,
        share=share,
    )


def _unchained(policy: str, simulation: Simulation) -> Verdict:
    """The sample's prefix hits do not stand for the tier's (offload/insight/prefix_check.py):
    the curve may read far above the tier, by an amount the sample cannot measure."""
    share = simulation.prefix_broken / simulation.prefix_checked
    return Verdict(
        "unchained",
        f"the curve does not predict this tier: in {policy}'s simulation "
        f"{simulation.prefix_broken:,} of {simulation.prefix_checked:,} sampled blocks met "
        f"again ({_percent(share)}) came behind another sampled block than at their last "
        "use, one used less recently than they were and too long ago for a tier of half "
        "this size to hold it, so the stream's blocks do not form "
        "prefix chains (block ids reused behind other prefixes, as vLLM's chained hashes "
        "never are); a lookup stops at a request's "
        "first miss, which a sample of some of its blocks cannot follow, so the curve may "
        "read far above what the tier hits: no verdict on the tier's size or policy, nor on "
        "its distance to the optimum, whose replays over the window count hits the same way "
        "(at a sample_rate of 1 the simulations replay every block, as the tier looks them "
        "up)",
        policy=policy,
        share=share,
    )


def _nothing_sampled(basis: CurveBasis) -> list[Verdict]:
    """Why there is no curve where every simulation has replayed the whole stream and none
    has sampled a reference (a tiny rate, a tier narrowed far, or a stream of few distinct
    blocks, none of which passes the test): said, not left as an empty page for good."""
    replayed = [s for s in basis.simulations.values() if s.block_refs == basis.block_refs]
    if not basis.block_refs or not replayed or any(s.sampled_refs for s in replayed):
        return []  # nothing yet, or a simulation still catching up (or shed: said once built)
    rate = max(s.rate for s in replayed)
    narrowed = (
        f", the rate the sidecar runs its simulations at, below the worker's sample_rate of "
        f"{basis.worker_rate:g}, to fit KVSCOPE_INSIGHT_MAX_BYTES"
        if rate < basis.worker_rate
        else ""
    )
    return [
        Verdict(
            "warming_up",
            f"no curve yet: none of the stream's {basis.block_refs:,} block references has "
            f"been sampled at a rate of {rate:g}{narrowed} (about "
            f"{rate * basis.block_refs:.1f} were expected; a stream of few distinct blocks "
            "may have none that passes the sample's test); the curve starts at the first",
        )
    ]


def curve_verdicts(
    curve: HitRatioCurve | None, policy: str | None, basis: CurveBasis | None
) -> list[Verdict]:
    """What the curve says of the tier's size and of its policy, once it can say it."""
    if curve is None and basis is not None:
        return _nothing_sampled(basis)
    if curve is None or curve.current is None or policy is None or basis is None:
        return []
    simulations = basis.simulations
    current = curve.current
    unchained = basis.unchained
    if unchained is not None:
        return [_unchained(*unchained)]
    if policy not in basis.policies:
        simulated = ", ".join(basis.policies)
        return [
            Verdict(
                "not_simulated",
                f"the tier runs {policy}, which the curve does not simulate (it simulates "
                f"{simulated}: KVSCOPE_INSIGHT_POLICIES, policies whose sampled curve was "
                "checked against full replays): no verdict on the tier's size, or on other "
                "policies against its own",
                policy=policy,
            )
        ]
    own = simulations[policy]
    what = "the tier's size or policy"
    unready = _unready(policy, own, current, what, basis)
    if unready is not None:
        return [unready]
    resolution = NO_CHANGE_POINTS if curve.exact else SAMPLED_RESOLUTION_POINTS
    found: list[Verdict] = []
    sizes: tuple[tuple[float, str], ...] = ((2.0, "doubling"), (HALVING, "halving"))
    others = [other for other in basis.policies if other != policy]
    if own.fits(current):
        # Its sentence says what a larger tier and another policy would do; a smaller one
        # may lose hits, which the curve tells.
        found.append(_fits(policy, own.held(current), own))
        sizes, others = ((HALVING, "halving"),), []
    here = curve.at(policy, current)
    for multiple, word in sizes:
        # In whole blocks, as the curve's capacities are: the verdict's multiple is then the
        # curve's own at that capacity (3 blocks halve to 2, a multiple of 2/3, not 0.5).
        blocks = max(1, round(current * multiple))
        if blocks == current or blocks not in curve.capacities:
            continue
        if own.too_small(blocks):
            found.append(_too_small(f"{word} the tier", blocks, own.rate, basis.worker_rate))
            continue
        if own.outgrown(blocks):
            found.append(_outgrown(policy, blocks, own, f"{word} the tier"))
            continue
        points = 100 * (curve.at(policy, blocks) - here)
        error = _error(curve, points, (own, policy, blocks), (own, policy, current))
        if abs(points) >= max(resolution, error or 0.0):
            change = f"would {'add' if points > 0 else 'lose'} {_points(points)} of hit ratio"
            change += _widened(error, resolution, "these sizes")
        elif curve.exact:
            change = "would not change its hit ratio"
        else:
            change = f"would change its hit ratio by less than {_tell(error, resolution)}"
        found.append(
            Verdict(
                "capacity",
                f"{word} the tier (to {_blocks(blocks)}) {change} under {policy}",
                policy=policy,
                multiple=blocks / current,
                points=points,
                blocks=blocks,
                error=error,
            )
        )
    found.extend(
        _policy_verdict(curve, policy, own, other, simulations[other], resolution, basis)
        for other in others
    )
    return found


Point = tuple[Simulation, str, int]
"""A point of the curve: the simulation it comes from, its policy and its capacity (blocks)."""


def _error(curve: HitRatioCurve, points: float, a: Point, b: Point) -> float | None:
    """The standard error, in points, of ``points``, the difference between the curve's points
    ``a`` and ``b``; None on an exact curve. Two simulations at different rates count the
    smaller sample's references."""
    if curve.exact:
        return None
    rate, expected = min((s.rate, s.expected_refs) for s, _, _ in (a, b))
    error_a, error_b = (
        simulation.capacity_errors(curve, policy)[curve.capacities.index(capacity)]
        for simulation, policy, capacity in (a, b)
    )
    return 100 * difference_error(points / 100, error_a, error_b, rate, expected)


def _widened(error: float | None, resolution: float, where: str) -> str:
    """The error said beside a figure where it is wider than the curve's usual ``resolution``."""
    if error is None or error <= resolution:
        return ""
    return f" (±{error:.1f}, the sample's error at {where})"


def _tell(error: float | None, resolution: float) -> str:
    """What a change below ``resolution`` or its ``error`` is said to be under."""
    if error is None or error <= resolution:
        return f"{resolution:g} point"
    return f"the sample's error at these sizes (±{error:.1f} points)"


def _unready(
    policy: str, simulation: Simulation, capacity: int, what: str, basis: CurveBasis
) -> Verdict | None:
    """Why ``policy``'s simulation cannot bear a verdict on ``what`` at ``capacity`` blocks
    yet, if it cannot: too few sampled blocks, requests longer than the tier on the stack,
    too much shed, too few references replayed, or a tier never full that the stream has
    not been seen to fit (``Simulation.fits``)."""
    if simulation.too_small(capacity):
        return _too_small(what, capacity, simulation.rate, basis.worker_rate)
    if simulation.outgrown(capacity):
        return _outgrown(policy, capacity, simulation, what)
    shed = basis.shed_share(simulation)
    if shed > MAX_SHED_SHARE:
        return _shed(policy, shed, what)
    if simulation.sampled_refs < MIN_SAMPLED_REFS:
        return Verdict(
            "warming_up",
            f"{policy}'s simulation rests on {simulation.sampled_refs} sampled references so "
            f"far; its verdicts wait for {MIN_SAMPLED_REFS}",
            policy=policy,
        )
    held = simulation.unfilled(capacity)
    if held is None or simulation.fits(capacity):
        return None
    return _not_full(policy, held, simulation)


def _policy_verdict(
    curve: HitRatioCurve,
    policy: str,
    own: Simulation,
    other: str,
    theirs: Simulation,
    resolution: float,
    basis: CurveBasis,
) -> Verdict:
    """``other`` against the tier's ``policy`` at the tier's size, once both simulations
    can bear it: caught up with each other, on enough sampled blocks, with little shed,
    each been full."""
    assert curve.current is not None
    current = curve.current
    behind, ahead = sorted((theirs.covered_block_refs, own.covered_block_refs))
    if behind < CAUGHT_UP * ahead:
        lagging = other if theirs.covered_block_refs == behind else policy
        return Verdict(
            "warming_up",
            f"{lagging}'s simulation is behind ({behind:,} of {ahead:,} block "
            f"references): {other} and {policy} are compared once it catches up",
            policy=other,
        )
    unready = _unready(other, theirs, current, f"{other} against {policy}", basis)
    if unready is not None:
        return unready
    points = 100 * (curve.at(other, current) - curve.at(policy, current))
    error = _error(curve, points, (theirs, other, current), (own, policy, current))
    floor = max(POLICY_POINTS, resolution)
    if abs(points) < max(floor, error or 0.0):
        text = f"{other} would hit about as {policy} does at this size"
        if error is not None and error > floor:
            text += f", within the sample's error at this size (±{error:.1f} points)"
    else:
        verb = "add" if points > 0 else "lose"
        text = f"{other} would {verb} {_points(points)} at this size"
        text += _widened(error, floor, "this size")
    return Verdict("policy", text, policy=other, multiple=1.0, points=points, error=error)


def window_efficiency(
    result: WindowResult | None,
    policy: str | None,
    capacity: int | None,
    basis: CurveBasis | None,
) -> float | None:
    """The tier's share of the optimum's hits over the window, where it can be told: None
    without a result, where the window replayed another policy than the tier's (one the
    curve does not simulate: ``curve_verdicts`` says so), where the optimum hit nothing,
    where the tier of ``capacity`` blocks is too few sampled blocks at the window's rate, or
    where the curve's ``basis`` shows a stream whose blocks do not form prefix chains (the
    unchained verdict says so): both replays then count a sampled block as hit behind
    unsampled blocks the tier's lookup stopped at, each by its own amount, so their
    quotient is off too (README, "Why the hit ratio is what it is")."""
    if result is None or result.policy != policy or capacity is None:
        return None
    if basis is not None and basis.unchained is not None:
        return None
    return None if _too_few_sampled(result.rate, capacity) else result.efficiency


def optimum_verdict(
    result: WindowResult | None,
    policy: str | None,
    capacity: int | None,
    worker_rate: float | None,
    basis: CurveBasis | None,
) -> list[Verdict]:
    """The tier's policy (on a tier of ``capacity`` blocks) against a clairvoyant cache of the
    same size, over the window; a sample_small verdict where that is too few sampled blocks
    (the window may run below the worker's ``worker_rate``), none where
    ``window_efficiency`` is None for another reason (an unchained stream: the unchained
    verdict says why). Held to its error as the curve's verdicts are: a gap to the optimum
    within it is said as none, and an error wider than a point is said beside the figure."""
    if result is None or result.policy != policy or capacity is None:
        return []
    if basis is not None and basis.unchained is not None:
        return []
    if _too_few_sampled(result.rate, capacity):
        return [_too_small("the distance to the optimum", capacity, result.rate, worker_rate)]
    efficiency, error = result.efficiency, result.efficiency_error
    if efficiency is None or error is None:
        return []
    error *= 100
    window = f"under {result.policy}, over its last {result.refs:,} sampled references"
    if error > 100 * (1.0 - efficiency):
        text = (
            "this tier gets about as many hits as a clairvoyant cache of the same size would, "
            f"within the sample's error over this window (±{error:.1f} points; {window})"
        )
    else:
        widened = (
            f" (±{error:.1f} points, the sample's error over this window)"
            if error > SAMPLED_RESOLUTION_POINTS
            else ""
        )
        text = (
            f"this tier gets {_percent(efficiency)}{widened} of the hits a clairvoyant cache "
            f"of the same size would ({window})"
        )
    return [
        Verdict(
            "optimum",
            text,
            policy=result.policy,
            share=efficiency,
            error=None if result.rate == 1.0 else error,
        )
    ]


def admission_verdict(
    dead_write_ratio: float | None, efficiency: float | None, efficiency_error: float | None
) -> list[Verdict]:
    """Stores never read before they left: the writes admission control would save, and
    whether the hit ratio has anything to gain from it (the distance to the optimum, said
    only where the efficiency is ``LITTLE_TO_GAIN`` or more by its ``efficiency_error``,
    in points, as a change is said only beyond its error)."""
    if dead_write_ratio is None or dead_write_ratio < DEAD_WRITES_WORTH_SAYING:
        return []
    text = f"{_percent(dead_write_ratio)} of stores are never read before they leave: "
    text += "admission control would save those writes"
    if efficiency is not None and efficiency - (efficiency_error or 0.0) / 100 >= LITTLE_TO_GAIN:
        text += (
            f"; the tier already gets {_percent(efficiency)} of the optimum's hits, so "
            "its hit ratio has little to gain from it"
        )
    return [Verdict("admission", text, share=dead_write_ratio)]


def candidate_verdict(hit_ratios: Mapping[str, float], followed: str | None) -> list[Verdict]:
    """Under the gated policy: the admission candidate the tier runs as, against the best
    of its models over the recent window."""
    if followed is None or followed not in hit_ratios:
        return []
    best = max(hit_ratios, key=hit_ratios.__getitem__)
    points = 100 * (hit_ratios[best] - hit_ratios[followed])
    if best == followed or points < POLICY_POINTS:
        text = (
            f"the tier admits as {followed}, at or near the best of its admission candidates "
            "over the recent window"
        )
        return [Verdict("admission", text, points=points)]
    text = (
        f"the tier admits as {followed}; admitting as {best} would add {_points(points)} over "
        "the recent window in its model (the tier switches once the lead is beyond chance)"
    )
    return [Verdict("admission", text, points=points)]


@dataclass(frozen=True, slots=True)
class Tier:
    """A tier as a worker's frame gives it: what a curve is drawn around."""

    policy: str
    capacity: int
    block_size: int

    def __str__(self) -> str:
        return f"{self.policy}, {self.capacity:,} blocks of {self.block_size} tokens"


def stale_verdicts(
    silent_s: float | None, within_s: float, sampled: Tier | None, reported: Tier | None
) -> list[Verdict]:
    """Where the curve is not of the tier as it is now, said first, since its figures read as
    of now: a publisher that has sent nothing for over ``within_s`` seconds (``silent_s``;
    None: never), whose worker may be gone; or one whose latest stats frame reports another
    tier (``reported``) than its latest sample frame (``sampled``): a worker back under
    another policy or size that has not sent a sample of it yet (none, if its sampling is
    off), whose curve would otherwise stand for the new tier."""
    found = []
    if silent_s is not None and silent_s > within_s:
        found.append(
            Verdict(
                "stale",
                f"nothing has come from this publisher for {silent_s:,.0f} s: the curve and "
                "the verdicts below are of its stream up to then, and may no longer hold for "
                "its tier (or for any, if its worker is gone)",
            )
        )
    if sampled is not None and reported is not None and sampled != reported:
        found.append(
            Verdict(
                "stale",
                f"the worker now reports its tier as {reported}, and its sample is of the tier "
                f"it had ({sampled}): the curve and the verdicts below are of that one, until a "
                "sample frame of the new one arrives",
                policy=reported.policy,
                blocks=reported.capacity,
            )
        )
    return found


def stranded_verdicts(stranded: Mapping[str, int]) -> list[Verdict]:
    """Blocks held where no prefix lookup reaches them: capacity spent on nothing."""
    return [
        Verdict(
            "stranded",
            (
                f"1 block on {medium} is stranded: held, but a block before it in its chain "
                "is held nowhere, so no lookup reaches it"
                if count == 1
                else f"{count:,} blocks on {medium} are stranded: held, but a block before "
                "them in their chain is held nowhere, so no lookup reaches them"
            ),
            blocks=count,
            medium=medium,
        )
        for medium, count in stranded.items()
        if count > 0
    ]
