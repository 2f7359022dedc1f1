"""Which verdicts a curve can bear: each rule here once let a false sentence through on a
workload the bundled trace does not have (a tiny tier, a policy the curve does not
simulate, a tier not yet full, a lagging shadow, no reachable hit at all)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.state.insight_verdicts import (
    MIN_SCALED_BLOCKS,
    CurveBasis,
    Simulation,
    Verdict,
    admission_verdict,
    candidate_verdict,
    curve_verdicts,
    optimum_verdict,
    stranded_verdicts,
    window_efficiency,
)
from offload.insight.curve import HitRatioCurve, scaled_capacities
from offload.insight.window_optimum import WindowResult

POLICIES = ("lru", "arc")


def curve_around(current: int, lru: float, arc: float, *, exact: bool = False) -> HitRatioCurve:
    """A curve whose ratio rises by a point per doubling from ``lru`` (``arc``) at 1x."""
    capacities = scaled_capacities(current)
    steps = [round(c / current).bit_length() - 1 if c >= current else -1 for c in capacities]
    ratios = {
        "lru": tuple(lru + 0.01 * s for s in steps),
        "arc": tuple(arc + 0.01 * s for s in steps),
    }
    return HitRatioCurve(capacities, ratios, current, exact)


def basis(
    rate: float,
    *,
    refs: int = 5_000,
    arc_refs: int | None = None,
    touched: int = 10**6,
    arc_rate: float | None = None,
    arc_touched: int | None = None,
    arc_shed_share: float = 0.0,
) -> CurveBasis:
    """The stack (lru) at ``rate`` and the shadows (arc) at ``arc_rate``; ``refs`` block
    references covered (arc: ``arc_shed_share`` of them shed), twenty per sampled one at
    rate 1. The worker samples at ``rate``."""
    arc_rate = rate if arc_rate is None else arc_rate
    arc_refs = refs if arc_refs is None else arc_refs
    stack = Simulation(rate, round(refs * rate * 20), refs, 0, touched, True)
    arc_touched = touched if arc_touched is None else arc_touched
    arc_shed = round(arc_refs * arc_shed_share)
    shadows = Simulation(
        arc_rate,
        round(arc_refs * arc_rate * 20),
        arc_refs - arc_shed,
        arc_shed,
        arc_touched,
        False,
    )
    return CurveBasis({"lru": stack, "arc": shadows}, POLICIES, rate, refs)


def kinds(verdicts: list[Verdict]) -> list[str]:
    return [v.kind for v in verdicts]


def test_a_tier_of_too_few_sampled_blocks_gets_no_verdict_but_the_rate_that_would_do() -> None:
    """8 blocks at rate 0.05 are 0.4 sampled blocks: the stack then hit nothing and the
    shadows one block, and the verdicts said doubling changed nothing (it added 99 points)."""
    (verdict,) = curve_verdicts(curve_around(8, 0.0, 0.9), "lru", basis(0.05))
    assert verdict.kind == "sample_small" and verdict.blocks == 8
    assert "0.4 sampled blocks" in verdict.text and "a rate of at least 1 " in verdict.text
    (verdict,) = curve_verdicts(curve_around(4_000, 0.06, 0.07), "lru", basis(0.002))
    assert verdict.kind == "sample_small" and "a rate of at least 0.004 " in verdict.text


def test_sampled_blocks_under_the_bound_never_read_as_the_bound() -> None:
    """320 blocks at 0.0499 are 15.968 sampled blocks: to one decimal, "16.0 sampled
    blocks, under the 16 a simulated tier needs"."""
    (verdict,) = curve_verdicts(curve_around(320, 0.06, 0.07), "lru", basis(0.0499))
    assert verdict.kind == "sample_small"
    assert "320 blocks are 15.9 sampled blocks, under the 16" in verdict.text


