"""The live hit-ratio curve: sample frames over real ZMQ sockets into the sidecar, then out of
its API and its metrics.

The worker's side is kvscope's own SampleBuffer with the real SpatialSampler
on the bundled trace, sent by kvscope's EventPublisher or, where a test
needs the sequence numbers in its hands (a gap, a sequence that goes back),
by the raw publisher of tests/support/zmq_peers.py. Waits poll the ingest thread's own
counters (tests/support/polling.py); nothing asserts on time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate

import msgspec
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.ingest import Ingestor
from app.settings import InsightConfig, KiB, MiB, SidecarSettings
from app.state.insight import (
    STACK_HOLD_REFS,
    InsightReading,
    InsightState,
    PublisherInsight,
    SampledStream,
)
from app.state.insight_verdicts import SAMPLED_RESOLUTION_POINTS, curve_verdicts
from app.state.sidecar import SidecarState
from app.state.worker_stats import WorkerStats
from bench.tooling.trace_gen import PROFILES, generate, random_profile
from offload import CPUOffloadingManager
from offload.cpu.manager_metrics import manager_snapshot
from offload.cpu.policies.miniature import CANDIDATES
from offload.insight.curve import DEFAULT_MULTIPLES
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.insight.sweep import replay_point
from offload.insight.window_optimum import MIN_WINDOW_REFS, WINDOW_CAPACITIES, WindowOptimum
from offload.sim.mooncake import bundled_trace_path, load_trace
from offload.sim.optimum import prefix_conflict
from offload.sim.workload import run_request
from offload.telemetry import metrics as m
from offload.wire.framing import DEFAULT_SAMPLE_TOPIC
from offload.wire.publisher import EventPublisher
from offload.wire.sample_buffer import SampleBuffer
from offload.wire.sample_frame import (
    SampledRequest,
    SampleFrame,
    decode_sample_frame,
    encode_sample_frame,
)
from offload.wire.stats_frame import StatsFrame, WorkerConfig
from tests.support.polling import wait_until
from tests.support.traces import conversations, unchained
from tests.support.zmq_peers import RawPublisher, wait_connected

pytestmark = pytest.mark.timeout(120)

RATE = 0.1
REQUESTS = 3000
PER_FRAME = 200


@pytest.fixture(scope="module")
def trace() -> list[list[int]]:
    return [list(r) for r in load_trace(bundled_trace_path())[:REQUESTS]]


def frames(
    requests: Sequence[Sequence[int]], capacity: int, policy: str = "lru", rate: float = RATE
) -> list[bytes]:
    """The sample frames a worker with this tier sends for ``requests``, as payloads."""
    buffer = SampleBuffer(SpatialSampler(rate))
    config = WorkerConfig(policy=policy, capacity_blocks=capacity, block_size=16)
    payloads = []
    for start in range(0, len(requests), PER_FRAME):
        for request in requests[start : start + PER_FRAME]:
            buffer.add(request)
        frame = buffer.take("e0", 0, config)
        assert frame is not None
        payloads.append(encode_sample_frame(frame))
    return payloads


def sample_frames(
    requests: Sequence[Sequence[int]], capacity: int, rate: float = RATE
) -> list[SampleFrame]:
    """Those frames as the sidecar reads them."""
    return list(map(decode_sample_frame, frames(requests, capacity, rate=rate)))


def test_kvscopes_publisher_feeds_the_curve_on_the_sample_topic(trace) -> None:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        settings = SidecarSettings(connect=[publisher.endpoint])
        ingestor = Ingestor(SidecarState.from_settings(settings))
        ingestor.start()
        try:
            state = ingestor.state.publishers[publisher.endpoint]

            def seen() -> bool:
                publisher.publish_stats(StatsFrame(ts=1.0, engine_id="e0", rank=0,
                                                   config=WorkerConfig(policy="lru",
                                                   capacity_blocks=8, block_size=16)))  # fmt: skip
                return state.stats_frames > 0

            wait_until(seen, "the sidecar receives the publisher")
            sent = sample_frames(trace, capacity=400)
            for frame in sent:
                publisher.publish_sample(frame)
            wait_until(
                lambda: state.insight is not None and state.insight.frames == len(sent),
                "every sample frame applied",
            )
            assert state.insight is not None and state.malformed == 0
            assert state.insight.sampled_refs == sum(f.sampled_refs for f in sent)
            assert state.insight.missed_frames == 0
        finally:
            ingestor.close()


@pytest.fixture
def sidecar() -> Iterator[tuple[RawPublisher, Ingestor, SidecarSettings]]:
    raw = RawPublisher()
    # The whole core for the shadow thread: what these tests check does not depend on its
    # share, and at the default tenth a loaded CI machine could outlast the waits below.
    settings = SidecarSettings(
        connect=[raw.endpoints.endpoint],
        replay=[raw.endpoints.replay_endpoint],
        insight_cpu_share=1.0,
    )
    ingestor = Ingestor(SidecarState.from_settings(settings))
    ingestor.start()
    try:
        wait_connected(raw, ingestor)
        yield raw, ingestor, settings
    finally:
        ingestor.close()
        raw.close()


def send(raw: RawPublisher, first_seq: int, payloads: list[bytes]) -> None:
    for seq, payload in enumerate(payloads, first_seq):
        raw.pub.send_multipart([DEFAULT_SAMPLE_TOPIC, seq.to_bytes(8, "big"), payload])


def insight_of(ingestor: Ingestor, raw: RawPublisher) -> PublisherInsight:
    state = ingestor.state.publishers[raw.endpoints.endpoint]
    wait_until(lambda: state.insight is not None, "the first sample frame")
    assert state.insight is not None
    return state.insight


def settled(insight: PublisherInsight, frames: int) -> None:
    """Every frame applied, and the shadow thread through all of them."""
    wait_until(lambda: insight.frames == frames, f"{frames} sample frames applied")

    def caught_up() -> bool:
        simulated = insight.reading().simulated_refs
        return simulated.get("arc") == simulated.get("lru")

    wait_until(caught_up, "the shadow tiers caught up")


def optimum_ran(sidecar, trace, policy: str) -> PublisherInsight:
    """The trace's frames from a tier of 400 blocks under ``policy``, into the sidecar, until
    the shadow thread has caught up and computed the optimum: the publisher's insight."""
    raw, ingestor, _ = sidecar
    payloads = frames(trace, capacity=400, policy=policy)
    send(raw, 0, payloads)
    insight = insight_of(ingestor, raw)
    settled(insight, len(payloads))
    queue = ingestor.state.insight.queue
    wait_until(lambda: queue.unfinished == 0 and insight.optimum is not None, "the optimum ran")
    return insight


