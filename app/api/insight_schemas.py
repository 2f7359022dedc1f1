"""GET /api/v1/insight's body: per publisher, why its tier hits what it hits.

Built from the publisher's sampled stream (app/state/insight.py), its block
index rows (stranded blocks) and its worker's totals (dead writes).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.state.insight import ComputedOptimum, InsightReading, PublisherInsight, SampledStream
from app.state.insight_queue import ShadowQueue
from app.state.insight_verdicts import (
    CurveBasis,
    Tier,
    Verdict,
    VerdictKind,
    admission_verdict,
    candidate_verdict,
    curve_verdicts,
    optimum_verdict,
    stale_verdicts,
    stranded_verdicts,
    window_efficiency,
)
from app.state.publisher import CONNECTED_WITHIN_S, PublisherState
from offload.insight.curve import HitRatioCurve


class InsightCurve(BaseModel):
    """Hit ratio per policy at capacities around the tier's, estimated from the sample."""

    capacities: list[int] = Field(description="Capacities in blocks, ascending.")
    multiples: list[float] = Field(
        description="Each capacity over the tier's (1/8x to 8x; capacities are whole blocks, "
        "so below 8 blocks the smaller ones round, or merge, and each shows its exact multiple)."
    )
    current_blocks: int = Field(description="The tier's capacity: one of `capacities`.")
    current_index: int = Field(description="Where the tier's capacity is in `capacities`.")
    hit_ratios: dict[str, list[float]] = Field(
        description="Per simulated policy, the hit ratio (0..1) at each capacity."
    )
    exact: bool = Field(
        description="True: every simulation replayed the tier's whole stream (rate 1, no "
        "request lost to a sequence gap, the worker's buffer or the shadow queue); false: "
        "estimated from a sample (SHARDS), or from a stream with requests missing."
    )
    resolved: dict[str, list[bool]] = Field(
        description="Per policy, whether each capacity is at least 16 sampled blocks at the "
        "rate its simulation runs at (always at rate 1) and, on the LRU stack, at least as "
        "long as every request it replayed: otherwise the scaled tier no longer behaves as "
        "the real one, the point is a rough guess, and no verdict rests on it."
    )

    errors: dict[str, list[float]] = Field(
        description="Per policy, each hit ratio's standard error in points, from the sample "
        "itself: its misses' count and its scaled tier's size against the curve's slope "
        "there (offload/insight/uncertainty.py); 0 at rate 1. Verdicts hold a difference to "
        "its own error (their `error`)."
    )

    @classmethod
    def of(cls, curve: HitRatioCurve, basis: CurveBasis) -> InsightCurve:
        assert curve.current is not None
        return cls(
            capacities=list(curve.capacities),
            multiples=list(curve.multiples() or ()),
            current_blocks=curve.current,
            current_index=curve.capacities.index(curve.current),
            hit_ratios={policy: list(ratios) for policy, ratios in curve.hit_ratios.items()},
            exact=curve.exact,
            resolved={
                policy: [basis.simulations[policy].resolves(c) for c in curve.capacities]
                for policy in curve.hit_ratios
            },
            errors={
                policy: [100 * e for e in basis.simulations[policy].point_errors(curve, policy)]
                for policy in curve.hit_ratios
            },
        )