@pytest.mark.parametrize("current", [3, 5, 7, 1_001])
def test_a_capacity_verdicts_multiple_is_the_curves_at_the_capacity_it_names(
    current: int,
) -> None:
    """An odd tier halves to a rounded number of blocks (5 to 2): the verdict said 0.5x
    where the curve, at the same 2 blocks, said 0.4x."""
    curve = curve_around(current, 0.3, 0.3, exact=True)
    multiples = dict(zip(curve.capacities, curve.multiples() or (), strict=True))
    capacity = [v for v in curve_verdicts(curve, "lru", basis(1.0)) if v.kind == "capacity"]
    assert [v.blocks for v in capacity] == [2 * current, round(current / 2)]
    for verdict in capacity:
        assert verdict.blocks is not None and verdict.multiple == multiples[verdict.blocks]
        assert f"(to {verdict.blocks:,} blocks)" in verdict.text


def test_the_rate_said_to_do_is_rounded_up_so_it_does() -> None:
    """16 sampled blocks of 3,000 need a rate of 0.00533: rounded to nearest (0.0053) it
    gave 15.9 sampled blocks, and the verdict it named would have been withheld again."""
    (verdict,) = curve_verdicts(curve_around(3_000, 0.06, 0.07), "lru", basis(0.002))
    assert "a rate of at least 0.0054 " in verdict.text


def test_at_rate_one_no_tier_is_too_small_for_a_verdict() -> None:
    """At rate 1 the replay is the tier's own, block for block: 8 blocks are 8 blocks."""
    verdicts = curve_verdicts(curve_around(8, 0.1, 0.1, exact=True), "lru", basis(1.0))
    assert kinds(verdicts) == ["capacity", "capacity", "policy"]


def test_halving_a_tier_to_too_few_sampled_blocks_is_withheld_alone() -> None:
    current = 20 * MIN_SCALED_BLOCKS  # 1x: 16 sampled blocks at 0.05; halving: 8
    verdicts = curve_verdicts(curve_around(current, 0.3, 0.3), "lru", basis(0.05))
    assert kinds(verdicts) == ["capacity", "sample_small", "policy"]
    assert verdicts[0].multiple == 2.0 and verdicts[1].blocks == current // 2


def test_a_policy_the_curve_does_not_simulate_gets_a_sentence_not_silence() -> None:
    (verdict,) = curve_verdicts(curve_around(2_000, 0.3, 0.3), "gated", basis(0.05))
    assert verdict.kind == "not_simulated" and verdict.policy == "gated"
    assert "lru, arc" in verdict.text


def test_a_tier_that_has_never_been_full_waits_for_its_verdicts() -> None:
    """A tier larger than what the stream has touched has missed only first uses: "doubling
    would not change" is true of the past and says nothing of the tier. 2,000 blocks are
    100 sampled ones at 0.05, and 150 sampled references are under two tiers' worth."""
    curve = curve_around(2_000, 0.3, 0.3)
    (verdict,) = curve_verdicts(curve, "lru", basis(0.05, refs=150, touched=99))
    assert verdict.kind == "warming_up" and "99 distinct sampled blocks" in verdict.text
    assert "until it has replayed 200 sampled references without filling" in verdict.text
    full = curve_verdicts(curve, "lru", basis(0.05, refs=150, touched=100))
    assert "capacity" in kinds(full)


def test_a_stream_that_never_filled_the_tier_over_two_tiers_worth_fits_it() -> None:
    """The tier that never fills waited for its verdicts for good: past two tiers' worth of
    sampled references it has held every block the stream came back to, and says so in
    place of what a larger tier or another policy would do; halving is still told."""
    curve = curve_around(2_000, 0.3, 0.3)
    verdicts = curve_verdicts(curve, "lru", basis(0.05, refs=200, touched=40))
    assert kinds(verdicts) == ["fits", "capacity"]
    fits, halving = verdicts
    assert fits.policy == "lru" and fits.share == pytest.approx(0.4)
    assert "over 200 sampled references" in fits.text
    assert "blocks, 40% of the 100 it holds" in fits.text
    assert "neither a larger tier nor another policy would raise the hit ratio" in fits.text
    assert halving.blocks == 1_000
    assert kinds(curve_verdicts(curve, "lru", basis(0.05, refs=199, touched=40))) == ["warming_up"]


