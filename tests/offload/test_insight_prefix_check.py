"""The sample's check of its prefix-hit premise, and the curve it guards."""

from __future__ import annotations

import pytest

from app.state.insight_verdicts import HALVING
from bench.tooling.trace_gen import generate, random_profile
from offload.insight.estimator import CurveEstimator
from offload.insight.prefix_check import PrefixCheck
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.insight.stack_distance import LRUStackCurve
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


def test_a_less_recent_predecessor_within_reach_is_no_break() -> None:
    """A document (3) behind a system prompt (2) used one request before the document was:
    2 is less recent than 3, but two other sampled references came since, so a tier of
    three sampled blocks holds both (LRU's order puts 3's request, head newest, above
    2), and hits 3 behind 2 as the sample counts it. Of two, it holds 3 and not 2: a
    break there."""
    trace = [[2], [1, 3], [2, 3]]
    counts: dict[int, tuple[int, int]] = {}
    for reach in (0, 2, 3, 10):
        check = PrefixCheck(100, reach)
        check.add_many(trace)
        counts[reach] = (check.checked, check.broken)
    assert counts == {0: (1, 1), 2: (1, 1), 3: (1, 0), 10: (1, 0)}
    stack = LRUStackCurve([2, 3])
    stack.add_many(trace[:2])
    before = stack.hits
    stack.add_many(trace[2:])
    assert [after - hit for after, hit in zip(stack.hits, before, strict=True)] == [0, 2]


def test_a_predecessor_never_used_is_a_break_however_far_the_reach() -> None:
    check = PrefixCheck(100, 1_000)
    check.add_many([[1, 3], [4, 3]])
    assert (check.checked, check.broken) == (1, 1)
    with pytest.raises(ValueError, match="reach"):
        PrefixCheck(100, -1)


def test_the_check_holds_no_more_than_its_bound_plus_a_request() -> None:
    check = PrefixCheck(4)
    check.add_many([[1, 2, 3, 4, 5], [6, 7, 8], [1, 2]])
    assert check.held_blocks <= 4 + 2
    with pytest.raises(ValueError):
        PrefixCheck(0)


def sampled(
    trace: list[list[int]], policy: str, rate: float = RATE, current: int = CURRENT
) -> CurveEstimator:
    """The estimator the sidecar runs: its check speaks for tiers from half the tier up."""
    sampler = SpatialSampler(rate)
    estimator = CurveEstimator(current, rate, [policy], checked_from=HALVING)
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


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_new_prefix_still_inside_the_tier_is_no_break(policy: str) -> None:
    """trace_gen's random mix of seed 3: documents behind system prompts used a few requests
    before them, less recent but inside the tier, which the curve counts right (within a
    point of full replays at half, one and two tiers). Counted against any less recent
    predecessor, 7.9% of the sampled blocks met again broke the premise, eight times the
    sidecar's threshold; counted against the tier's half, under one in a hundred does."""
    trace = list(generate(random_profile(3), 1_500, 3))
    current = 6_000
    estimator = sampled(trace, policy, DEFAULT_RATE, current)
    assert estimator.prefix_check is not None
    assert estimator.prefix_check.checked >= 500
    assert estimator.prefix_check.broken < 0.01 * estimator.prefix_check.checked
    curve = estimator.curve()
    for blocks in (current // 2, current, 2 * current):
        replayed = replay_point(trace, policy, blocks).hit_ratio
        assert abs(curve.at(policy, blocks) - replayed) < 0.01, blocks


def test_the_check_speaks_for_the_tiers_it_is_given() -> None:
    """Its reach is the sampled blocks the smallest such tier holds, at the scale of the
    tiers it runs beside: the stack floors a tier's share, the shadow tiers round it."""
    stacked = CurveEstimator(1_014, RATE, ["lru"], checked_from=HALVING).prefix_check
    shadows = CurveEstimator(1_014, RATE, ["arc"], checked_from=HALVING).prefix_check
    whole_curve = CurveEstimator(1_014, RATE, ["lru"]).prefix_check
    assert stacked is not None and shadows is not None and whole_curve is not None
    # Half of 1,014 is 507 blocks, 50.7 at the rate; an eighth 127, 12.7.
    assert (stacked.reach, shadows.reach, whole_curve.reach) == (50, 51, 12)
    for wrong in (0.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="checked_from"):
            CurveEstimator(CURRENT, RATE, ["lru"], checked_from=wrong)


def test_the_check_holds_as_many_blocks_as_the_largest_simulated_tier() -> None:
    for policies in (["lru"], ["arc"], ["lru", "arc"]):
        estimator = CurveEstimator(CURRENT, RATE, policies)
        assert estimator.prefix_check is not None
        assert estimator.prefix_check.max_blocks == 800, "8x a tier of 1,000 at rate 0.1"
    assert CurveEstimator(CURRENT, RATE, ["arc"], check_prefixes=False).prefix_check is None