def test_the_curve_is_the_estimators_on_the_same_sample(sidecar, trace) -> None:
    raw, ingestor, _ = sidecar
    payloads = frames(trace, capacity=400)
    send(raw, 0, payloads)
    insight = insight_of(ingestor, raw)
    settled(insight, len(payloads))
    # The same sample into the library's estimator, in one process: the same curve.
    expected = CurveEstimator(400, RATE, ["lru", "arc"])
    sampler = SpatialSampler(RATE)
    for request in trace:
        expected.record(sampler.sample(request), len(request))
    curve = insight.reading().curve
    assert curve is not None and curve.current == 400 and not curve.exact
    assert curve.capacities == expected.capacities
    assert dict(curve.hit_ratios) == dict(expected.curve().hit_ratios)
    assert insight.block_refs == sum(map(len, trace)) and insight.requests == len(trace)
    assert insight.sampled_refs == expected.sampled_refs
    assert (insight.missed_frames, insight.resets, insight.shadow_shed_frames) == (0, 0, 0)
    held, size = insight.memory()
    assert 0 < held <= expected.max_held_blocks and 0 < size <= insight.config.max_bytes


def test_a_new_capacity_or_a_restart_starts_the_curve_over(sidecar, trace) -> None:
    raw, ingestor, _ = sidecar
    half = trace[: REQUESTS // 2]
    send(raw, 0, frames(half, capacity=400))
    insight = insight_of(ingestor, raw)
    count = len(frames(half, capacity=400))
    settled(insight, count)
    first_since = insight.since
    resized = frames(half, capacity=800)
    send(raw, count, resized)  # the tier was resized
    settled(insight, 2 * count)
    curve = insight.reading().curve
    assert insight.resets == 1 and curve is not None and curve.current == 800
    assert first_since is not None and insight.since == decode_sample_frame(resized[0]).ts
    simulated = insight.reading().simulated_refs
    assert simulated["lru"] == insight.sampled_refs // 2, "only the new stream"
    queue = ingestor.state.insight.queue
    wait_until(lambda: queue.unfinished == 0, "the shadow thread caught up")
    computed = insight.optimum
    assert computed is not None and computed.result.capacity == 80, "the new tier's window"
    assert computed.result.refs <= insight.sampled_refs // 2
    send(raw, 0, frames(half, capacity=800))  # the sequence went back: a restarted worker
    settled(insight, 3 * count)
    assert insight.resets == 2 and insight.missed_frames == 0
    assert insight.reading().simulated_refs["lru"] == insight.sampled_refs // 3


def test_a_new_block_size_starts_the_curve_over(trace) -> None:
    """Blocks of another size are other hashes and another amount of KV per block: the
    stream was told apart by rate, seed, policy and capacity only, so a worker back with
    another block size and the same capacity (its first frames lost, the sequence going
    on) had its new blocks replayed into the old stream's simulations."""
    state = InsightState()
    insight = state.new_publisher()
    half = REQUESTS // 2
    old = sample_frames(trace[:half], capacity=400)
    for seq, frame in enumerate(old):
        insight.receive(seq, frame)
    larger = [
        msgspec.structs.replace(frame, config=msgspec.structs.replace(frame.config, block_size=32))
        for frame in sample_frames(trace[half:], capacity=400)
    ]
    for seq, frame in enumerate(larger, start=len(old) + 2):
        insight.receive(seq, frame)
    assert insight.resets == 1 and insight.missed_frames == 2
    stream = insight.reading().stream
    assert stream is not None and stream.block_size == 32
    assert insight.since == larger[0].ts
    assert insight.reading().simulated_refs["lru"] == sum(f.sampled_refs for f in larger)


class CountsSeenUnderTheLock:
    """``insight``'s lock, noting how many frames were counted each time it is taken."""

    def __init__(self, insight: PublisherInsight) -> None:
        self.insight = insight
        self.lock = insight.lock
        self.frames_seen: list[int] = []

    def __enter__(self) -> None:
        self.lock.acquire()
        self.frames_seen.append(self.insight.frames)

    def __exit__(self, *_: object) -> None:
        self.lock.release()


def test_a_frame_is_counted_only_once_the_simulations_hold_it(trace) -> None:
    """A reader that saw a frame counted once read the stack's curve without it (the ingest
    thread counted, then recorded): a wait for the count, then for the shadows to equal the
    stack, could end one frame early."""
    insight = InsightState().new_publisher()
    watched = CountsSeenUnderTheLock(insight)
    insight.lock = watched  # type: ignore[assignment]
    for seq, frame in enumerate(sample_frames(trace[:1000], capacity=400)):
        del watched.frames_seen[:]
        insight.receive(seq, frame)
        assert watched.frames_seen and set(watched.frames_seen) == {seq}, "changed, then counted"
        assert insight.frames == seq + 1


def test_a_gap_in_the_sample_sequence_is_counted_as_missed_frames(sidecar, trace) -> None:
    raw, ingestor, _ = sidecar
    payloads = frames(trace, capacity=400)
    send(raw, 0, payloads[:2])
    send(raw, 5, payloads[2:4])
    insight = insight_of(ingestor, raw)
    wait_until(lambda: insight.frames == 4, "four frames applied")
    assert insight.missed_frames == 3 and insight.resets == 0


def test_the_api_and_the_metrics_show_the_curve_the_stream_and_the_verdicts(sidecar, trace) -> None:
    raw, ingestor, settings = sidecar
    payloads = frames(trace, capacity=1000, policy="lru")
    send(raw, 0, payloads)
    insight = insight_of(ingestor, raw)
    settled(insight, len(payloads))
    curve = insight.reading().curve
    assert curve is not None
    with TestClient(create_app(settings, ingestor.state), base_url="http://localhost") as http:
        answer = http.get("/api/v1/insight")
        assert answer.status_code == 200
        body = answer.json()
        (publisher,) = body["publishers"]
        shown = publisher["curve"]
        assert shown["capacities"] == list(curve.capacities)
        assert shown["multiples"] == list(DEFAULT_MULTIPLES)
        assert shown["capacities"][shown["current_index"]] == shown["current_blocks"] == 1000
        assert shown["hit_ratios"] == {p: list(r) for p, r in curve.hit_ratios.items()}
        stream = publisher["stream"]
        assert (stream["rate"], stream["stack_rate"], stream["shadow_rate"]) == (RATE,) * 3
        assert stream["sampled_refs"] == insight.sampled_refs
        assert stream["block_refs"] == insight.block_refs
        assert publisher["miss_reasons"] is None, "no stats frame has come"
        kinds = {v["kind"]: v for v in publisher["verdicts"]}
        doubling = next(v for v in publisher["verdicts"] if v.get("multiple") == 2.0)
        expected = 100 * (curve.at("lru", 2000) - curve.at("lru", 1000))
        assert doubling["points"] == pytest.approx(expected)
        said = (
            f"~{abs(expected):.1f} points"
            if abs(expected) >= SAMPLED_RESOLUTION_POINTS
            else "would change its hit ratio by less than 1 point"
        )
        assert said in doubling["text"]
        arc = kinds["policy"]
        assert arc["policy"] == "arc"
        assert arc["points"] == pytest.approx(100 * (curve.at("arc", 1000) - curve.at("lru", 1000)))
        assert body["memory_bytes"] == publisher["memory"]["bytes"] > 0
        schema = http.get("/openapi.json").json()
        assert "/api/v1/insight" in schema["paths"]
        assert "InsightResponse" in schema["components"]["schemas"]
        metrics = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    points = {
        (s.labels["policy"], s.labels["multiple"]): s.value
        for s in families["kvscope_sidecar_hit_ratio_curve"].samples
    }
    assert len(points) == 2 * len(DEFAULT_MULTIPLES)
    assert points["lru", "1"] == curve.at("lru", 1000)
    assert points["arc", "0.125"] == curve.at("arc", 125)
    sampled = families["kvscope_sidecar_sampled_refs"].samples[0]
    assert sampled.value == insight.sampled_refs
    assert families["kvscope_sidecar_insight_bytes"].samples[0].value > 0


def test_the_optimum_is_the_librarys_over_the_window_and_the_api_and_metrics_show_it(
    sidecar, trace
) -> None:
    _, ingestor, settings = sidecar
    insight = optimum_ran(sidecar, trace, "arc")
    computed = insight.optimum
    assert computed is not None and insight.optimum_runs >= 1
    result = computed.result
    assert (result.policy, result.capacity, result.rate) == ("arc", 40, RATE)
    assert result.refs <= computed.max_refs == max(MIN_WINDOW_REFS, WINDOW_CAPACITIES * 40)
    # The window is taken between two frames: the library's window at one of those
    # boundaries, fed the same frames, holds the same references and finds the same hits.
    library = WindowOptimum(400, RATE, "arc")
    found = []
    for frame in sample_frames(trace, capacity=400):
        library.record(
            [r.sampled for r in frame.requests],
            [r.block_refs for r in frame.requests],
            frame.unsampled_block_refs,
        )
        requests, block_refs = library.take()
        if (sum(map(len, requests)), block_refs) == (result.refs, result.block_refs):
            found.append(library.compute(requests, block_refs))
    assert any(
        (r.optimum_hits, r.tier_hits) == (result.optimum_hits, result.tier_hits) for r in found
    ), "no frame boundary's window matches"
    assert result.tier_hits <= result.optimum_hits
    with TestClient(create_app(settings, ingestor.state), base_url="http://localhost") as http:
        (publisher,) = http.get("/api/v1/insight").json()["publishers"]
        schema = http.get("/openapi.json").json()["components"]["schemas"]
        metrics = http.get("/metrics").text
    shown = publisher["optimum"]
    assert shown["hit_ratio"] == result.optimum_ratio
    assert shown["tier_hit_ratio"] == result.tier_ratio
    assert (shown["window_refs"], shown["window_block_refs"]) == (result.refs, result.block_refs)
    assert (shown["policy"], shown["capacity_blocks"]) == ("arc", 40)
    assert shown["max_window_refs"] == computed.max_refs and shown["computed_at"] == computed.ts
    assert publisher["efficiency"] == result.efficiency
    assert result.efficiency_error is not None and result.efficiency_error > 0
    assert publisher["efficiency_error"] == pytest.approx(100 * result.efficiency_error)
    assert publisher["stream"]["window_rate"] == RATE
    (verdict,) = [v for v in publisher["verdicts"] if v["kind"] == "optimum"]
    assert verdict["share"] == result.efficiency and verdict["policy"] == "arc"
    assert verdict["error"] == publisher["efficiency_error"]
    # A window of a few hundred sampled references on a tier of 40 sampled blocks: its
    # error is wider than a point, and said beside the figure.
    assert verdict["text"].startswith(
        f"this tier gets {100 * result.efficiency:.3g}% (±{verdict['error']:.1f} points, the "
        "sample's error over this window) of the hits"
    )
    assert {"efficiency", "efficiency_error"} <= set(schema["PublisherInsightInfo"]["properties"])
    assert schema["WindowOptimumInfo"]["properties"]["hit_ratio"]["description"]
    families = {f.name: f for f in text_string_to_metric_families(metrics)}

    def value(name: str) -> float:
        (sample,) = families[name].samples
        return sample.value

    assert value("kvscope_sidecar_window_block_refs") == result.block_refs
    optimum_hits = value("kvscope_sidecar_window_optimum_hits")
    assert optimum_hits == pytest.approx(result.optimum_ratio * result.block_refs)
    tier_hits = value("kvscope_sidecar_window_tier_hits")
    assert tier_hits / optimum_hits == pytest.approx(result.efficiency)
    assert value("kvscope_sidecar_window_optimum_runs") == insight.optimum_runs
    assert insight.memory()[1] <= insight.config.max_bytes


@pytest.mark.parametrize("chained", [True, False])
@pytest.mark.parametrize("policies", [("lru", "arc"), ("arc",)])
def test_a_stream_whose_blocks_do_not_form_chains_is_said_not_to_predict_the_tier(
    chained: bool, policies: tuple[str, ...]
) -> None:
    """Random block ids reused at other positions (a Mooncake trace need not chain them):
    the sampled curve read far above the tier and its verdicts went out as if it did not;
    and with lru not simulated (no stack, which alone ran the check) they still did."""
    trace = conversations(3000, 500)
    requests = trace if chained else unchained(trace)
    tier = policies[0]
    state = InsightState(InsightConfig(policies=policies))
    insight = state.new_publisher()
    for seq, payload in enumerate(frames(requests, capacity=1000, policy=tier)):
        insight.receive(seq, decode_sample_frame(payload))
        while (work := state.queue.get(0)) is not None:
            work.apply(lambda: None)
    reading = insight.reading()
    verdicts = curve_verdicts(reading.curve, tier, reading.basis)
    said = [v.kind for v in verdicts]
    if chained:
        assert "unchained" not in said and "capacity" in said
    else:
        assert said == ["unchained"] and verdicts[0].policy == tier


@pytest.mark.parametrize("chained", [True, False])
def test_on_a_stream_whose_blocks_do_not_form_chains_the_distance_to_the_optimum_is_withheld(
    sidecar, chained: bool
) -> None:
    """Both replays over the window count a sampled block as hit behind unsampled blocks the
    tier's lookup stopped at: on shuffled conversations the window read the optimum and lru
    at about three times a full replay's hit ratios, and their quotient tens of points off
    on a trace of ids drawn from a pool, while the API gave it as the tier's efficiency."""
    _, ingestor, settings = sidecar
    trace = conversations(3000, 500)
    insight = optimum_ran(sidecar, trace if chained else unchained(trace), "lru")
    computed = insight.optimum
    assert computed is not None
    with TestClient(create_app(settings, ingestor.state), base_url="http://localhost") as http:
        (publisher,) = http.get("/api/v1/insight").json()["publishers"]
        metrics = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    said = {v["kind"]: v["text"] for v in publisher["verdicts"]}
    tier_hits = families["kvscope_sidecar_window_tier_hits"].samples
    assert publisher["optimum"]["hit_ratio"] == computed.result.optimum_ratio, "still shown"
    if chained:
        assert publisher["efficiency"] == computed.result.efficiency is not None
        assert "optimum" in said and "unchained" not in said and len(tier_hits) == 1
    else:
        assert publisher["efficiency"] is None
        assert "optimum" not in said and tier_hits == []
        assert "nor on its distance to the optimum" in said["unchained"]


def test_a_publisher_without_a_sample_has_no_curve_and_no_curve_verdicts() -> None:
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"])
    state = SidecarState.from_settings(settings)
    with TestClient(create_app(settings, state), base_url="http://localhost") as http:
        (publisher,) = http.get("/api/v1/insight").json()["publishers"]
    assert publisher["curve"] is None and publisher["stream"] is None
    assert publisher["optimum"] is None and publisher["efficiency"] is None
    assert publisher["verdicts"] == [] and publisher["dead_write_ratio"] is None


def test_miss_reasons_come_from_the_workers_latest_stats_frame() -> None:
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"])
    state = SidecarState.from_settings(settings)
    (publisher,) = state.publishers.values()
    snapshot = m.Snapshot()
    for reason, blocks in (("evicted", 7), ("prefix_lost", 2)):
        snapshot.add(m.LOOKUP_MISS_BLOCKS_TOTAL, blocks, medium="CPU", reason=reason)
    config = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)
    frame = StatsFrame(ts=1.0, engine_id="e", rank=0, config=config, counters=snapshot.counters)
    publisher.worker = WorkerStats.between(None, frame)
    with TestClient(create_app(settings, state), base_url="http://localhost") as http:
        (shown,) = http.get("/api/v1/insight").json()["publishers"]
    assert shown["miss_reasons"] == {"evicted": 7, "prefix_lost": 2}