class SampleStreamInfo(BaseModel):
    """The sampled access stream's health: what it samples, what arrived, what was shed."""

    rate: float | None = Field(description="The worker's sampling rate (share of blocks).")
    seed: int | None
    stack_rate: float | None = Field(
        description="The rate the LRU stack runs at: the worker's, or lower to fit the memory "
        "bound (null: LRU not simulated)."
    )
    shadow_rate: float | None = Field(
        description="The rate the other policies' shadow tiers run at (null: none simulated)."
    )
    window_rate: float | None = Field(
        default=None,
        description="The rate the optimum's window runs at: the worker's, or lower to fit its "
        "share of the memory bound.",
    )
    frames: int
    missed_frames: int = Field(description="Sample frames lost in sequence gaps.")
    resets: int = Field(
        description="Times the curve started over: the stream's rate, seed, policy, "
        "capacity or block size changed, or the publisher restarted."
    )
    requests: int
    block_refs: int = Field(description="Block references the frames stand for.")
    sampled_refs: int = Field(description="Sampled block references received.")
    simulated_refs: dict[str, int] = Field(
        description="Per policy, the sampled references its simulation replayed since the "
        "last reset (after any narrowing of the rate)."
    )
    worker_shed_requests: int = Field(description="Requests the worker's full buffer left out.")
    worker_shed_block_refs: int
    shadow_shed_frames: int = Field(
        description="Frames the shadow tiers' queue had no room for (their requests are in "
        "the LRU curve, not in the other policies')."
    )
    shadow_shed_block_refs: int
    last_ts: float | None = Field(description="When the latest sample frame was taken.")
    since: float | None = Field(
        description="When the stream simulated now began (its first frame's time): the "
        "curve covers everything since, not a recent window; it starts over with a new rate, "
        "seed, policy, capacity or block size, or a restarted publisher."
    )

    @classmethod
    def of(cls, insight: PublisherInsight, reading: InsightReading) -> SampleStreamInfo:
        stream, rates = reading.stream, reading.rates
        return cls(
            rate=None if stream is None else stream.rate,
            seed=None if stream is None else stream.seed,
            stack_rate=rates.stack,
            shadow_rate=rates.shadows,
            window_rate=rates.window,
            frames=insight.frames,
            missed_frames=insight.missed_frames,
            resets=insight.resets,
            requests=insight.requests,
            block_refs=insight.block_refs,
            sampled_refs=insight.sampled_refs,
            simulated_refs=reading.simulated_refs,
            worker_shed_requests=insight.worker_shed_requests,
            worker_shed_block_refs=insight.worker_shed_block_refs,
            shadow_shed_frames=insight.shadow_shed_frames,
            shadow_shed_block_refs=insight.shadow_shed_block_refs,
            last_ts=insight.ts,
            since=insight.since,
        )


class WindowOptimumInfo(BaseModel):
    """A clairvoyant cache of the tier's size beside the tier's policy, over the last sampled
    references: both replayed from empty at the tier's capacity scaled by the rate."""

    hit_ratio: float = Field(
        description="The clairvoyant cache's hit ratio (0..1) over the window: farthest next "
        "use with bypass (the offline optimum of `kvscope replay --policy opt`), corrected for "
        "the sample's size as the curve is."
    )
    tier_hit_ratio: float = Field(
        description="The tier's policy over the same window, from empty, at the same size: "
        "what `efficiency` sets against `hit_ratio`."
    )
    policy: str = Field(
        description="The policy replayed: the tier's where the curve simulates it "
        "(KVSCOPE_INSIGHT_POLICIES), else lru, standing in (`efficiency` is then null)."
    )
    capacity_blocks: int = Field(description="The scaled capacity both were replayed at.")
    rate: float = Field(description="The window's sampling rate.")
    window_refs: int = Field(description="Sampled references in the window computed.")
    window_block_refs: int = Field(
        description="Block references (sampled or not) the window's requests stood for."
    )
    max_window_refs: int = Field(
        description="The window's bound in sampled references: 16 scaled capacities' worth, "
        "at least 512 (its memory counts in `memory.bytes`)."
    )
    computed_at: float = Field(description="When it was computed (unix seconds).")
    compute_seconds: float = Field(
        description="The CPU time the two replays and their error took (on the shadow thread, "
        "within its share)."
    )
    runs: int = Field(description="Computations since the sidecar started.")

    @classmethod
    def of(cls, computed: ComputedOptimum, runs: int) -> WindowOptimumInfo:
        result = computed.result
        return cls(
            hit_ratio=result.optimum_ratio,
            tier_hit_ratio=result.tier_ratio,
            policy=result.policy,
            capacity_blocks=result.capacity,
            rate=result.rate,
            window_refs=result.refs,
            window_block_refs=result.block_refs,
            max_window_refs=computed.max_refs,
            computed_at=computed.ts,
            compute_seconds=result.seconds,
            runs=runs,
        )


class InsightMemory(BaseModel):
    """The curve simulations' memory, estimated per block held."""

    held_blocks: int
    bytes: int = Field(description="Estimated bytes the simulations hold now.")
    max_bytes: int = Field(description="The bound (KVSCOPE_INSIGHT_MAX_BYTES, per publisher).")


