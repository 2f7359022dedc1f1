"""The sidecar's curve at the edges, against brute force: every capacity replayed afresh.

Workloads the bundled trace never has (every request new, every request the
same, one block each), tiers of 1 and 3 blocks, rate 1 and a rate the small
tiers cannot resolve: frames go in as a worker sends them (its SampleBuffer
and SpatialSampler), and each point of the served curve must equal what this
file computes on its own from the same sampled requests, a fresh tier per
capacity: ``arc`` a fresh manager, ``lru`` a plain OrderedDict in the order
the stack models (a request's use recorded when it ends, its head newest),
both at the capacity scaled by the rate, then corrected for the sample's size
(SHARDS-adj). Every figure the API gives must be finite, and every verdict's
figure the curve's.
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from collections.abc import Sequence

import pytest

from app.api.insight_schemas import PublisherInsightInfo
from app.settings import InsightConfig, MiB, PublisherEndpoints
from app.state.insight import (
    PREFIX_CHECK_BYTES_PER_BLOCK,
    STACK_SHARE,
    WINDOW_SHARE,
    InsightState,
    PublisherInsight,
)
from app.state.publisher import CONNECTED_WITHIN_S, PublisherState
from offload.cpu.manager import CPUOffloadingManager
from offload.insight.curve import scaled_capacities
from offload.insight.estimator import scaled_tiers
from offload.insight.sampling import SpatialSampler
from offload.insight.shadow import max_bytes
from offload.sim.workload import run_request, run_workload
from offload.wire.sample_buffer import SampleBuffer
from offload.wire.sample_frame import decode_sample_frame, encode_sample_frame
from offload.wire.stats_frame import StatsFrame, WorkerConfig

REQUESTS = 400
PER_FRAME = 50
LAST_FRAME_AT = 1_000_000.0
"""When the publisher's last frame came, by the sidecar's clock (the API is read after it)."""

WORKLOADS = {
    "every request new": [[8 * r + b for b in range(1 + r % 8)] for r in range(REQUESTS)],
    "every request the same": [list(range(100, 112))] * REQUESTS,
    "one block each": [[r % 7] for r in range(REQUESTS)],
    "chains": [[1_000 * (r % 5) + b for b in range(3 + r % 11)] for r in range(REQUESTS)],
}


def lru_hits(requests: Sequence[Sequence[int]], capacity: int) -> int:
    """Prefix hits of an LRU of ``capacity`` blocks that records a request's use when it ends
    (the whole prompt most recent, its head newest)."""
    held: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for request in requests:
        for block in request:
            if block not in held:
                break
            hits += 1
        for block in reversed(list(dict.fromkeys(request))):
            held.pop(block, None)
            held[block] = None
        while len(held) > capacity:
            held.popitem(last=False)
    return hits


def arc_hits(requests: Sequence[Sequence[int]], capacity: int) -> int:
    manager = CPUOffloadingManager(1, capacity, "arc")
    return sum(run_request(manager, request) for request in requests)


def corrected(hits: int, sampled_refs: int, block_refs: int, rate: float) -> float:
    """SHARDS-adj: the sample's shortfall against ``rate`` x the block references, as hits."""
    expected = rate * block_refs
    return min(1.0, max(0.0, (hits + expected - sampled_refs) / expected))


def fed(
    requests: list[list[int]], capacity: int, rate: float, config: InsightConfig | None = None
) -> PublisherInsight:
    """A publisher's insight after a worker's frames for ``requests``, the shadows caught up."""
    state = InsightState(config)
    insight = state.new_publisher()
    feed(state, insight, requests, capacity, rate)
    return insight


def feed(
    state: InsightState,
    insight: PublisherInsight,
    requests: list[list[int]],
    capacity: int,
    rate: float,
    policy: str = "lru",
    first_seq: int = 0,
) -> None:
    """A worker's frames for ``requests`` into ``insight``, numbered from ``first_seq``, each
    run through the shadow tiers before the next arrives."""
    buffer = SampleBuffer(SpatialSampler(rate))
    config = WorkerConfig(policy=policy, capacity_blocks=capacity, block_size=16)
    for seq, start in enumerate(range(0, len(requests), PER_FRAME), start=first_seq):
        for request in requests[start : start + PER_FRAME]:
            buffer.add(request)
        frame = buffer.take("e0", 0, config)
        assert frame is not None
        insight.receive(seq, decode_sample_frame(encode_sample_frame(frame)))
        while (work := state.queue.get(0)) is not None:
            work.apply(lambda: None)
            state.queue.finished()