def test_insight_settings_are_bounded_and_policies_checked_by_name(monkeypatch) -> None:
    monkeypatch.setenv("KVSCOPE_INSIGHT_POLICIES", "lru,nope")
    with pytest.raises(ValueError, match="'nope' is not a cache policy"):
        SidecarSettings(connect=["tcp://127.0.0.1:1"])
    monkeypatch.setenv("KVSCOPE_INSIGHT_POLICIES", "arc")
    for share in ("0", "1e-12"):  # 1e-12 once overflowed the shadow thread's wait and stopped it
        monkeypatch.setenv("KVSCOPE_INSIGHT_CPU_SHARE", share)
        with pytest.raises(ValueError, match="insight_cpu_share"):
            SidecarSettings(connect=["tcp://127.0.0.1:1"])
    monkeypatch.setenv("KVSCOPE_INSIGHT_CPU_SHARE", "0.5")
    config = SidecarSettings(connect=["tcp://127.0.0.1:1"]).insight_config()
    assert (config.policies, config.cpu_share) == (("arc",), 0.5)


def _gated_worker_stats(requests: list[list[int]], **gauges: float) -> WorkerStats:
    """WorkerStats from the stats frame of a real gated tier after ``requests``, with
    ``gauges`` (candidate -> hit ratio) written over its candidates' ratios where given."""
    manager = CPUOffloadingManager(16, 16, "gated")
    for request in requests:
        run_request(manager, request)
    snapshot = manager_snapshot(manager)
    snapshot.gauges = [
        msgspec.structs.replace(sample, value=gauges[sample.labels["candidate"]])
        if sample.name == m.ADMISSION_CANDIDATE_HIT_RATIO.name
        and sample.labels["candidate"] in gauges
        else sample
        for sample in snapshot.gauges
    ]
    config = WorkerConfig(policy="gated", capacity_blocks=16, block_size=16)
    frame = StatsFrame(
        ts=1.0, engine_id="e", rank=0, config=config,
        counters=snapshot.counters, gauges=snapshot.gauges,
    )  # fmt: skip
    return WorkerStats.between(None, frame)