class VerdictInfo(BaseModel):
    """One finding, as a sentence and as the figures it states."""

    kind: VerdictKind = Field(
        description="warming_up: too little seen yet; fits: the tier has never been full "
        "over twice its size in sampled references, so every miss was a first use and "
        "neither a larger tier nor another policy would hit more (said in place of the "
        "doubling and policy verdicts); sample_small: too few sampled blocks "
        "for a verdict (the sentence says the rate that would do); long_requests: requests "
        "longer than the tier spoken of reached the LRU stack, which cannot model a tier "
        "refusing them; unchained: the sample shows blocks recurring behind other prefixes "
        "(ids not chained as vLLM's hashes are), so the curve does not predict the tier "
        "(said in place of the size and policy verdicts; `share`: the sampled blocks met "
        "again behind another predecessor); not_simulated: the tier's "
        "policy is not among the curve's; shed: a simulation lost over a tenth of the stream "
        "to a full shadow queue; stale: the curve is not of the tier as it is now (nothing "
        "has come from the publisher lately, or its stats frame reports another tier than "
        "its sample); capacity, policy, optimum, admission, stranded: findings."
    )
    text: str
    policy: str | None = None
    multiple: float | None = Field(
        default=None,
        description="The capacity spoken of over the tier's: the curve's `multiples` entry at "
        "`blocks` (capacities are whole blocks, so halving 5 blocks is 2 of them, 0.4).",
    )
    points: float | None = Field(
        default=None, description="Points of hit ratio gained (negative: lost)."
    )
    share: float | None = Field(
        default=None,
        description="A share in 0..1 (dead writes; the efficiency against the optimum; the "
        "stream's share a simulation shed; the share of the tier a stream that fits it "
        "touched; the share of sampled blocks met again behind another, less recent "
        "predecessor that a tier of half the size may have let go, on an unchained stream).",
    )
    blocks: int | None = None
    medium: str | None = None
    error: float | None = Field(
        default=None,
        description="The standard error of `points` from the sample, in points (capacity and "
        "policy verdicts on a sampled curve), or of `share` (optimum verdicts below rate 1): "
        "a change, or a gap to the optimum, within it is said as such, one wider than a "
        "point is said with it.",
    )

    @classmethod
    def of(cls, verdict: Verdict) -> VerdictInfo:
        return cls.model_validate(verdict, from_attributes=True)


class PublisherInsightInfo(BaseModel):
    """One publisher: its curve, its stream's health, stranded blocks, dead writes, verdicts."""

    publisher: str
    engine_id: str | None
    rank: int | None
    policy: str | None = Field(description="The tier's policy, as the worker reports it.")
    capacity_blocks: int | None
    measured_hit_ratio: float | None = Field(
        description="The tier's own hit ratio (lookups), to set beside the curve's at 1x."
    )
    curve: InsightCurve | None = Field(
        description="Null until a simulation has replayed a sampled reference (while frames "
        "come with none sampled, a warming_up verdict says so)."
    )
    stream: SampleStreamInfo | None = Field(description="Null: the publisher sends no sample.")
    memory: InsightMemory | None
    stranded: dict[str, int] = Field(
        description="Per medium, blocks held that no prefix lookup reaches."
    )
    dead_write_blocks: int | None
    stores_completed: int | None
    dead_write_ratio: float | None = Field(
        description="Dead writes (stored, evicted unread) over stores completed."
    )
    optimum: WindowOptimumInfo | None = Field(
        default=None,
        description="A clairvoyant cache of the same size over the last sampled references; "
        "null until the window holds enough of them.",
    )
    efficiency: float | None = Field(
        default=None,
        description="The tier's policy's hit ratio over the optimum's, on the same window "
        "(0..1: the share of the reachable hits it gets); null without an optimum, when lru "
        "stood in for a policy the curve does not simulate, when the optimum hits nothing, "
        "when the tier is too few sampled blocks at the window's rate (a sample_small "
        "verdict says so), or when the stream's blocks do not form prefix chains (an "
        "unchained verdict says so: both replays then count hits the tier does not get).",
    )
    efficiency_error: float | None = Field(
        default=None,
        description="The standard error of `efficiency` in points, from the blocks the "
        "window's sample drew, the two replays paired on them "
        "(offload/insight/uncertainty.py, `quotient_error`); 0 at rate 1, null where "
        "`efficiency` is. The optimum verdict holds the efficiency to it (its `error`).",
    )
    miss_reasons: dict[str, int] | None = Field(
        default=None,
        description="Blocks lookups lost, by reason (cold, evicted, not_admitted, no_room, "
        "in_flight, prefix_lost), from the worker's latest stats frame; null before one "
        "carries them.",
    )
    admission_candidates: dict[str, float] | None = Field(
        default=None,
        description="Under the gated policy, each admission candidate's recent hit ratio in "
        "its model (what the tier would hit admitting as that candidate), from the worker's "
        "latest stats frame; null under other policies.",
    )
    admission_followed: str | None = Field(
        default=None, description="Under the gated policy, the candidate the tier admits as."
    )
    verdicts: list[VerdictInfo]

    @classmethod
    def of(
        cls, state: PublisherState, stranded: dict[str, int], max_bytes: int, now: float
    ) -> PublisherInsightInfo:
        frame, worker, insight = state.stats, state.worker, state.insight
        reading, stream_info = None, None
        if insight is not None:
            reading = insight.reading()
            stream_info = SampleStreamInfo.of(insight, reading)
        stream = None if reading is None else reading.stream
        policy = stream.policy if stream else (frame.config.policy if frame else None)
        capacity = stream.capacity if stream else (frame.config.capacity_blocks if frame else None)
        curve, basis = (None, None) if reading is None else (reading.curve, reading.basis)
        dead_ratio = None
        if worker is not None and worker.stores_completed:
            dead_ratio = worker.dead_write_blocks / worker.stores_completed
        memory = None
        if insight is not None:
            held, size = insight.memory()
            memory = InsightMemory(held_blocks=held, bytes=size, max_bytes=max_bytes)
        computed = None if reading is None else reading.optimum
        result = None if computed is None else computed.result
        efficiency = window_efficiency(result, policy, capacity, basis)
        efficiency_error = (
            None
            if efficiency is None or result is None or result.efficiency_error is None
            else 100 * result.efficiency_error
        )
        verdicts = [
            *(_stale(state, stream, now) if insight is not None else []),
            *curve_verdicts(curve, policy, basis),
            *optimum_verdict(
                result, policy, capacity, None if stream is None else stream.rate, basis
            ),
            *admission_verdict(dead_ratio, efficiency, efficiency_error),
            *(
                candidate_verdict(worker.admission_hit_ratios, worker.admission_followed)
                if worker is not None
                else []
            ),
            *stranded_verdicts(stranded),
        ]
        return cls(
            publisher=state.name,
            engine_id=None if frame is None else frame.engine_id,
            rank=None if frame is None else frame.rank,
            policy=policy,
            capacity_blocks=capacity,
            measured_hit_ratio=(
                worker.lookup_hit_blocks / worker.lookup_blocks
                if worker is not None and worker.lookup_blocks
                else None
            ),
            curve=None if curve is None or basis is None else InsightCurve.of(curve, basis),
            stream=stream_info,
            memory=memory,
            stranded=stranded,
            dead_write_blocks=None if worker is None else worker.dead_write_blocks,
            stores_completed=None if worker is None else worker.stores_completed,
            dead_write_ratio=dead_ratio,
            optimum=(
                None
                if computed is None or insight is None
                else WindowOptimumInfo.of(computed, insight.optimum_runs)
            ),
            efficiency=efficiency,
            efficiency_error=efficiency_error,
            miss_reasons=worker.miss_blocks if worker is not None and worker.miss_blocks else None,
            admission_candidates=(
                worker.admission_hit_ratios
                if worker is not None and worker.admission_hit_ratios
                else None
            ),
            admission_followed=None if worker is None else worker.admission_followed,
            verdicts=[VerdictInfo.of(v) for v in verdicts],
        )