def served(
    insight: PublisherInsight, silent_s: float = 0.0, stats: StatsFrame | None = None
) -> dict:
    """The publisher's body of GET /api/v1/insight, as JSON, ``silent_s`` after its last
    frame, with ``stats`` its latest stats frame."""
    publisher = PublisherState(PublisherEndpoints("tcp://127.0.0.1:1"))
    publisher.insight = insight
    publisher.stats = stats
    publisher.last_frame_at = LAST_FRAME_AT
    info = PublisherInsightInfo.of(publisher, {}, 64 << 20, LAST_FRAME_AT + silent_s)
    # Checked before JSON, which writes a NaN or an infinity as null without a word.
    assert all(math.isfinite(f) for f in floats(info.model_dump()))
    return json.loads(info.model_dump_json())


def floats(value: object) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [f for item in value.values() for f in floats(item)]
    if isinstance(value, list):
        return [f for item in value for f in floats(item)]
    return []


@pytest.mark.parametrize("rate", [1.0, 0.25])
@pytest.mark.parametrize("capacity", [1, 3, 40])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_each_point_is_a_fresh_replay_of_the_sample_at_that_capacity(
    workload: str, capacity: int, rate: float
) -> None:
    requests = WORKLOADS[workload]
    insight = fed(requests, capacity, rate)
    curve = insight.reading().curve
    assert curve is not None and curve.current == capacity
    assert curve.exact is (rate == 1.0)
    sampler = SpatialSampler(rate)
    sample = [sampler.sample(request) for request in requests]
    sampled_refs, block_refs = sum(map(len, sample)), sum(map(len, requests))
    for index, c in enumerate(curve.capacities):
        # The stack holds what fits under rate x c (a distance d fits when d <= rate * c);
        # a shadow tier is whole blocks, at least one.
        lru = lru_hits(sample, math.floor(rate * c))
        arc = arc_hits(sample, max(1, round(rate * c)))
        assert curve.hit_ratios["lru"][index] == pytest.approx(
            corrected(lru, sampled_refs, block_refs, rate), abs=1e-12
        ), ("lru", c)
        assert curve.hit_ratios["arc"][index] == pytest.approx(
            corrected(arc, sampled_refs, block_refs, rate), abs=1e-12
        ), ("arc", c)


@pytest.mark.parametrize("change", ["restart", "policy"])
def test_after_a_restart_or_a_new_policy_the_curve_is_the_new_streams_alone(change: str) -> None:
    """The old stream's blocks must be in no simulation of the new one: each point is a
    fresh replay of the requests since the change, and the optimum's window holds only
    them (the same 12 blocks over and over: from empty, each missed once)."""
    state = InsightState()
    insight = state.new_publisher()
    old, new = WORKLOADS["chains"], WORKLOADS["every request the same"]
    feed(state, insight, old, 40, 1.0)
    frames = insight.frames
    if change == "restart":  # the sequence goes back: a restarted worker
        feed(state, insight, new, 40, 1.0, first_seq=0)
    else:  # the sequence goes on, the worker reports another policy
        feed(state, insight, new, 40, 1.0, policy="arc", first_seq=frames)
    assert insight.resets == 1 and insight.missed_frames == 0
    reading = insight.reading()
    curve = reading.curve
    assert curve is not None and curve.exact and reading.optimum is not None
    window = reading.optimum.result
    assert window.policy == ("lru" if change == "restart" else "arc")
    assert window.optimum_hits == window.tier_hits == window.refs - len(new[0])
    block_refs = sum(map(len, new))
    for index, c in enumerate(curve.capacities):
        assert curve.hit_ratios["lru"][index] == lru_hits(new, c) / block_refs, c
        assert curve.hit_ratios["arc"][index] == arc_hits(new, c) / block_refs, c