def _insight_of(worker: WorkerStats) -> dict:
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"])
    state = SidecarState.from_settings(settings)
    (publisher,) = state.publishers.values()
    publisher.worker = worker
    with TestClient(create_app(settings, state), base_url="http://localhost") as http:
        (shown,) = http.get("/api/v1/insight").json()["publishers"]
    return shown


def test_a_gated_workers_admission_candidates_reach_the_api_with_a_verdict() -> None:
    quick = [[block, block + 1] for block in range(400)]  # first offers come back at once
    shown = _insight_of(_gated_worker_stats(quick))
    candidates = shown["admission_candidates"]
    assert set(candidates) == {candidate.label for candidate in CANDIDATES}
    assert shown["admission_followed"] == "admit_all"
    assert candidates["admit_all"] == max(candidates.values()) > 0
    (verdict,) = [v for v in shown["verdicts"] if v["kind"] == "admission"]
    assert verdict["text"].startswith("the tier admits as admit_all, at or near the best")
    # The duel's models say another candidate leads by 3 points: the verdict names the gain.
    ahead = _insight_of(_gated_worker_stats(quick, horizon_1=candidates["admit_all"] + 0.03))
    (verdict,) = [v for v in ahead["verdicts"] if v["kind"] == "admission"]
    assert "admitting as horizon_1 would add ~3.0 points" in verdict["text"]
    assert verdict["points"] == pytest.approx(3.0)


