"""The error a sampled curve states for itself: none where nothing is sampled out, more
where the scaled tier is small or the curve steep, and wide enough to cover what a small
tier of a generated trace actually errs by."""

from __future__ import annotations

import pytest

from bench.tooling.trace_gen import PROFILES, generate
from offload.cpu.manager import CPUOffloadingManager
from offload.insight.curve import scaled_capacities
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.insight.sweep import sweep, sweep_curve
from offload.insight.uncertainty import (
    capacity_errors,
    difference_error,
    point_errors,
    quotient_error,
)
from offload.insight.window_optimum import WindowOptimum
from offload.sim.optimum import offline_hits
from offload.sim.workload import run_workload

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


def test_a_quotient_of_two_replays_counts_only_the_blocks_they_miss_differently() -> None:
    """The window's tier over its optimum: blocks both miss alike (at a quotient of 1) add
    nothing; a hot block one of them misses adds its square, not its count; none at rate 1."""
    alike = {"a": 3, "b": 1}
    assert quotient_error(alike, alike, 1.0, 0.05, 100.0) == 0.0
    assert quotient_error({"a": 5}, {}, 0.9, 1.0, 100.0) == 0.0
    hot, spread = {"a": 5}, {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
    assert quotient_error(hot, {}, 0.9, 0.05, 100.0) == pytest.approx(0.95**0.5 * 5 / 100)
    assert quotient_error(hot, {}, 0.9, 0.05, 100.0) > quotient_error(spread, {}, 0.9, 0.05, 100.0)


def test_the_window_efficiencys_error_covers_what_a_small_tier_errs_by() -> None:
    """A tier of 1/32 of a generated trace's distinct blocks: eight samplers' windows read
    the tier's share of the optimum's hits off the full replay of the same requests by
    points, and the error each states covers it at least as often as a standard error
    should."""
    requests = list(generate(PROFILES["chat"], 1_500, 13))
    capacity = len({block for request in requests for block in request}) // 32
    covered, windows, past_a_point = 0, 0, 0
    for policy in ("lru", "arc"):
        for seed in range(8):
            sampler = SpatialSampler(DEFAULT_RATE, seed)
            window = WindowOptimum(capacity, DEFAULT_RATE, policy)
            first_sampled = []
            for index, request in enumerate(requests):
                sampled = sampler.sample(request)
                if sampled:
                    first_sampled.append(index)
                window.record([sampled], [len(request)])
            taken, block_refs = window.take()
            result = window.compute(taken, block_refs)
            assert result.efficiency is not None and result.efficiency_error is not None
            full = requests[first_sampled[-len(taken)] :]
            assert sum(map(len, full)) == block_refs
            tier = run_workload(CPUOffloadingManager(1, capacity, policy), full).hits
            off = abs(result.efficiency - tier / offline_hits(full, capacity))
            windows += 1
            covered += off <= result.efficiency_error
            past_a_point += off > 0.01
    assert past_a_point, "no window erred by more than a point: nothing to cover"
    assert covered >= ONE_STANDARD_ERROR * windows


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