@pytest.mark.parametrize("rate", [1.0, 0.25])
@pytest.mark.parametrize("capacity", [1, 3, 5, 40])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_the_api_gives_finite_figures_and_verdicts_that_quote_the_curve(
    workload: str, capacity: int, rate: float
) -> None:
    body = served(fed(WORKLOADS[workload], capacity, rate))  # every figure finite
    curve = body["curve"]
    assert curve is not None
    assert all(0.0 <= r <= 1.0 for ratios in curve["hit_ratios"].values() for r in ratios)
    at = {
        policy: dict(zip(curve["capacities"], ratios, strict=True))
        for policy, ratios in curve["hit_ratios"].items()
    }
    multiples = dict(zip(curve["capacities"], curve["multiples"], strict=True))
    resolved = {
        policy: dict(zip(curve["capacities"], flags, strict=True))
        for policy, flags in curve["resolved"].items()
    }
    expected = {c: rate == 1.0 or rate * c >= 16 for c in curve["capacities"]}
    # The stack cannot model a tier refusing a request longer than itself: no point of its
    # below the longest request it replayed is resolved (a manager's is).
    sampler = SpatialSampler(rate)
    longest = max(len(r) for r in WORKLOADS[workload] if sampler.sample(r))
    stacked = {c: expected[c] and c >= longest for c in curve["capacities"]}
    assert resolved == {"lru": stacked, "arc": expected}
    for verdict in body["verdicts"]:
        said = re.search(r"~(\d+\.\d) points", verdict["text"])
        if verdict["kind"] == "capacity":
            blocks, policy = verdict["blocks"], verdict["policy"]
            assert verdict["multiple"] == multiples[blocks]
            gain = 100 * (at[policy][blocks] - at[policy][capacity])
            assert verdict["points"] == pytest.approx(gain)
            assert resolved[policy][blocks] and resolved[policy][capacity]
        if verdict["kind"] == "policy":
            gain = 100 * (at[verdict["policy"]][capacity] - at["lru"][capacity])
            assert verdict["points"] == pytest.approx(gain)
        if said is not None:
            assert float(said.group(1)) == round(abs(verdict["points"]), 1), verdict
            assert verdict["points"] != 0.0, "a gain the curve does not show"
        if verdict["kind"] == "sample_small":
            assert rate < 1.0 and rate * verdict["blocks"] < 16


@pytest.mark.parametrize("capacity", [2, 3, 5, 8])
@pytest.mark.parametrize("workload", [*WORKLOADS, "a long prompt again and again"])
def test_on_requests_longer_than_the_tier_no_verdict_misstates_a_replay(
    workload: str, capacity: int
) -> None:
    """A tier refuses to store a request longer than itself; the LRU stack put its head on
    top at every size. On an exact curve a tier of 2 blocks under the same 40-block prompt
    (which hits nothing at 2 or 4) was told doubling would add ~5.0 points, and one of 8
    under a 12-block prompt that arc would lose ~66.5 points (both hit nothing there).
    (Where every request fits, the stack's own gap to a replay is README's, "The hit-ratio
    curve": not this test's.)"""
    requests = WORKLOADS.get(workload, [list(range(100, 140))] * REQUESTS)
    body = served(fed(requests, capacity, 1.0))

    def replayed(policy: str, c: int) -> float:
        return run_workload(CPUOffloadingManager(1, c, policy), requests).hit_ratio

    longest = max(map(len, requests))
    kinds = [verdict["kind"] for verdict in body["verdicts"]]
    assert "long_requests" in kinds or longest <= capacity // 2
    for verdict in body["verdicts"]:
        if verdict["kind"] == "capacity":
            truth = 100 * (replayed("lru", verdict["blocks"]) - replayed("lru", capacity))
        elif verdict["kind"] == "policy":
            truth = 100 * (replayed(verdict["policy"], capacity) - replayed("lru", capacity))
        else:
            continue
        # Within the stack's documented gap to a replay where every request fits.
        assert verdict["points"] == pytest.approx(truth, abs=0.5), verdict


def test_one_block_is_said_as_one_block() -> None:
    """A tier of 2 blocks halves to 1: "(to 1 blocks)" once, and "1 blocks are"."""
    requests = WORKLOADS["one block each"]
    texts = [v["text"] for v in served(fed(requests, 2, 1.0))["verdicts"]]
    assert any("halving the tier (to 1 block) " in text for text in texts), texts
    texts = [v["text"] for v in served(fed(requests, 1, 0.05))["verdicts"]]
    assert any("at a sample rate of 0.05, 1 block is 0.1 sampled" in t for t in texts), texts
    assert not any("1 blocks" in text for text in texts)