def test_each_simulation_is_full_or_not_at_its_own_rate() -> None:
    """The shadows may run at a lower rate than the stack (a large tier in the memory
    bound): the fullness test once took the stack's count against the lower rate, so arc
    was compared while it had not been full. 20,000 blocks are 200 sampled ones at 0.01, and
    arc's 200 sampled references are under two tiers' worth (past them it would fit)."""
    curve = curve_around(20_000, 0.30, 0.25)
    low = basis(0.05, refs=1_000, touched=1_000, arc_rate=0.01, arc_touched=199)
    verdicts = curve_verdicts(curve, "lru", low)
    assert kinds(verdicts) == ["capacity", "capacity", "warming_up"]
    assert verdicts[-1].policy == "arc" and "199 distinct sampled blocks" in verdicts[-1].text
    filled = basis(0.05, refs=1_000, touched=1_000, arc_rate=0.01, arc_touched=200)
    assert kinds(curve_verdicts(curve, "lru", filled))[-1] == "policy"


def test_a_policy_whose_simulation_lags_is_not_compared_until_it_catches_up() -> None:
    curve = curve_around(2_000, 0.30, 0.25)
    behind = curve_verdicts(curve, "lru", basis(0.05, refs=1_108, arc_refs=801))
    assert "policy" not in kinds(behind)
    (lag,) = [v for v in behind if v.kind == "warming_up"]
    assert "arc's simulation is behind (801 of 1,108 block references" in lag.text
    caught_up = curve_verdicts(curve, "lru", basis(0.05, refs=1_108, arc_refs=1_000))
    (policy,) = [v for v in caught_up if v.kind == "policy"]
    assert policy.points == pytest.approx(-5.0)


def test_simulations_at_two_rates_are_caught_up_on_the_stream_not_on_the_sample() -> None:
    """At a tenth of the stack's rate the shadows replay a tenth of its sampled references:
    compared on those, arc was behind forever, and never compared."""
    curve = curve_around(4_000, 0.30, 0.25)
    verdicts = curve_verdicts(curve, "lru", basis(0.05, arc_rate=0.005))
    (policy,) = [v for v in verdicts if v.kind == "policy"]
    assert policy.points == pytest.approx(-5.0)


def test_a_simulation_that_shed_much_of_the_stream_is_not_compared() -> None:
    """Shed frames are covered (not behind, so never waited for) but their blocks are
    missing from the shadow tiers: arc read low, and lost to lru by what it had shed."""
    curve = curve_around(2_000, 0.30, 0.25)
    shed = curve_verdicts(curve, "lru", basis(0.05, arc_shed_share=0.5))
    assert shed[-1].kind == "shed" and shed[-1].share == pytest.approx(0.5)
    assert "arc's simulation lost 50% of the stream" in shed[-1].text
    (own,) = curve_verdicts(curve, "arc", basis(0.05, arc_shed_share=0.5))
    assert own.kind == "shed", "the tier's own policy shed: no verdict on its size either"
    little = curve_verdicts(curve, "lru", basis(0.05, arc_shed_share=0.05))
    assert little[-1].kind == "policy"


def test_what_a_lagging_shadow_shed_is_a_share_of_the_stream_not_of_what_it_dealt_with() -> None:
    """Arc has dealt with 1,000 of the stream's 5,000 block references (the rest queued),
    400 of them shed: counted against the 1,000, the tier under arc was told its simulation
    lost 40% of the stream (100% before its first replay), when it had lost 8%."""
    curve = curve_around(2_000, 0.30, 0.25)
    lagging = basis(0.05, arc_refs=1_000, arc_shed_share=0.4)
    assert lagging.shed_share(lagging.simulations["arc"]) == pytest.approx(0.08)
    assert "shed" not in kinds(curve_verdicts(curve, "arc", lagging))
    behind = curve_verdicts(curve, "lru", lagging)
    assert behind[-1].kind == "warming_up" and "arc's simulation is behind" in behind[-1].text


def test_a_policy_at_a_rate_too_low_for_the_tier_is_not_compared() -> None:
    """The shadows run at 0.005 to fit the memory bound while the worker samples at 0.05:
    the sentence pointed at the worker's rate, which was already enough."""
    curve = curve_around(2_000, 0.30, 0.25)
    verdicts = curve_verdicts(curve, "lru", basis(0.05, arc_rate=0.005))
    assert verdicts[-1].kind == "sample_small" and "arc against lru" in verdicts[-1].text
    assert (
        "(KVSCOPE_INSIGHT_MAX_BYTES: the sidecar runs this simulation below the "
        "worker's sample_rate of 0.05 to fit it)"
    ) in verdicts[-1].text


