"""The sample's check of its prefix-hit premise, and the curve it guards."""

from __future__ import annotations

import pytest

from offload.insight.estimator import CurveEstimator
from offload.insight.prefix_check import PrefixCheck
from offload.insight.sampling import SpatialSampler
from offload.insight.sweep import replay_point
from tests.support.traces import conversations, unchained

CURRENT = 1000
RATE = 0.1


def test_a_block_behind_the_same_predecessor_is_checked_and_unchanged() -> None:
    check = PrefixCheck(100)
    check.add_many([[1, 2, 3], [1, 2, 3, 4], [2, 3]])
    # 2 and 3 met again behind 1 and 2; a request's first sampled block has no predecessor.
    assert (check.checked, check.broken) == (3, 0)


def test_a_block_behind_another_less_recent_predecessor_breaks_the_chain() -> None:
    check = PrefixCheck(100)
    # 3 behind 4, never seen; behind 4 again; behind 2, last used before 3 was.
    check.add_many([[1, 2, 3], [4, 3], [4, 3], [2, 3]])
    assert (check.checked, check.broken) == (3, 2)
    assert check.broken / check.checked == pytest.approx(2 / 3)


def test_a_block_behind_another_more_recent_predecessor_is_no_break() -> None:
    """A document behind a hot system prompt: wherever the tier holds the block it holds the
    new predecessor, used since (alone, or at the head of the block's last request)."""
    check = PrefixCheck(100)
    check.add_many([[1, 3], [2], [2, 3], [4, 2, 3], [4, 3]])
    assert (check.checked, check.broken) == (3, 0)
    check.add_many([[7], [1, 3]])  # 1 last used before 3 was: a break
    assert (check.checked, check.broken) == (4, 1)


def test_the_check_holds_no_more_than_its_bound_plus_a_request() -> None:
    check = PrefixCheck(4)
    check.add_many([[1, 2, 3, 4, 5], [6, 7, 8], [1, 2]])
    assert check.held_blocks <= 4 + 2
    with pytest.raises(ValueError):
        PrefixCheck(0)


def sampled(trace: list[list[int]], policy: str) -> CurveEstimator:
    sampler = SpatialSampler(RATE)
    estimator = CurveEstimator(CURRENT, RATE, [policy])
    for request in trace:
        estimator.record(sampler.sample(request), len(request))
    return estimator


@pytest.fixture(scope="module")
def chained() -> list[list[int]]:
    return conversations(3000, 500)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_chained_trace_never_changes_a_predecessor(chained, policy: str) -> None:
    estimator = sampled(chained, policy)
    assert estimator.prefix_check is not None
    assert estimator.prefix_check.checked >= 100
    assert estimator.prefix_check.broken == 0


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_on_an_unchained_trace_the_curve_reads_above_the_tier_and_the_check_tells(
    chained, policy: str
) -> None:
    """The same references with each request's ids shuffled: a sampled block resident from
    another request counts as hit behind unsampled blocks the tier's lookup stopped at. The
    check ran beside the LRU stack only, so an estimator of shadow tiers alone, whose curve
    reads as far above, never told."""
    trace = unchained(chained)
    estimator = sampled(trace, policy)
    measured = replay_point(trace, policy, CURRENT).hit_ratio
    assert estimator.curve().at(policy, CURRENT) > measured + 0.1
    assert estimator.prefix_check is not None
    # A tenth, where the sidecar's unchained verdict needs a hundredth.
    assert estimator.prefix_check.broken > 0.1 * estimator.prefix_check.checked


def test_the_check_holds_as_many_blocks_as_the_largest_simulated_tier() -> None:
    for policies in (["lru"], ["arc"], ["lru", "arc"]):
        estimator = CurveEstimator(CURRENT, RATE, policies)
        assert estimator.prefix_check is not None
        assert estimator.prefix_check.max_blocks == 800, "8x a tier of 1,000 at rate 0.1"
    assert CurveEstimator(CURRENT, RATE, ["arc"], check_prefixes=False).prefix_check is None