def test_an_empty_sample_serves_no_curve_and_says_why() -> None:
    """Frames that sampled nothing leave nothing to draw: the page said "Nothing to say
    yet", for good where the stream's few distinct blocks all fail the sample's test."""
    few = [b for b in range(2**40, 2**40 + 100) if not SpatialSampler(0.05).is_sampled(b)][:5]
    requests = [[few[r % len(few)]] for r in range(REQUESTS)]
    insight = fed(requests, 40, 0.05)
    assert insight.sampled_refs == 0 and insight.block_refs == REQUESTS
    body = served(insight)
    assert body["curve"] is None
    (verdict,) = body["verdicts"]
    assert verdict["kind"] == "warming_up"
    assert verdict["text"].startswith(
        f"no curve yet: none of the stream's {REQUESTS} block references has been sampled at "
        f"a rate of 0.05 (about {0.05 * REQUESTS:.1f} were expected"
    )


def test_no_curve_is_said_to_lack_a_sample_only_once_every_simulation_replayed_it() -> None:
    """Shadow tiers still behind have not sampled anything yet because they have not
    replayed anything yet: no sentence about the sample until they catch up."""
    state = InsightState(InsightConfig(policies=("arc",)))
    insight = state.new_publisher()
    buffer = SampleBuffer(SpatialSampler(1e-6))
    for r in range(REQUESTS):
        buffer.add([2**40 + r])
    frame = buffer.take("e0", 0, WorkerConfig(policy="arc", capacity_blocks=40, block_size=16))
    assert frame is not None
    insight.receive(0, decode_sample_frame(encode_sample_frame(frame)))
    assert served(insight)["verdicts"] == [], "the frame is queued for the shadows"
    while (work := state.queue.get(0)) is not None:
        work.apply(lambda: None)
    (verdict,) = served(insight)["verdicts"]
    assert verdict["text"].startswith("no curve yet: none of the stream's 400 block references")


def test_a_publisher_silent_past_the_connected_window_is_said_to_be() -> None:
    """A publisher gone (its worker, or its connection) kept its curve and verdicts in the
    present tense, as if they held for its tier now, with nothing but a timestamp to tell."""
    insight = fed(WORKLOADS["chains"], 40, 1.0)
    fresh = served(insight, CONNECTED_WITHIN_S)["verdicts"]
    assert fresh and "stale" not in [v["kind"] for v in fresh]
    first, *rest = served(insight, 3_600.0)["verdicts"]
    assert first["kind"] == "stale"
    assert first["text"].startswith("nothing has come from this publisher for 3,600 s")
    assert rest == fresh


def test_a_tier_reported_since_the_sample_was_taken_is_said_to_be_another() -> None:
    """A worker back under another policy and size sends stats frames at once, a sample frame
    only once a request comes (never, with its sampling off): the curve and verdicts of the
    old tier stood for the new one meanwhile, under the old policy's name."""
    insight = fed(WORKLOADS["chains"], 40, 1.0)
    assert insight.ts is not None
    fresh = served(insight)["verdicts"]

    def stats(ts: float, policy: str, capacity: int) -> StatsFrame:
        config = WorkerConfig(policy=policy, capacity_blocks=capacity, block_size=16)
        return StatsFrame(ts=ts, engine_id="e0", rank=0, config=config)

    assert served(insight, stats=stats(insight.ts + 1, "lru", 40))["verdicts"] == fresh
    older = stats(insight.ts - 1, "arc", 80)  # taken before the latest sample frame
    assert served(insight, stats=older)["verdicts"] == fresh
    first, *rest = served(insight, stats=stats(insight.ts + 1, "arc", 80))["verdicts"]
    assert first["kind"] == "stale" and (first["policy"], first["blocks"]) == ("arc", 80)
    assert first["text"].startswith(
        "the worker now reports its tier as arc, 80 blocks of 16 tokens, and its sample is "
        "of the tier it had (lru, 40 blocks of 16 tokens)"
    )
    assert rest == fresh


def test_each_policys_points_are_resolved_at_its_own_simulations_rate() -> None:
    """In a tight memory bound the shadows run below the stack's rate: a capacity the stack
    resolves can be too few sampled blocks for arc, and the curve said neither."""
    insight = fed(WORKLOADS["every request new"], 1_000, 0.1, InsightConfig(max_bytes=MiB))
    rates = insight.rates
    assert rates.stack is not None and rates.shadows is not None
    assert rates.shadows < rates.stack
    curve = served(insight)["curve"]
    for policy, rate in (("lru", rates.stack), ("arc", rates.shadows)):
        assert curve["resolved"][policy] == [rate * c >= 16 for c in curve["capacities"]]
    assert curve["resolved"]["lru"] != curve["resolved"]["arc"]