def _stale(state: PublisherState, stream: SampledStream | None, now: float) -> list[Verdict]:
    """Whether the publisher's curve is of its tier as it is now (``stale_verdicts``): its
    silence, and its latest stats frame's tier against its sample's, where that stats frame
    is no older than the latest sample frame (both by the worker's clock)."""
    silent_s = None if state.last_frame_at is None else now - state.last_frame_at
    frame, insight = state.stats, state.insight
    sampled = None if stream is None else Tier(stream.policy, stream.capacity, stream.block_size)
    reported = None
    if frame is not None and insight is not None and insight.ts is not None:
        config = frame.config
        if frame.ts >= insight.ts:
            reported = Tier(config.policy, config.capacity_blocks, config.block_size)
    return stale_verdicts(silent_s, CONNECTED_WITHIN_S, sampled, reported)


class ShadowQueueInfo(BaseModel):
    """The queue between ingest and the shadow tiers' thread (all publishers)."""

    bytes: int = Field(description="Estimated bytes waiting.")
    max_bytes: int = Field(description="The bound (KVSCOPE_INSIGHT_QUEUE_BYTES).")
    items: int
    shed: int = Field(
        description="Frames shed because the queue, or their publisher's share of it, was full."
    )

    @classmethod
    def of(cls, queue: ShadowQueue) -> ShadowQueueInfo:
        return cls(bytes=queue.bytes, max_bytes=queue.max_bytes, items=queue.items, shed=queue.shed)


class InsightResponse(BaseModel):
    """Why each publisher's tier hits what it hits."""

    ts: float
    publishers: list[PublisherInsightInfo]
    memory_bytes: int = Field(description="Estimated bytes of every publisher's simulations.")
    queue: ShadowQueueInfo