def test_candidates_a_worker_could_not_have_sent_are_left_out() -> None:
    worker = _gated_worker_stats([[1, 2]], horizon_1=float("nan"), horizon_2=1.5)
    assert "horizon_1" not in worker.admission_hit_ratios
    assert "horizon_2" not in worker.admission_hit_ratios
    # The followed one (the default, horizon_2) has no ratio left: no verdict from it.
    shown = _insight_of(worker)
    assert shown["admission_followed"] == "horizon_2"
    assert not [v for v in shown["verdicts"] if v["kind"] == "admission"]


def test_other_policies_show_no_admission_candidates() -> None:
    shown = _insight_of(WorkerStats())
    assert shown["admission_candidates"] is None and shown["admission_followed"] is None


def test_no_curve_is_served_before_a_sampled_reference_is_replayed() -> None:
    """A frame whose requests had no sampled block (a short prompt at rate 0.05) once served a
    hit ratio of 1.0 at every capacity: adjusted for a sample of none, any count reads 1.0."""
    insight = InsightState().new_publisher()
    frame = SampleFrame(
        ts=1.0, engine_id="e0", rank=0,
        config=WorkerConfig(policy="lru", capacity_blocks=2000, block_size=16),
        rate=0.05, seed=0, requests=[], unsampled_requests=3, unsampled_block_refs=30,
    )  # fmt: skip
    insight.receive(0, decode_sample_frame(encode_sample_frame(frame)))
    assert insight.block_refs == 30
    assert insight.reading().curve is None


def test_a_curve_never_mixes_simulations_of_two_tiers(trace) -> None:
    """A rebuild once changed the stream before taking the lock: a shadow item of the old
    generation running in between built its tiers at the new capacity, and every reader of
    the curve (the API, /metrics) failed on capacities that did not match."""
    insight = InsightState().new_publisher()
    insight.receive(0, sample_frames(trace[:600], capacity=100)[0])
    work = insight.queue.get(0)
    assert work is not None
    # The inconsistent moment, made by hand: the stream is another tier's, the generation
    # still the old one.
    insight.stream = SampledStream(RATE, 0, "lru", 1, 16)
    insight.rates = insight._rates(insight.stream)
    work.apply(lambda: None)
    curve = insight.reading().curve
    assert curve is not None and curve.current == 100


def test_the_workers_shed_counts_only_ever_rise_across_its_restarts() -> None:
    """The worker's cumulative counts were exported as they came: a frame counting less (a
    restarted worker, or a forged one) made the counter fall, which rate() reads as a reset."""
    insight = InsightState().new_publisher()
    config = WorkerConfig(policy="lru", capacity_blocks=2000, block_size=16)
    for seq, (requests, refs) in enumerate([(5, 50), (7, 70), (2, 20), (2, 20)]):
        frame = SampleFrame(
            ts=1.0, engine_id="e0", rank=0, config=config, rate=0.05, seed=0, requests=[],
            unsampled_requests=1, unsampled_block_refs=1,
            shed_requests=requests, shed_block_refs=refs,
        )  # fmt: skip
        insight.receive(seq, decode_sample_frame(encode_sample_frame(frame)))
    assert (insight.worker_shed_requests, insight.worker_shed_block_refs) == (9, 90)


def test_a_publisher_that_floods_the_shadow_queue_sheds_only_its_own_frames(trace) -> None:
    """The shadow queue was first come, first served across publishers: one sending far
    more (or on purpose) took all of it and every other publisher's curve lost its frames."""
    state = InsightState(InsightConfig(queue_bytes=2 * MiB))
    flood, quiet = state.new_publisher(), state.new_publisher()
    payloads = sample_frames(trace, capacity=400)
    # No shadow thread runs: what is queued stays queued, as when the thread falls behind.
    for seq, frame in enumerate(payloads):
        quiet.receive(seq, frame)
        for repeat in range(20):
            flood.receive(seq * 20 + repeat, frame)
    assert flood.shadow_shed_frames > 0
    assert quiet.shadow_shed_frames == 0
    assert state.queue.bytes <= state.queue.max_bytes


def test_a_flood_from_many_publishers_stays_in_its_bounds_and_counts_all_it_sheds(trace) -> None:
    """Sixteen publishers flood a small queue while the shadow thread takes one item now and
    then: the queue never holds more than its bound, no publisher's simulations more than
    theirs, and each frame a publisher sent is, for its shadow tiers, replayed or counted
    shed, never lost without a count."""
    state = InsightState(InsightConfig(max_bytes=1 * MiB, queue_bytes=256 * KiB))
    publishers = [state.new_publisher() for _ in range(16)]
    payloads = sample_frames(trace[:1_500], capacity=1_000)
    for seq, frame in enumerate(payloads):
        for insight in publishers:
            insight.receive(seq, frame)
            assert state.queue.bytes <= state.queue.max_bytes
            assert insight.memory()[1] <= insight.config.max_bytes
        if (work := state.queue.get(0)) is not None:  # a shadow thread far behind
            work.apply(lambda: None)
            state.queue.finished()
    assert state.queue.shed > 0
    while (work := state.queue.get(0)) is not None:
        work.apply(lambda: None)
        state.queue.finished()
    for insight in publishers:
        basis = insight.reading().basis
        assert basis is not None
        arc = basis.simulations["arc"]
        assert arc.covered_block_refs == insight.block_refs == basis.block_refs
        assert arc.shed_block_refs == insight.shadow_shed_block_refs
        assert insight.memory()[1] <= insight.config.max_bytes