def test_the_shadows_rate_is_the_highest_whose_tiers_fit_their_share_of_the_bound() -> None:
    """gated's bound is no straight line (its models stop growing past 511 slots), so the
    rate is searched: at it the shadow tiers (the largest two past 511 slots here) fit their
    share of the bound, and any higher rate gives the largest more slots than fit."""
    config = InsightConfig(max_bytes=256 * MiB, policies=("lru", "gated"))
    insight = fed(WORKLOADS["every request new"], 100_000, 0.05, config)
    rate = insight.rates.shadows
    assert rate is not None and rate < 0.05
    room = config.max_bytes * (1 - WINDOW_SHARE) * (1 - STACK_SHARE)
    capacities = scaled_capacities(100_000)

    def held(at: float) -> int:
        return max_bytes(["gated"], scaled_tiers(at, capacities, stacked=False))

    assert held(rate) <= room < held(rate * 1.01)


def test_without_a_stack_the_shadows_rate_leaves_room_for_their_prefix_check() -> None:
    """With lru not simulated the shadow tiers' estimator runs the prefix check: its entries
    are counted in their share of the bound, at the rate that fits both, and the memory
    read stays within the bound."""
    config = InsightConfig(max_bytes=MiB, policies=("arc",))
    requests = [[40 * r + b for b in range(40)] for r in range(REQUESTS)]  # each new
    insight = fed(requests, 1_000, 0.5, config)
    rate = insight.rates.shadows
    assert insight.rates.stack is None and rate is not None and rate < 0.5
    room = config.max_bytes * (1 - WINDOW_SHARE)
    capacities = scaled_capacities(1_000)

    def held(at: float) -> int:
        tiers = scaled_tiers(at, capacities, stacked=False)
        return max_bytes(["arc"], tiers) + PREFIX_CHECK_BYTES_PER_BLOCK * tiers[-1]

    assert held(rate) <= room < held(rate * 1.01)
    shadows = insight._shadows
    assert shadows is not None and shadows.prefix_check is not None
    # Every block new: more distinct sampled blocks came to the check than its bound.
    assert shadows.sampled_refs > shadows.prefix_check.max_blocks
    assert 0 < insight.memory()[1] <= config.max_bytes


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_a_stream_fits_the_tier_exactly_where_a_tier_of_its_size_never_evicts(
    workload: str,
) -> None:
    """A tier the stream never filled waited for its verdicts "until it fills", for good. On
    every workload here (each at least two tiers' worth of references) the sidecar says the
    stream fits exactly where a fresh tier of that size replaying it evicts nothing, and
    there what it claims holds of the replays: neither a larger tier nor another policy hits
    more; where the tier evicts, it is told what a larger one would do instead."""
    requests, capacity = WORKLOADS[workload], 100
    assert sum(map(len, requests)) >= 2 * capacity
    body = served(fed(requests, capacity, 1.0))
    kinds = [verdict["kind"] for verdict in body["verdicts"]]

    def replayed(policy: str, c: int) -> tuple[float, int]:
        manager = CPUOffloadingManager(1, c, policy)
        ratio = run_workload(manager, requests).hit_ratio
        return ratio, manager.stats.evicted_capacity_blocks

    tier, evicted = replayed("lru", capacity)
    if evicted:
        assert "fits" not in kinds and "capacity" in kinds and "policy" in kinds
        return
    (fits,) = [verdict for verdict in body["verdicts"] if verdict["kind"] == "fits"]
    assert fits["policy"] == "lru" and 0.0 < fits["share"] < 1.0
    assert "policy" not in kinds and "warming_up" not in kinds
    assert [v["blocks"] for v in body["verdicts"] if v["kind"] == "capacity"] == [capacity // 2]
    for policy, c in (("lru", 8 * capacity), ("arc", capacity), ("arc", 8 * capacity)):
        assert replayed(policy, c)[0] == tier, (policy, c)


def test_the_curve_states_each_points_error_none_at_rate_one() -> None:
    """Each point comes with its standard error in points: at rate 1 the replay is the
    stream's own (0 everywhere); sampled, each policy's curve states one."""
    exact = served(fed(WORKLOADS["chains"], 40, 1.0))["curve"]
    assert exact["errors"] == {p: [0.0] * len(exact["capacities"]) for p in exact["hit_ratios"]}
    sampled = served(fed(WORKLOADS["every request new"], 1_000, 0.1))["curve"]
    for policy, errors in sampled["errors"].items():
        assert len(errors) == len(sampled["capacities"]) and min(errors) >= 0.0
        assert max(errors) > 0.0, policy
