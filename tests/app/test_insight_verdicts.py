"""Which verdicts a curve can bear: each rule here once let a false sentence through on a
workload the bundled trace does not have (a tiny tier, a policy the curve does not
simulate, a tier not yet full, a lagging shadow, no reachable hit at all)."""

from __future__ import annotations

import pytest

from app.state.insight_verdicts import (
    MIN_SCALED_BLOCKS,
    CurveBasis,
    Verdict,
    admission_verdict,
    curve_verdicts,
    optimum_verdict,
    stranded_verdicts,
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


def basis(rate: float, *, refs: int = 5_000, arc_refs: int | None = None, touched: int = 10**6):
    simulated = {"lru": refs, "arc": refs if arc_refs is None else arc_refs}
    return CurveBasis(rate, simulated, touched, POLICIES)


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
    would not change" is true of the past and says nothing of the tier."""
    (verdict,) = curve_verdicts(curve_around(2_000, 0.3, 0.3), "lru", basis(0.05, touched=99))
    assert verdict.kind == "warming_up" and "99 distinct sampled blocks" in verdict.text
    full = curve_verdicts(curve_around(2_000, 0.3, 0.3), "lru", basis(0.05, touched=100))
    assert "capacity" in kinds(full)


def test_a_policy_whose_simulation_lags_is_not_compared_until_it_catches_up() -> None:
    curve = curve_around(2_000, 0.30, 0.25)
    behind = curve_verdicts(curve, "lru", basis(0.05, refs=1_108, arc_refs=801))
    assert "policy" not in kinds(behind)
    (lag,) = [v for v in behind if v.kind == "warming_up"]
    assert "arc's simulation is behind (801 of 1,108" in lag.text
    caught_up = curve_verdicts(curve, "lru", basis(0.05, refs=1_108, arc_refs=1_000))
    (policy,) = [v for v in caught_up if v.kind == "policy"]
    assert policy.points == pytest.approx(-5.0)


@pytest.mark.parametrize(("exact", "said"), [(False, "by less than 1 point"), (True, "~0.7")])
def test_a_change_below_what_the_curve_resolves_is_said_as_such(exact: bool, said: str) -> None:
    curve = curve_around(2_000, 0.300, 0.300, exact=exact)
    ratios = dict(curve.hit_ratios)
    lru = list(ratios["lru"])
    lru[curve.capacities.index(4_000)] = 0.307
    curve = HitRatioCurve(curve.capacities, {**ratios, "lru": tuple(lru)}, 2_000, exact)
    (doubling,) = [v for v in curve_verdicts(curve, "lru", basis(0.05)) if v.multiple == 2.0]
    assert said in doubling.text and doubling.points == pytest.approx(0.7)


def window(policy: str, capacity: int, optimum_hits: int, tier_hits: int) -> WindowResult:
    return WindowResult(policy, capacity, 0.05, 2_000, 40_000, optimum_hits, tier_hits, 0.1)


def test_the_optimum_verdict_speaks_only_of_the_tiers_own_policy_on_enough_blocks() -> None:
    assert kinds(optimum_verdict(window("arc", 100, 500, 400), "arc")) == ["optimum"]
    assert optimum_verdict(window("lru", 100, 500, 400), "gated") == [], "lru stood in for it"
    (small,) = optimum_verdict(window("lru", 1, 500, 400), "lru")
    assert small.kind == "sample_small" and small.blocks == 20
    assert optimum_verdict(window("lru", 100, 0, 0), "lru") == [], "no reachable hit"


def test_admission_is_said_to_save_writes_and_to_win_hits_only_where_there_are_some() -> None:
    (plain,) = admission_verdict(0.96, None)
    assert plain.text == (
        "96% of stores are never read before they leave: admission control would save those writes"
    )
    (at_optimum,) = admission_verdict(0.96, 0.99)
    assert "already gets 99% of the optimum's hits" in at_optimum.text
    assert admission_verdict(0.05, None) == []


def test_one_stranded_block_is_one_block() -> None:
    (one,) = stranded_verdicts({"GPU": 1})
    assert one.text.startswith("1 block on GPU is stranded: held, but a block before it")


def test_a_curve_read_before_the_tiers_policy_replayed_gets_no_verdict_not_an_error() -> None:
    """The curve and its basis are read one after the other: the shadow thread's first
    replay in between once made the API fail with a KeyError."""
    only_lru = HitRatioCurve(
        scaled_capacities(2_000), {"lru": (0.1,) * len(scaled_capacities(2_000))}, 2_000, False
    )
    (verdict,) = curve_verdicts(only_lru, "arc", basis(0.05))
    assert verdict.kind == "warming_up"