def test_a_tier_under_a_policy_the_curve_does_not_simulate_is_told_so(sidecar, trace) -> None:
    """The window once replayed gated at the sample's scale, where its sizes do not hold,
    and said the tier got 26% of the optimum's hits when it got none."""
    _, ingestor, settings = sidecar
    optimum_ran(sidecar, trace, "gated")
    with TestClient(create_app(settings, ingestor.state), base_url="http://localhost") as http:
        (publisher,) = http.get("/api/v1/insight").json()["publishers"]
        metrics = http.get("/metrics").text
    assert publisher["optimum"]["policy"] == "lru", "LRU stands in for the optimum's window"
    assert publisher["efficiency"] is None
    kinds = [v["kind"] for v in publisher["verdicts"]]
    assert "not_simulated" in kinds and "optimum" not in kinds and "capacity" not in kinds
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert families["kvscope_sidecar_window_optimum_hits"].samples
    assert not families["kvscope_sidecar_window_tier_hits"].samples


def test_shadows_at_a_lower_rate_that_shed_frames_are_caught_up_with_the_stack(trace) -> None:
    """Within a small memory bound the shadows run at a lower rate than the stack; and a
    full queue sheds some of their frames. Compared on sampled references, arc was behind
    for good on either count: at a lower rate it is caught up once it has dealt with every
    frame; one that shed much of the stream is said to have, and not compared."""
    state = InsightState(InsightConfig(max_bytes=1 * MiB, queue_bytes=256 * KiB))
    insight = state.new_publisher()
    payloads = sample_frames(trace, capacity=1_000)  # ~40 KiB of queue each
    for seq, frame in enumerate(payloads):
        insight.receive(seq, frame)
        if seq < len(payloads) // 3:  # then no shadow thread: the queue fills, and sheds
            while (work := state.queue.get(0)) is not None:
                work.apply(lambda: None)
    assert insight.shadow_shed_frames > 0
    rates = insight.rates
    assert rates.shadows is not None and rates.stack is not None
    assert rates.shadows < rates.stack
    reading = insight.reading()
    curve, basis = reading.curve, reading.basis
    assert basis is not None
    lru, arc = basis.simulations["lru"], basis.simulations["arc"]
    assert arc.covered_block_refs < lru.covered_block_refs, "frames still queued"
    (lag,) = [v for v in curve_verdicts(curve, "lru", basis) if v.policy == "arc"]
    assert lag.kind == "warming_up" and "behind" in lag.text
    while (work := state.queue.get(0)) is not None:
        work.apply(lambda: None)
    reading = insight.reading()
    curve, basis = reading.curve, reading.basis
    assert basis is not None
    lru, arc = basis.simulations["lru"], basis.simulations["arc"]
    assert arc.sampled_refs < lru.sampled_refs
    assert arc.covered_block_refs == lru.covered_block_refs == insight.block_refs
    assert arc.shed_block_refs == insight.shadow_shed_block_refs
    (shed,) = [v for v in curve_verdicts(curve, "lru", basis) if v.policy == "arc"]
    assert shed.kind == "shed" and shed.share == pytest.approx(basis.shed_share(arc))
    assert shed.share == pytest.approx(insight.shadow_shed_block_refs / insight.block_refs)


def _read_as_sampled(trace: list[list[int]], capacity: int) -> InsightReading:
    """The curve and its basis of a publisher sending ``trace`` sampled at the default rate
    from a tier of ``capacity`` blocks, every frame's work done as it comes."""
    state = InsightState()
    insight = state.new_publisher()
    for seq, frame in enumerate(sample_frames(trace, capacity, rate=DEFAULT_RATE)):
        insight.receive(seq, frame)
        while (work := state.queue.get(0)) is not None:
            work.apply(lambda: None)
    return insight.reading()


def test_documents_behind_several_hot_system_prompts_keep_the_curves_verdicts() -> None:
    """bench.tooling.trace_gen opens a session with a shared document behind any of a few
    system prompts: its block ids are not prefix-closed, and a document's first sampled
    block may follow another sampled block than at its last use; but each system prompt is
    used more recently than the document, so the tier holds the document's new prefix
    wherever it holds the document, and the sampled curve counts what the tier hits. On
    this trace over 1% of the sampled blocks met again had changed predecessor (none to a
    less recent one), and the stream was taken for unchained: every size and policy
    verdict withheld, while the curve was within a point of full replays."""
    trace = list(generate(PROFILES["repeat"], 3_000, 3))
    assert prefix_conflict(trace) is not None
    capacity = 1_750
    reading = _read_as_sampled(trace, capacity)
    assert reading.curve is not None
    verdicts = curve_verdicts(reading.curve, "lru", reading.basis)
    assert [v.kind for v in verdicts] == ["capacity", "capacity", "policy"]
    for policy in ("lru", "arc"):
        for blocks in (capacity, 2 * capacity):
            replayed = replay_point(trace, policy, blocks).hit_ratio
            error = 100 * abs(reading.curve.at(policy, blocks) - replayed)
            assert error < SAMPLED_RESOLUTION_POINTS, (policy, blocks)


