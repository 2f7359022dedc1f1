"""The curve from a sampled stream, against the exact sweep of the bundled trace."""

from __future__ import annotations

import pytest

from offload.cpu.policies.registry import policy_names
from offload.insight.curve import HitRatioCurve, scaled_capacities
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.insight.stack_distance import LRUStackCurve
from offload.insight.sweep import sweep, sweep_curve
from offload.sim.mooncake import bundled_trace_path, load_trace

CURRENT = 2000
TARGET = 0.02  # two points of hit ratio
SCALE_FREE = ["lru", "arc"]
"""Policies whose every size is proportional to the capacity, so a scaled shadow stands
for them (estimator.py); a registered policy with sizes of its own is measured, not held."""


@pytest.fixture(scope="module")
def requests() -> list[list[int]]:
    """Half the bundled trace: the tier sizes of the real one, in a few seconds."""
    return load_trace(bundled_trace_path())[:6000]


@pytest.fixture(scope="module")
def exact(requests: list[list[int]]) -> HitRatioCurve:
    return sweep_curve(sweep(requests, policy_names(), scaled_capacities(CURRENT)))


def estimate(requests: list[list[int]], rate: float, seed: int = 0) -> CurveEstimator:
    sampler = SpatialSampler(rate, seed)
    estimator = CurveEstimator(CURRENT, rate)
    for request in requests:
        estimator.record(sampler.sample(request), len(request))
    return estimator


@pytest.mark.parametrize("seed", [0, 1])
def test_the_sampled_curve_is_within_two_points_of_the_exact_sweep(
    requests: list[list[int]], exact: HitRatioCurve, seed: int
) -> None:
    curve = estimate(requests, DEFAULT_RATE, seed).curve()
    assert curve.capacities == exact.capacities and curve.current == CURRENT
    assert not curve.exact
    for policy in SCALE_FREE:
        for capacity, guess, truth in zip(
            curve.capacities, curve.hit_ratios[policy], exact.hit_ratios[policy], strict=True
        ):
            assert abs(guess - truth) <= TARGET, (policy, capacity, guess, truth)


def test_at_rate_one_the_shadows_are_the_sweep_and_lru_is_the_stack(
    requests: list[list[int]], exact: HitRatioCurve
) -> None:
    curve = estimate(requests[:1500], 1.0).curve()
    short = sweep_curve(sweep(requests[:1500], policy_names(), scaled_capacities(CURRENT)))
    assert curve.exact
    for policy in policy_names():
        if policy != "lru":
            assert curve.hit_ratios[policy] == short.hit_ratios[policy], policy
    stack = LRUStackCurve(list(scaled_capacities(CURRENT)))
    stack.add_many(requests[:1500])
    refs = sum(map(len, requests[:1500]))
    assert curve.hit_ratios["lru"] == tuple(h / refs for h in stack.hits)


def test_memory_stays_within_its_stated_bound(requests: list[list[int]]) -> None:
    estimator = estimate(requests[:2000], 0.5)
    assert 0 < estimator.held_blocks <= estimator.max_held_blocks
    # the stack: half of 16,000 blocks; each policy's shadows: half of every capacity
    assert estimator.max_held_blocks == 8000 + (len(policy_names()) - 1) * sum(
        round(0.5 * c) for c in scaled_capacities(CURRENT)
    )


def test_an_unsampled_hot_block_is_put_back_as_hits() -> None:
    """Every request starts at block 7; left out of the sample, it is still counted."""
    requests = [[7, 1000 + i] for i in range(400)]
    sampler = next(s for s in map(lambda seed: SpatialSampler(0.5, seed), range(64))
                   if not s.is_sampled(7))  # fmt: skip
    estimator = CurveEstimator(4, 0.5, ["lru"])
    for request in requests:
        estimator.record(sampler.sample(request), len(request))
    ratio = estimator.curve().at("lru", 4)
    assert ratio == pytest.approx(399 / 800, abs=0.05)  # block 7 hits 399 times of 800 refs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"current": 0}, "current capacity must be a whole number"),
     ({"current": 10, "rate": 0.0}, "sampling rate must be in"),
     ({"current": 10, "policies": ["lru", "mru"]}, "unknown cache policy 'mru'")],
)  # fmt: skip
def test_bad_settings_are_refused_by_name(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CurveEstimator(**kwargs)  # type: ignore[arg-type]


def test_a_request_with_more_sampled_blocks_than_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="a request of 1 blocks cannot have 2 sampled"):
        CurveEstimator(10).record([1, 2], 1)
