"""The error a sampled curve states for itself: none where nothing is sampled out, more
where the scaled tier is small or the curve steep, and wide enough to cover what a small
tier of a generated trace actually errs by."""

from __future__ import annotations

import pytest

from bench.tooling.trace_gen import PROFILES, generate
from offload.insight.curve import scaled_capacities
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.insight.sweep import sweep, sweep_curve
from offload.insight.uncertainty import capacity_errors, difference_error, point_errors

CAPACITIES = (100, 200, 400, 800)
ONE_STANDARD_ERROR = 0.68
"""The share of a normal error within one standard error of it: what a stated standard
error must cover at least."""


def test_at_rate_one_every_point_is_exact() -> None:
    ratios = (0.1, 0.3, 0.5, 0.6)
    assert point_errors(ratios, CAPACITIES, list(CAPACITIES), 1.0, 10_000) == (0.0,) * 4
    assert difference_error(0.2, 0.0, 0.0, 1.0, 10_000) == 0.0


def test_a_smaller_scaled_tier_on_a_steeper_curve_errs_more() -> None:
    """The tier's sampled share wanders by about 1/sqrt(held) of itself, read through the
    curve's slope: a flat curve loses nothing to it, a steep one at few blocks the most."""
    steep, flat = (0.1, 0.3, 0.5, 0.7), (0.5, 0.5, 0.5, 0.5)
    few, many = [5, 10, 20, 40], [500, 1_000, 2_000, 4_000]
    assert capacity_errors(flat, CAPACITIES, few, 0.05) == (0.0,) * 4
    small, large = (capacity_errors(steep, CAPACITIES, held, 0.05) for held in (few, many))
    assert all(s > 3 * g > 0 for s, g in zip(small, large, strict=True))


def test_more_references_shrink_the_error_of_the_misses() -> None:
    ratios = (0.5,) * 4
    short, long = (point_errors(ratios, CAPACITIES, [50] * 4, 0.05, r) for r in (500, 50_000))
    assert all(s > g > 0 for s, g in zip(short, long, strict=True))


def test_a_difference_counts_only_the_references_its_points_count_differently() -> None:
    """Two points of one sample share its drawn blocks: equal points have only their
    capacity errors, not both points' misses."""
    assert difference_error(0.0, 0.003, 0.004, 0.05, 1_000) == pytest.approx(0.005)
    assert difference_error(0.1, 0.0, 0.0, 0.05, 1_000) > difference_error(
        0.01, 0.0, 0.0, 0.05, 1_000
    )


@pytest.mark.parametrize("profile", ["repeat", "chat"])
def test_the_stated_error_covers_what_a_small_tier_errs_by(profile: str) -> None:
    """A tier of 1/32 of a generated trace's distinct blocks holds a few dozen sampled
    blocks at the default rate: eight samplers put its points up to several points off the
    full replay, past the curve's usual 1-point resolution, and the error each states
    covers it at least as often as a standard error should, and is wider than a point
    where the error was."""
    requests = list(generate(PROFILES[profile], 1_500, 13))
    current = len({block for request in requests for block in request}) // 32
    capacities = scaled_capacities(current)
    exact = sweep_curve(sweep(requests, ["lru", "arc"], capacities))
    covered, points, past_a_point = 0, 0, []
    for seed in range(8):
        sampler = SpatialSampler(DEFAULT_RATE, seed)
        estimator = CurveEstimator(current, DEFAULT_RATE, ["lru", "arc"])
        for request in requests:
            estimator.record(sampler.sample(request), len(request))
        curve = estimator.curve()
        for policy, errors in estimator.errors(curve).items():
            for index, capacity in enumerate(capacities):
                if DEFAULT_RATE * capacity < 16:  # no verdict rests on it
                    continue
                off = abs(curve.hit_ratios[policy][index] - exact.hit_ratios[policy][index])
                points += 1
                covered += off <= errors[index]
                if off > 0.01:
                    past_a_point.append(errors[index])
    assert past_a_point, "the small tier erred by no more than a point: nothing to cover"
    assert covered >= ONE_STANDARD_ERROR * points
    assert sum(error > 0.01 for error in past_a_point) >= ONE_STANDARD_ERROR * len(past_a_point)