def test_documents_behind_a_less_recent_system_prompt_still_in_the_tier_keep_the_verdicts() -> None:
    """bench.tooling.trace_gen's random mix of seed 3 puts its documents behind any of six
    system prompts, and a document's sampled block often follows a system prompt used a
    few requests before the document was: less recent, but well inside the tier, which
    holds both and hits the document as the sample counts it. Over 7% of the sampled
    blocks met again were counted as behind a less recent predecessor, and the stream was
    taken for unchained (every size and policy verdict withheld) while the curve was
    within a point of full replays at the sizes the verdicts speak of."""
    trace = list(generate(random_profile(3), 1_500, 3))
    capacity = 6_000
    reading = _read_as_sampled(trace, capacity)
    assert reading.curve is not None and reading.basis is not None
    stack = reading.basis.simulations["lru"]
    assert stack.prefix_checked >= 500
    verdicts = curve_verdicts(reading.curve, "lru", reading.basis)
    assert [v.kind for v in verdicts] == ["capacity", "capacity", "policy"]
    for blocks in (capacity // 2, capacity, 2 * capacity):
        replayed = replay_point(trace, "lru", blocks).hit_ratio
        error = 100 * abs(reading.curve.at("lru", blocks) - replayed)
        assert error < SAMPLED_RESOLUTION_POINTS, blocks


def test_a_curve_replayed_whole_at_rate_one_is_exact(trace) -> None:
    """Every simulation at rate 1 replays the tier's own stream: the curve said it was
    sampled all the same, and its verdicts read changes under a point as noise."""
    state = InsightState()
    insight = state.new_publisher()
    for seq, frame in enumerate(sample_frames(trace[:600], capacity=50, rate=1.0)):
        insight.receive(seq, frame)
    while (work := state.queue.get(0)) is not None:
        work.apply(lambda: None)
    assert insight.rates.stack == insight.rates.shadows == 1.0
    curve = insight.reading().curve
    assert curve is not None and curve.exact
    narrowed = InsightState(InsightConfig(max_bytes=256 * KiB)).new_publisher()
    narrowed.receive(0, sample_frames(trace[:600], capacity=5_000, rate=1.0)[0])
    assert narrowed.rates.stack is not None and narrowed.rates.stack < 1.0
    curve = narrowed.reading().curve
    assert curve is not None and not curve.exact


def test_an_optimum_on_too_few_sampled_blocks_shows_no_efficiency_anywhere(trace) -> None:
    """The verdict withheld the distance to the optimum on a tier of 10 sampled blocks, while
    the API gave its efficiency and the metrics its tier hits (and so the recording rule)."""
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"])
    state = SidecarState.from_settings(settings)
    (publisher,) = state.publishers.values()
    insight = publisher.insight = state.insight.new_publisher()
    for seq, frame in enumerate(sample_frames(trace, capacity=100)):
        insight.receive(seq, frame)
        while (work := state.insight.queue.get(0)) is not None:
            work.apply(lambda: None)
    assert insight.optimum is not None and insight.optimum.result.efficiency is not None
    with TestClient(create_app(settings, state), base_url="http://localhost") as http:
        (shown,) = http.get("/api/v1/insight").json()["publishers"]
        metrics = http.get("/metrics").text
    assert shown["optimum"]["capacity_blocks"] == 10 and shown["efficiency"] is None
    verdicts = shown["verdicts"]
    assert "optimum" not in [v["kind"] for v in verdicts]
    assert any(
        v["kind"] == "sample_small" and "the distance to the optimum" in v["text"] for v in verdicts
    )
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert families["kvscope_sidecar_window_optimum_hits"].samples
    assert not families["kvscope_sidecar_window_tier_hits"].samples


def test_shadows_whose_every_frame_is_shed_leave_the_stacks_verdicts(trace) -> None:
    """A queue with no room for a frame never builds the shadow tiers: the curve's basis
    left arc out, counted it at 0 sampled references, and the lru tier's own verdicts
    waited for it for good."""
    state = InsightState(InsightConfig(queue_bytes=1))
    insight = state.new_publisher()
    for seq, frame in enumerate(sample_frames(trace, capacity=1_000)):
        insight.receive(seq, frame)
    assert state.queue.items == 0 and insight.shadow_shed_block_refs == insight.block_refs
    reading = insight.reading()
    assert reading.simulated_refs == {"lru": insight.sampled_refs, "arc": 0}
    verdicts = curve_verdicts(reading.curve, "lru", reading.basis)
    assert [v.kind for v in verdicts] == ["capacity", "capacity", "shed"]
    assert verdicts[-1].policy == "arc" and verdicts[-1].share == 1.0
    assert [v.kind for v in curve_verdicts(reading.curve, "arc", reading.basis)] == ["shed"]


@pytest.mark.parametrize("lost", ["missed frame", "worker shed", "shadow queue shed"])
def test_a_curve_at_rate_one_that_lost_requests_is_not_exact(trace, lost: str) -> None:
    """At rate 1 a replay missing requests is the tier's stream no longer: the curve was
    called exact all the same, and its verdicts read changes of a twentieth of a point."""
    state = InsightState(InsightConfig(queue_bytes=1 if lost == "shadow queue shed" else 16 * MiB))
    insight = state.new_publisher()
    payloads = sample_frames(trace[:600], capacity=50, rate=1.0)
    for seq, frame in enumerate(payloads):
        if lost == "missed frame" and seq == 1:
            continue
        if lost == "worker shed" and seq == 2:
            frame = msgspec.structs.replace(frame, shed_requests=3, shed_block_refs=30)
        insight.receive(seq, frame)
        while (work := state.queue.get(0)) is not None:
            work.apply(lambda: None)
    curve = insight.reading().curve
    assert curve is not None and not curve.exact
    restarted = sample_frames(trace[:200], capacity=60, rate=1.0)[0]
    insight.receive(len(payloads), restarted)  # another capacity: a new stream, lossless
    while (work := state.queue.get(0)) is not None:
        work.apply(lambda: None)
    curve = insight.reading().curve
    assert curve is not None and curve.exact is (lost != "shadow queue shed")


def test_what_the_worker_shed_before_the_sidecar_heard_it_leaves_the_curve_exact(trace) -> None:
    """The worker's shed counts are its own since it started: the first frame this sidecar
    heard carried requests shed before it, and the curve was never exact again."""
    state = InsightState()
    insight = state.new_publisher()
    payloads = sample_frames(trace[:600], capacity=50, rate=1.0)
    for seq, frame in enumerate(payloads, start=100):  # a worker up long before the sidecar
        insight.receive(seq, msgspec.structs.replace(frame, shed_requests=7))
        while (work := state.queue.get(0)) is not None:
            work.apply(lambda: None)
    curve = insight.reading().curve
    assert curve is not None and curve.exact and insight.worker_shed_requests == 7
    later = msgspec.structs.replace(payloads[0], shed_requests=8)
    insight.receive(100 + len(payloads), later)  # one more shed since: this stream's
    curve = insight.reading().curve
    assert curve is not None and not curve.exact


def test_a_restarted_workers_shed_counts_are_all_new(trace) -> None:
    """A restarted publisher's shed counts start again from 0, but they were measured against
    the old worker's last: a new worker that had shed as many requests as the old one (or
    more) added nothing (or only the difference) to the counters, and a curve at rate 1
    that had lost those requests stayed exact."""
    state = InsightState()
    insight = state.new_publisher()
    payloads = sample_frames(trace[:600], capacity=50, rate=1.0)
    for seq, frame in enumerate(payloads, start=100):  # 3 shed before the sidecar heard it
        insight.receive(seq, msgspec.structs.replace(frame, shed_requests=3, shed_block_refs=30))
    assert (insight.worker_shed_requests, insight.worker_shed_block_refs) == (3, 30)
    for seq, frame in enumerate(payloads):  # restarted: it shed 3 of its own first requests
        insight.receive(seq, msgspec.structs.replace(frame, shed_requests=3, shed_block_refs=30))
        while (work := state.queue.get(0)) is not None:
            work.apply(lambda: None)
    assert insight.resets == 1
    assert (insight.worker_shed_requests, insight.worker_shed_block_refs) == (6, 60)
    curve = insight.reading().curve
    assert curve is not None and not curve.exact


class StackRefsPerHold:
    """``insight``'s lock, noting the sampled references the stack gained in each hold, and
    at its end the stack's sampled references and the longest request a reader reads."""

    def __init__(self, insight: PublisherInsight) -> None:
        self.insight = insight
        self.lock = insight.lock
        self.before = 0
        self.gained: list[int] = []
        self.longest: list[tuple[int, int]] = []

    def _refs(self) -> int:
        stack = self.insight._stack
        return 0 if stack is None else stack.sampled_refs

    def __enter__(self) -> None:
        self.lock.acquire()
        self.before = self._refs()

    def __exit__(self, *_: object) -> None:
        self.gained.append(self._refs() - self.before)
        self.longest.append((self._refs(), self.insight._longest_stacked))
        self.lock.release()


def test_a_huge_frame_holds_the_lock_a_part_at_a_time_and_makes_the_same_curve() -> None:
    """A frame of max_message_bytes carries over a million sampled references: the stack
    replayed it in one hold of the lock (over a second), and every reader of the curve
    (the API, /metrics) waited it out, frame after frame under a flood of them. Between
    holds a reader reads the longest request of those on the stack: it read the frame's
    (a long_requests verdict on a curve not yet holding it) from the first hold on."""
    config = WorkerConfig(policy="lru", capacity_blocks=40, block_size=16)
    chains = [[chain * 10_000 + block for block in range(300)] for chain in range(8)]
    # Requests of 300 blocks, one longer than a hold alone, and some with none sampled.
    requests = [chains[i % 8][: 100 + i % 200] for i in range(150)]
    requests.insert(70, list(range(10**6, 10**6 + STACK_HOLD_REFS + 5)))
    sampled = [SampledRequest(len(r) + 3, r) for r in requests]
    frame = SampleFrame(
        ts=1.0, engine_id="e0", rank=0, config=config, rate=1.0, seed=0,
        requests=sampled, unsampled_requests=2, unsampled_block_refs=9,
    )  # fmt: skip
    frame = decode_sample_frame(encode_sample_frame(frame))
    insight = InsightState(InsightConfig(policies=("lru",))).new_publisher()
    watched = StackRefsPerHold(insight)
    insight.lock = watched  # type: ignore[assignment]
    insight.receive(0, frame)
    holds = [gained for gained in watched.gained if gained]
    assert len(holds) > 2 and sum(holds) == frame.sampled_refs
    assert STACK_HOLD_REFS + 5 in holds, "the long request alone"
    assert max(h for h in holds if h != STACK_HOLD_REFS + 5) <= STACK_HOLD_REFS
    # Once the stack holds a request's sampled references, the longest of those before it.
    ends = accumulate(map(len, requests))
    longest_so_far = accumulate((r.block_refs for r in sampled), max)
    on_stack = {0: 0} | dict(zip(ends, longest_so_far, strict=True))
    assert all(longest == on_stack[refs] for refs, longest in watched.longest)
    assert len({longest for _, longest in watched.longest}) > 2
    whole = CurveEstimator(40, 1.0, ["lru"])
    whole.record_many(requests, frame.block_refs)  # the frame in one call
    reading = insight.reading()
    assert reading.curve is not None and reading.curve == whole.curve()
    assert reading.basis is not None
    assert reading.basis.simulations["lru"].block_refs == frame.block_refs


class ReadingsUnderTheLock:
    """``insight``'s lock, noting the stream and the curve a reader taking it would read."""

    def __init__(self, insight: PublisherInsight) -> None:
        self.insight = insight
        self.lock = insight.lock
        self.seen: list[tuple[SampledStream | None, bool]] = []

    def __enter__(self) -> None:
        self.lock.acquire()
        self.seen.append((self.insight.stream, self.insight._curve() is not None))

    def __exit__(self, *_: object) -> None:
        self.lock.release()


def test_a_restart_never_shows_a_curve_without_its_stream(trace) -> None:
    """A restarted publisher's stream was forgotten outside the lock, before the rebuild took
    it: a reader in between read the old stream's curve (and optimum) with no stream, and the
    API showed that curve with no verdict, or the stats frame's policy beside it."""
    insight = InsightState().new_publisher()
    payloads = sample_frames(trace[:600], capacity=50)
    for seq, frame in enumerate(payloads):
        insight.receive(seq, frame)
    watched = ReadingsUnderTheLock(insight)
    insight.lock = watched  # type: ignore[assignment]
    insight.receive(0, payloads[0])  # the sequence went back: a restart
    assert insight.resets == 1 and watched.seen
    assert all(stream is not None or not curve for stream, curve in watched.seen)


def test_an_optimum_computed_for_a_stream_gone_leaves_the_new_ones_request_queued(trace) -> None:
    """A computation of the optimum that outlived its stream (a restart while it ran) marked
    the window as not queued when it ended, although the new stream's window had queued its
    own: the next frame queued another, and the window was computed twice for one due."""
    state = InsightState(InsightConfig(policies=("lru",)))  # the queue holds windows only
    insight = state.new_publisher()
    payloads = sample_frames(trace, capacity=100)
    seq = 0
    while state.queue.items == 0:
        insight.receive(seq, payloads[seq])
        seq += 1
    old = state.queue.get(0)
    assert old is not None

    def restart_once() -> None:  # the publisher restarts while the old window is computed
        if insight.resets:
            return
        for restarted, frame in enumerate(payloads):
            insight.receive(restarted, frame)
            if state.queue.items:
                return

    old.apply(restart_once)
    assert insight.resets == 1 and state.queue.items == 1
    for later, frame in enumerate(payloads[5:8], start=len(payloads)):
        insight.receive(later, frame)
    assert state.queue.items == 1, "the new stream's window was queued twice"