def test_a_window_narrowed_to_fit_the_memory_bound_names_the_bound_first() -> None:
    (narrowed,) = optimum_verdict(window("lru", 310, 500, 400, rate=0.02), "lru", 310, 0.1, None)
    assert "(KVSCOPE_INSIGHT_MAX_BYTES: the sidecar runs" in narrowed.text
    (both,) = optimum_verdict(window("lru", 1_000, 500, 400, rate=0.006), "lru", 1_000, 0.01, None)
    assert "a rate of at least 0.016 would do (the worker's sample_rate, now 0.01, and " in (
        both.text
    ), "the bound alone lifts the window to 0.01: 10 sampled blocks, still too few"
    (worker,) = optimum_verdict(window("lru", 310, 500, 400), "lru", 310, 0.05, None)
    assert "(the worker's sample_rate, within" in worker.text


@pytest.mark.parametrize(("exact", "said"), [(False, "by less than 1 point"), (True, "~0.7")])
def test_a_change_below_what_the_curve_resolves_is_said_as_such(exact: bool, said: str) -> None:
    curve = curve_around(2_000, 0.300, 0.300, exact=exact)
    ratios = dict(curve.hit_ratios)
    lru = list(ratios["lru"])
    lru[curve.capacities.index(4_000)] = 0.307
    curve = HitRatioCurve(curve.capacities, {**ratios, "lru": tuple(lru)}, 2_000, exact)
    (doubling,) = [v for v in curve_verdicts(curve, "lru", basis(0.05)) if v.multiple == 2.0]
    assert said in doubling.text and doubling.points == pytest.approx(0.7)


def knee_curve(current: int, arc_over_lru: float = 0.0) -> HitRatioCurve:
    """A sampled curve 10 points steep from half the tier to the tier, and 1.2 from the
    tier to twice it: the points around the tier sit on a steep slope."""
    capacities = scaled_capacities(current)
    lru = tuple(
        0.30 if c < current else 0.40 if c == current else 0.412 + 0.001 * (c // (4 * current))
        for c in capacities
    )
    ratios = {"lru": lru, "arc": tuple(r + arc_over_lru for r in lru)}
    return HitRatioCurve(capacities, ratios, current, exact=False)


def test_a_small_tiers_change_within_the_samples_error_is_withheld() -> None:
    """400 blocks at rate 0.05 are 20 sampled blocks: their share of the tier's recent
    blocks wanders by a fifth, which on this slope moves the tier's point by about 2
    points. The verdict said doubling would add ~1.2 points, a figure the sample cannot
    tell from none; a tier of 40,000 blocks (2,000 sampled) says it."""
    many = basis(0.05, refs=10**6)
    (small,) = [v for v in curve_verdicts(knee_curve(400), "lru", many) if v.multiple == 2.0]
    assert small.error is not None and small.error > abs(small.points or 0.0) > 1.0
    assert "would change its hit ratio by less than the sample's error" in small.text
    assert f"(±{small.error:.1f} points)" in small.text
    (large,) = [v for v in curve_verdicts(knee_curve(40_000), "lru", many) if v.multiple == 2.0]
    assert (
        large.text
        == "doubling the tier (to 80,000 blocks) would add ~1.2 points of hit ratio under lru"
    )
    assert large.error is not None and large.error < 1.0


def test_a_change_beyond_the_samples_error_is_said_with_it_where_it_is_over_a_point() -> None:
    """Halving the small tier loses 10 points: said, with its error, which is over the
    point the curve resolves elsewhere."""
    curve = knee_curve(640)  # 32 sampled blocks, halved to 16: the least a verdict rests on
    (halving,) = [
        v for v in curve_verdicts(curve, "lru", basis(0.05, refs=10**6)) if v.multiple == 0.5
    ]
    assert halving.error is not None and 1.0 < halving.error < 10.0
    assert halving.text.startswith(
        "halving the tier (to 320 blocks) would lose ~10.0 points of hit ratio "
        f"(±{halving.error:.1f}, the sample's error at these sizes)"
    )


def test_policies_closer_than_the_samples_error_hit_about_as_each_other() -> None:
    """arc 2 points above lru on a steep slope at 20 sampled blocks: each point's error is
    about 2 points there, so the lead is within chance; on a large tier it is said."""
    many = basis(0.05, refs=10**6)
    small = next(
        v for v in curve_verdicts(knee_curve(400, 0.02), "lru", many) if v.kind == "policy"
    )
    assert small.text.startswith("arc would hit about as lru does at this size, within the")
    assert small.error is not None and small.error > 2.0
    large = next(
        v for v in curve_verdicts(knee_curve(40_000, 0.02), "lru", many) if v.kind == "policy"
    )
    assert large.text == "arc would add ~2.0 points at this size"


def window(
    policy: str,
    capacity: int,
    optimum_hits: int,
    tier_hits: int,
    rate: float = 0.05,
    error: float = 0.005,
) -> WindowResult:
    """A window over a tier of ``capacity`` blocks (scaled as the window scales it), its
    efficiency's error ``error`` (0..1)."""
    scaled = max(1, round(rate * capacity))
    refs = round(40_000 * rate)
    return WindowResult(policy, scaled, rate, refs, 40_000, optimum_hits, tier_hits, 0.1, error)


def test_the_optimum_verdict_speaks_only_of_the_tiers_own_policy_on_enough_blocks() -> None:
    assert kinds(optimum_verdict(window("arc", 2_000, 500, 400), "arc", 2_000, 0.05, None)) == [
        "optimum"
    ]
    assert window_efficiency(window("arc", 2_000, 500, 400), "arc", 2_000, None) is not None
    stood_in = window("lru", 2_000, 500, 400)
    assert optimum_verdict(stood_in, "gated", 2_000, 0.05, None) == [], "lru stood in for it"
    assert window_efficiency(stood_in, "gated", 2_000, None) is None
    (small,) = optimum_verdict(window("lru", 20, 500, 400), "lru", 20, 0.05, None)
    assert small.kind == "sample_small" and small.blocks == 20
    nothing = window("lru", 2_000, 0, 0)
    assert optimum_verdict(nothing, "lru", 2_000, 0.05, None) == [], "no reachable hit"
    assert window_efficiency(nothing, "lru", 2_000, None) is None


def test_the_optimum_is_withheld_on_the_tiers_own_size_and_its_efficiency_with_it() -> None:
    """The size was rebuilt from the scaled one (round(15.5) = 16 sampled blocks passed as
    enough for a 310-block tier at 0.05), and the API gave the efficiency the verdict
    withheld."""
    small = window("lru", 310, 500, 400)
    (verdict,) = optimum_verdict(small, "lru", 310, 0.05, None)
    assert verdict.kind == "sample_small" and verdict.blocks == 310
    assert window_efficiency(small, "lru", 310, None) is None
    exact = window("lru", 8, 50, 40, rate=1.0)
    assert kinds(optimum_verdict(exact, "lru", 8, 1.0, None)) == ["optimum"], (
        "rate 1: the tier's own"
    )
    assert window_efficiency(exact, "lru", 8, None) == pytest.approx(0.8)


def test_the_efficiency_is_held_to_its_error_as_the_curves_verdicts_are() -> None:
    """Within a point the figure is said alone; wider, with its error; a gap to the optimum
    within the error is said as none. Rate 1 states no error."""
    (narrow,) = optimum_verdict(window("lru", 2_000, 500, 400), "lru", 2_000, 0.05, None)
    assert narrow.text.startswith("this tier gets 80% of the hits a clairvoyant cache")
    assert narrow.error == pytest.approx(0.5) and narrow.share == pytest.approx(0.8)
    wide = window("lru", 2_000, 500, 400, error=0.042)
    (widened,) = optimum_verdict(wide, "lru", 2_000, 0.05, None)
    assert widened.text.startswith(
        "this tier gets 80% (±4.2 points, the sample's error over this window) of the hits"
    )
    assert widened.error == pytest.approx(4.2)
    close = window("lru", 2_000, 500, 490, error=0.03)
    (about,) = optimum_verdict(close, "lru", 2_000, 0.05, None)
    assert about.text.startswith(
        "this tier gets about as many hits as a clairvoyant cache of the same size would, "
        "within the sample's error over this window (±3.0 points; under lru"
    )
    assert about.share == pytest.approx(0.98)
    exact = window("lru", 8, 50, 49, rate=1.0, error=0.0)
    (told,) = optimum_verdict(exact, "lru", 8, 1.0, None)
    assert told.text.startswith("this tier gets 98% of the hits") and told.error is None


def test_admission_is_said_to_save_writes_and_to_win_hits_only_where_there_are_some() -> None:
    (plain,) = admission_verdict(0.96, None, None)
    assert plain.text == (
        "96% of stores are never read before they leave: admission control would save those writes"
    )
    (at_optimum,) = admission_verdict(0.96, 0.99, 0.5)
    assert "already gets 99% of the optimum's hits" in at_optimum.text
    assert admission_verdict(0.05, None, None) == []
    (unsure,) = admission_verdict(0.96, 0.97, 3.0)
    assert "already gets" not in unsure.text, "97% ±3 points may be short of the 95%"


def test_a_verdicts_percent_is_rounded_as_the_page_rounds_the_figure_beside_it() -> None:
    """The page shows the dead-write ratio and the efficiency to three significant figures
    ("97.7%"), and the admission verdict beside them said "98%" and "97%" of the same
    figures: a verdict's percent keeps the page's rule, trailing zeros left off."""
    (verdict,) = admission_verdict(0.977359, 0.97326, 0.0)
    assert verdict.text.startswith("97.7% of stores are never read")
    assert "already gets 97.3% of the optimum's hits" in verdict.text
    (whole,) = admission_verdict(0.5, 0.999999, None)
    assert whole.text.startswith("50% of stores") and "already gets 100% of" in whole.text
    (optimum,) = optimum_verdict(window("lru", 8, 47, 40, rate=1.0), "lru", 8, 1.0, None)
    assert optimum.text.startswith("this tier gets 85.1% of the hits"), optimum.text


def test_an_admission_candidate_near_the_best_keeps_its_true_gap_in_points() -> None:
    """A candidate 0.3 points ahead of the one followed is "at or near the best" in words,
    but its figure said 0.0 points where the candidates' ratios show 0.3."""
    (near,) = candidate_verdict({"admit_all": 0.500, "horizon_1": 0.503}, "admit_all")
    assert "at or near the best" in near.text and near.points == pytest.approx(0.3)
    (best,) = candidate_verdict({"admit_all": 0.500, "horizon_1": 0.4}, "admit_all")
    assert best.points == 0.0


def test_one_stranded_block_is_one_block() -> None:
    (one,) = stranded_verdicts({"GPU": 1})
    assert one.text.startswith("1 block on GPU is stranded: held, but a block before it")


def test_a_curve_read_before_the_tiers_policy_replayed_gets_no_verdict_not_an_error() -> None:
    """Before the shadow thread's first replay the curve lacks arc: under arc the tier's
    verdicts wait (they once failed with a KeyError), under lru arc's comparison does."""
    only_lru = HitRatioCurve(
        scaled_capacities(2_000), {"lru": (0.1,) * len(scaled_capacities(2_000))}, 2_000, False
    )
    unreplayed = basis(0.05, arc_refs=0)
    (verdict,) = curve_verdicts(only_lru, "arc", unreplayed)
    assert verdict.kind == "warming_up" and "arc's simulation rests on 0 sampled" in verdict.text
    verdicts = curve_verdicts(only_lru, "lru", unreplayed)
    assert kinds(verdicts) == ["capacity", "capacity", "warming_up"]
    assert "arc's simulation is behind (0 of 5,000" in verdicts[-1].text


def test_shadows_that_shed_every_frame_leave_the_stack_its_verdicts() -> None:
    """A shadow queue that sheds every frame never builds the shadow tiers: arc counted as
    0 sampled references, and the lru tier's own verdicts waited for it forever."""
    only_lru = HitRatioCurve(
        scaled_capacities(2_000), {"lru": (0.1,) * len(scaled_capacities(2_000))}, 2_000, False
    )
    stack = Simulation(0.05, 5_000, 5_000, 0, 10**6, True)
    never_built = Simulation(0.05, 0, 0, 5_000, 0, False)
    shed = CurveBasis({"lru": stack, "arc": never_built}, POLICIES, 0.05, 5_000)
    verdicts = curve_verdicts(only_lru, "lru", shed)
    assert kinds(verdicts) == ["capacity", "capacity", "shed"]
    assert verdicts[-1].policy == "arc" and verdicts[-1].share == 1.0
    (own,) = curve_verdicts(only_lru, "arc", shed)
    assert own.kind == "shed"


def test_a_tier_the_stream_has_not_filled_is_judged_at_its_simulations_own_size() -> None:
    """2,015 blocks at 0.05 are 100.75 sampled blocks: the stack's tier holds 100 (a
    distance fits when d <= 100.75), a shadow tier 101. With 100 blocks touched the shadow
    tier was taken for full, from the stack's rounding, and compared."""
    curve = curve_around(2_015, 0.30, 0.25)
    verdicts = curve_verdicts(curve, "lru", basis(0.05, refs=150, touched=100))
    assert kinds(verdicts)[-1] == "warming_up" and "the 101 it holds" in verdicts[-1].text
    assert kinds(verdicts)[:2] == ["capacity", "capacity"], "the stack's 100 are full"


def with_prefix_counts(base: CurveBasis, checked: int, changed: int) -> CurveBasis:
    """``base`` with its stack's prefix check at ``checked`` references, ``changed`` of them."""
    stack = replace(base.simulations["lru"], prefix_checked=checked, prefix_broken=changed)
    return replace(base, simulations={**base.simulations, "lru": stack})


def test_a_sample_whose_blocks_change_predecessor_says_the_curve_does_not_predict_the_tier() -> (
    None
):
    curve = curve_around(2_000, 0.3, 0.35)
    (verdict,) = curve_verdicts(curve, "arc", with_prefix_counts(basis(0.05), 400, 100))
    assert verdict.kind == "unchained" and verdict.policy == "lru" and verdict.share == 0.25
    assert "100 of 400 sampled blocks met again (25%)" in verdict.text
    assert "no verdict on the tier's size or policy" in verdict.text


def test_on_an_unchained_stream_the_optimum_is_withheld_with_the_curves_verdicts() -> None:
    """The window's replays count prefix hits on the sample as the curve does: on a stream
    whose blocks change predecessor, its efficiency is off by what the sample cannot measure."""
    result = window("lru", 2_000, 500, 400)
    for checked, changed, kept in [(400, 100, False), (400, 0, True), (400, 3, True)]:
        counted = with_prefix_counts(basis(0.05), checked, changed)
        assert kinds(optimum_verdict(result, "lru", 2_000, 0.05, counted)) == (
            ["optimum"] if kept else []
        )
        assert (window_efficiency(result, "lru", 2_000, counted) is not None) == kept
    unchained = with_prefix_counts(basis(0.05), 400, 100)
    (verdict,) = curve_verdicts(curve_around(2_000, 0.3, 0.3), "lru", unchained)
    assert "nor on its distance to the optimum" in verdict.text


@pytest.mark.parametrize(
    ("rate", "checked", "changed"),
    [
        (0.05, 400, 0),  # a chained stream
        (0.05, 400, 3),  # under the point the curve resolves
        (0.05, 99, 99),  # too few checked to tell
        (1.0, 400, 400),  # every block replayed: the stack follows every prefix
    ],
)
def test_no_unchained_verdict_where_the_check_cannot_or_need_not_say_it(
    rate: float, checked: int, changed: int
) -> None:
    curve = curve_around(2_000, 0.3, 0.35, exact=rate == 1.0)
    verdicts = curve_verdicts(curve, "lru", with_prefix_counts(basis(rate), checked, changed))
    assert "unchained" not in kinds(verdicts) and "capacity" in kinds(verdicts)
