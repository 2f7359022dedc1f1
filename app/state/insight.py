"""One publisher's sampled access stream and the hit-ratio curve built from it.

The worker sends a spatial sample of its tier's block references (sample
frames, offload/wire/sample_frame.py); this replays it on simulated tiers
scaled by the rate (offload/insight: SHARDS). LRU is one recency stack that
answers every capacity at once, cheap enough for the ingest thread; every
other policy is a set of shadow tiers (whole managers of its own, never
the worker's tier), too slow for the ingest thread, so their share of each
frame goes to the shadow thread through a bounded queue
(app/state/insight_queue.py) and is shed, counted, when that thread falls
behind. The distance to the optimum (offload/insight/window_optimum.py) keeps
the last references of the sample on the ingest thread (an append per
request) and replays them on the shadow thread, through the same queue,
once half of them are new.

The simulations are rebuilt from nothing when the stream they model
changes: another rate, seed, policy, capacity or block size, or a publisher
that restarted (its sample sequence went back). Their memory is bounded by
``InsightConfig.max_bytes``, estimated per block held (in a shadow tier, what
its policy states a tier of that many keeps at most, histories full: offload/insight/shadow.py):
where the tier is too large for it at the worker's rate, the sample is sampled further (the
same hash test at a lower rate keeps a subset of the worker's blocks), and
the curve is corrected for that rate as for the worker's.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress
from typing import Final

from app.settings import InsightConfig
from app.state.insight_queue import (
    LIST_BYTES,
    Pace,
    ShadowQueue,
    ShadowWork,
    requests_bytes,
)
from app.state.insight_verdicts import HALVING, CurveBasis, Simulation
from offload.base import BlockHash
from offload.cpu.policies.registry import policy_names
from offload.insight.curve import HitRatioCurve, scaled_capacities
from offload.insight.estimator import STACK_POLICY, CurveEstimator, scaled_tiers
from offload.insight.prefix_check import PrefixCheck
from offload.insight.sampling import SpatialSampler
from offload.insight.shadow import max_bytes
from offload.insight.window_optimum import (
    WINDOW_CAPACITIES,
    WindowOptimum,
    WindowResult,
)
from offload.wire.sample_frame import MIN_SAMPLE_RATE, SampleFrame

STACK_BYTES_PER_BLOCK: Final = 512
"""Estimated memory of one hash on the LRU stack (its segment's ordered-dict entry, a set
entry and the hash, 64 bytes at the longest) and its predecessor and last use in the stack's
prefix check (a dict entry and a pair), each table at its emptiest between resizes: measured
with tracemalloc, at most 476 bytes, rounded up (tests/app/test_insight_memory.py)."""
PREFIX_CHECK_BYTES_PER_BLOCK: Final = 320
"""Estimated memory of the prefix check alone (where no stack runs it, the shadow tiers'
estimator does) per block of its bound: a dict entry and, with nothing else keeping them,
the hash and its predecessor, 64 bytes each at the longest, and the pair of it and its last
use: measured with tracemalloc at most 220 bytes, rounded up with room for other Python
builds' layouts (tests/app/test_insight_memory.py)."""
WINDOW_BYTES_PER_REF: Final = 512
"""Estimated memory of one sampled reference in the optimum's window, with its share of a
recomputation's tables and tier, measured with tracemalloc; rounded up."""
STACK_SHARE: Final = 0.25
"""The share of the memory bound given to the stack when shadow tiers share it."""
RATE_HALVINGS: Final = 64
"""Halvings of the range the shadow tiers' rate is searched in: every tier is of one slot
below a rate of 0.5 / its capacity, which fits, so the search ends above 0 for capacities
below 2**62, and within 2**-64 of the worker's rate of the highest that fits."""
WINDOW_SHARE: Final = 0.25
"""The share of the memory bound given to the optimum's window; the stack and the shadow
tiers share the rest."""
STACK_HOLD_REFS: Final = 16_384
"""The most sampled references the stack replays per hold of the lock (a longer request
alone): a frame can carry over a million (max_message_bytes of hashes), over a second of
replay, and each reader of the curve (GET /api/v1/insight, /metrics) waits out a hold.
A frame of the usual size (hundreds of requests) is one hold."""
MAX_SEQ_JUMP: Final = 2**32
"""A forward jump of the sample sequence beyond this is a new sequence, as for KV batches."""


@dataclass(frozen=True, slots=True)
class SampledStream:
    """What a sample frame says its stream is: a change rebuilds the simulations.

    The block size is part of it: blocks of another size are other hashes, and a capacity
    in them is another amount of KV, so no simulation of the old stream speaks of the new.
    """

    rate: float
    seed: int
    policy: str
    capacity: int
    block_size: int


@dataclass(frozen=True, slots=True)
class Rates:
    """The rates the simulations run at: the worker's, or lower to fit the memory bound."""

    stack: float | None
    shadows: float | None
    window: float | None


@dataclass(frozen=True, slots=True)
class ComputedOptimum:
    """One computation of the optimum over the window: what it found, when, the window's bound."""

    result: WindowResult
    ts: float
    max_refs: int


@dataclass(frozen=True, slots=True)
class InsightReading:
    """What a reader shows of a publisher's insight, read at one moment: read one after the
    other, a rebuild or a shadow replay in between set one moment's curve against another's
    basis, stream or optimum. ``curve`` is None before a simulation replayed a sampled
    reference, ``basis`` before a stream is simulated."""

    stream: SampledStream | None
    rates: Rates
    curve: HitRatioCurve | None
    basis: CurveBasis | None
    optimum: ComputedOptimum | None

    @property
    def simulated_refs(self) -> dict[str, int]:
        """Sampled references each policy's simulation has replayed."""
        if self.basis is None:
            return {}
        return {policy: sim.sampled_refs for policy, sim in self.basis.simulations.items()}


class PublisherInsight:
    """A publisher's sampled stream: its health counts and its curve estimators.

    ``receive`` runs on the ingest thread (the stack, and queueing the
    shadows' share); the shadow thread runs what it queued; readers call
    ``reading`` and ``memory``. ``lock`` guards the estimators; the counts are
    plain ints written by the ingest thread only.
    """

    def __init__(self, config: InsightConfig, queue: ShadowQueue) -> None:
        self.config = config
        self.queue = queue
        self.lock = threading.Lock()
        self.stream: SampledStream | None = None
        self.rates = Rates(None, None, None)
        self.generation = 0
        self.last_seq: int | None = None
        self.ts: float | None = None
        self.since: float | None = None
        """The first frame's time of the stream simulated now: the curve covers it since."""
        self.frames = 0
        self.missed_frames = 0
        """Sample frames lost in gaps of the sequence (their requests are in no simulation)."""
        self.resets = 0
        """Times the simulations started over: a new stream, or a restarted publisher."""
        self.requests = 0
        self.block_refs = 0
        self.sampled_refs = 0
        self.worker_shed_requests = 0
        self.worker_shed_block_refs = 0
        """What the worker's full buffer left out, summed over its frames (and restarts)."""
        self._worker_shed = (0, 0)  # the counts of the worker's latest frame
        self.shadow_shed_frames = 0
        self.shadow_shed_block_refs = 0
        """Frames (and the block references they stood for) the shadow queue had no room for."""
        self._shadow_policies = [p for p in config.policies if p != STACK_POLICY]
        self._stack: CurveEstimator | None = None
        self._stack_sampler: SpatialSampler | None = None
        self._longest_stacked = 0
        """The most blocks of a request of this stream with a block on the stack."""
        self._shadows: CurveEstimator | None = None
        self._shadows_shed = 0
        """Block references of this stream the shadow queue had no room for."""
        self._lossless = True
        """Whether the simulations have every request of this stream: no frame missed, none
        shed by the worker or the shadow queue (a replay at rate 1 is then exact)."""
        self._stream_block_refs = 0
        """Block references of this stream's frames, replayed, queued or shed."""
        self._shadow_sampler: SpatialSampler | None = None
        self._window: WindowOptimum | None = None
        self._window_sampler: SpatialSampler | None = None
        self._window_queued = False
        self.optimum: ComputedOptimum | None = None
        """The optimum's latest computation over the window; None before the first."""
        self.optimum_runs = 0
        """Computations of the optimum since the sidecar started (every stream)."""

    # --- the ingest thread ------------------------------------------------------------

    def receive(self, seq: int, frame: SampleFrame) -> None:
        """Apply one sample frame: the stack now, the shadow tiers' share queued."""
        last = self.last_seq
        missed = 0
        # A restarted publisher: what it sampled before is gone. Its stream is replaced by
        # the rebuild, under the lock: forgotten here, a reader would read the old curve and
        # optimum with no stream.
        restarted = last is not None and not last < seq <= last + MAX_SEQ_JUMP
        if restarted:
            # Its worker's counts start again from 0: all of what this frame carries is new,
            # even where it is no less than the old worker's last (which a fall cannot tell).
            self._worker_shed = (0, 0)
        elif last is not None:
            missed = seq - last - 1
        self.missed_frames += missed
        self.last_seq = seq
        config = frame.config
        stream = SampledStream(
            frame.rate, frame.seed, config.policy, config.capacity_blocks, config.block_size
        )
        if restarted or stream != self.stream:
            self.resets += 1 if self.frames else 0
            self._rebuild(stream)
            self.since = frame.ts
        worker_shed = _rise(self._worker_shed[0], frame.shed_requests)
        # Which stream a lost request was of is unknown: this one. What the worker shed before
        # this sidecar's first frame of it is older than any stream here.
        if missed or (worker_shed and last is not None):
            self._lossless = False
        block_refs = frame.block_refs  # a pass over the requests: taken once
        self._stream_block_refs += block_refs
        self._simulate(frame, block_refs)
        self.ts = frame.ts
        self.requests += len(frame.requests) + frame.unsampled_requests
        self.block_refs += block_refs
        self.sampled_refs += frame.sampled_refs
        # The worker's counts are its own since it started; the sidecar's only ever rise (a
        # count that went down is a restarted worker's, all of it new), since they are
        # exported as counters and a fall would read as a reset to rate().
        self.worker_shed_requests += worker_shed
        self.worker_shed_block_refs += _rise(self._worker_shed[1], frame.shed_block_refs)
        self._worker_shed = (frame.shed_requests, frame.shed_block_refs)
        # Counted last, once the frame is in every simulation (or queued for the shadow
        # thread) and in every total: a reader that sees it counted sees all of it.
        self.frames += 1

    def _simulate(self, frame: SampleFrame, block_refs: int) -> None:
        """The frame (standing for ``block_refs``) into the stack now, the shadow tiers'
        queue and the optimum's window."""
        # Each simulation takes the frame whole, in columns (the sampled blocks, the block
        # counts): a few calls and C-level passes per frame, no object per request.
        sampled = [r.sampled for r in frame.requests]
        refs = [r.block_refs for r in frame.requests]
        unsampled = frame.unsampled_block_refs
        if self._stack is not None:
            stack, stacked = self._stack, _narrowed(sampled, self._stack_sampler)
            longest = self._longest_stacked
            for part, lengths, part_refs in _holds(stacked, refs, block_refs):
                # Of the requests on the stack once this hold ends: a reader between two
                # holds reads no request the stack has not replayed yet.
                longest = max(longest, max(compress(lengths, part), default=0))
                with self.lock:
                    stack.record_many(part, part_refs)
                    self._longest_stacked = longest
        if self.rates.shadows is not None:
            shadowed = _narrowed(sampled, self._shadow_sampler)
            self._queue_shadows(shadowed, refs, unsampled, block_refs)
        if self._window is not None:
            self._record_window(_narrowed(sampled, self._window_sampler), refs, unsampled)

    def _rebuild(self, stream: SampledStream) -> None:
        """Start the simulations over for ``stream``, at rates that fit the memory bound."""
        rates = self._rates(stream)
        with self.lock:  # with the generation: the shadow thread reads them together
            self.stream = stream
            self.rates = rates
            self.generation += 1
            self._stack = (
                None
                if rates.stack is None
                else CurveEstimator(
                    stream.capacity, rates.stack, [STACK_POLICY], checked_from=HALVING
                )
            )
            self._stack_sampler = _sampler(stream, rates.stack)
            self._longest_stacked = 0
            self._shadows = None  # built by the shadow thread, which owns its cost
            self._shadows_shed = 0
            self._lossless = True
            self._stream_block_refs = 0
            self._shadow_sampler = _sampler(stream, rates.shadows)
            self._window = (
                None
                if rates.window is None
                else WindowOptimum(
                    stream.capacity,
                    rates.window,
                    _window_policy(stream.policy, self.config.policies),
                )
            )
            self._window_sampler = _sampler(stream, rates.window)
            self._window_queued = False
            self.optimum = None

    def _rates(self, stream: SampledStream) -> Rates:
        if stream.capacity < 1:
            return Rates(None, None, None)
        capacities = scaled_capacities(stream.capacity)
        stacked = STACK_POLICY in self.config.policies
        shadows = len(self._shadow_policies)
        window_bytes = self.config.max_bytes * WINDOW_SHARE
        window = min(
            stream.rate, window_bytes / WINDOW_BYTES_PER_REF / (WINDOW_CAPACITIES * stream.capacity)
        )
        curve_bytes = self.config.max_bytes - window_bytes
        stack_bytes = curve_bytes * (STACK_SHARE if shadows else 1.0)
        stack = (
            min(stream.rate, stack_bytes / STACK_BYTES_PER_BLOCK / capacities[-1])
            if stacked
            else None
        )
        shadow_bytes = curve_bytes - (stack_bytes if stacked else 0.0)
        # Without a stack the shadow tiers' estimator checks the prefixes, in their room.
        check_bytes = 0 if stacked else PREFIX_CHECK_BYTES_PER_BLOCK
        shadow = (
            self._shadow_rate(stream, capacities, shadow_bytes, check_bytes) if shadows else None
        )
        return Rates(stack, shadow, window)

    def _shadow_rate(
        self, stream: SampledStream, capacities: Sequence[int], room: float, check_bytes: int
    ) -> float:
        """The highest rate, at most the worker's, whose shadow tiers fit ``room`` bytes full,
        with ``check_bytes`` per block of their largest tier for a prefix check.

        A policy's bound grows with its tier's capacity, and a shadow tier's capacity
        with the rate (``scaled_blocks``), so the rate is found by halving the range
        ``RATE_HALVINGS`` times (a policy's bound is no straight line: gated's models stop
        growing). Where even tiers of one slot (rate 0) overflow the room, the lowest
        rate a worker may send is the least the shadows can do; short of that, the rate may
        go below it (a tier of 2**48 blocks at that rate would still hold millions).
        """
        policies = self._shadow_policies

        def fits(rate: float) -> bool:
            tiers = scaled_tiers(rate, capacities, stacked=False)
            return max_bytes(policies, tiers) + check_bytes * tiers[-1] <= room

        if not fits(0.0):
            return min(stream.rate, MIN_SAMPLE_RATE)
        low, high = 0.0, stream.rate
        if fits(high):
            return high
        for _ in range(RATE_HALVINGS):
            middle = (low + high) / 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low

    def _queue_shadows(
        self, sampled: list[Sequence[BlockHash]], refs: list[int], unsampled: int, block_refs: int
    ) -> None:
        """The frame for the shadow tiers (``block_refs``: all it stands for), or counted shed."""
        generation = self.generation

        def apply(pace: Pace) -> None:
            self._run_shadows(generation, sampled, refs, unsampled, pace)

        def shed() -> None:  # on the ingest thread, as the rebuilds: no generation to check
            self.shadow_shed_frames += 1
            self.shadow_shed_block_refs += block_refs
            self._shadows_shed += block_refs
            self._lossless = False

        self.queue.put(ShadowWork(apply, shed, requests_bytes(sampled, refs), self))

    def _record_window(
        self, sampled: list[Sequence[BlockHash]], refs: list[int], unsampled: int
    ) -> None:
        """The frame into the optimum's window; its recomputation queued once it is due."""
        window = self._window
        assert window is not None
        with self.lock:
            window.record(sampled, refs, unsampled)
            due = window.due() and not self._window_queued
        if not due:
            return
        self._window_queued = True
        generation = self.generation

        def apply(pace: Pace) -> None:
            self._run_window(generation, pace)

        def shed() -> None:
            self._window_queued = False  # the shadows are behind: asked again with a later frame

        self.queue.put(ShadowWork(apply, shed, LIST_BYTES, self))

    # --- the shadow thread ------------------------------------------------------------

    def _run_shadows(
        self,
        generation: int,
        sampled: list[Sequence[BlockHash]],
        refs: list[int],
        unsampled: int,
        pace: Pace,
    ) -> None:
        """One frame through the shadow tiers, a request at a time (readers wait one at most)."""
        with self.lock:
            stream, rate = self.stream, self.rates.shadows
            if generation != self.generation or stream is None or rate is None:
                return
            if self._shadows is None:
                self._shadows = CurveEstimator(
                    stream.capacity,
                    rate,
                    self._shadow_policies,
                    check_prefixes=self.rates.stack is None,  # else the stack checks them
                    checked_from=HALVING,
                )
            shadows = self._shadows
        for hashes, block_refs in chain(zip(sampled, refs, strict=True), [((), unsampled)]):
            with self.lock:
                if generation != self.generation:
                    return
                shadows.record(hashes, block_refs)
            pace()

    def _run_window(self, generation: int, pace: Pace) -> None:
        """The optimum and the tier's policy over the window as it is now, outside the lock."""
        with self.lock:
            window = self._window
            if generation != self.generation or window is None:
                return
            requests, block_refs = window.take()
        try:
            result = window.compute(requests, block_refs, pace)
        finally:
            # Only this stream's request is done: a rebuild while it ran cleared the flag,
            # and the new stream's window may have queued its own since.
            with self.lock:
                if generation == self.generation:
                    self._window_queued = False
        with self.lock:
            if generation == self.generation:
                self.optimum = ComputedOptimum(result, time.time(), window.max_refs)
                self.optimum_runs += 1

    # --- readers ----------------------------------------------------------------------

    def reading(self) -> InsightReading:
        """The curve, its basis, the stream they model and the optimum, at one moment."""
        with self.lock:
            return InsightReading(
                self.stream, self.rates, self._curve(), self._basis(), self.optimum
            )

    def _curve(self) -> HitRatioCurve | None:
        """The curve so far, every simulated policy that has replayed a sampled reference; None
        before (with none, a ratio adjusted for the sample is 1.0 at every capacity)."""
        parts = [
            estimator.curve()
            for estimator in (self._stack, self._shadows)
            if estimator is not None and estimator.sampled_refs > 0
        ]
        # Only parts of one stream: a simulation of another capacity is never mixed in.
        parts = [part for part in parts if part.capacities == parts[0].capacities]
        if not parts:
            return None
        ratios = {policy: ratios for part in parts for policy, ratios in part.hit_ratios.items()}
        ordered = {p: ratios[p] for p in self.config.policies if p in ratios}
        exact = self._lossless and all(part.exact for part in parts)
        return HitRatioCurve(parts[0].capacities, ordered, parts[0].current, exact)

    def _basis(self) -> CurveBasis | None:
        """What the curve rests on, for its verdicts; None before a stream is simulated. The
        shadow tiers count before the shadow thread builds them (with nothing replayed, and
        what was shed): a queue that sheds every frame never builds them."""
        rates, stream = self.rates, self.stream
        if stream is None or (rates.stack is None and rates.shadows is None):
            return None
        simulations: dict[str, Simulation] = {}
        if self._stack is not None:
            stack = self._stack
            simulations[STACK_POLICY] = Simulation(
                stack.rate,
                stack.sampled_refs,
                stack.block_refs,
                0,
                stack.touched_blocks,
                True,
                self._longest_stacked,
                *_prefix_counts(stack.prefix_check),
            )
        if rates.shadows is not None:
            shadows = self._shadows
            simulation = (
                Simulation(rates.shadows, 0, 0, self._shadows_shed, 0, False)
                if shadows is None
                else Simulation(
                    shadows.rate,
                    shadows.sampled_refs,
                    shadows.block_refs,
                    self._shadows_shed,
                    shadows.touched_blocks,
                    False,
                    0,
                    *_prefix_counts(shadows.prefix_check),
                )
            )
            simulations.update(dict.fromkeys(self._shadow_policies, simulation))
        policies = tuple(p for p in self.config.policies if p in simulations)
        return CurveBasis(simulations, policies, stream.rate, self._stream_block_refs)

    def memory(self) -> tuple[int, int]:
        """(held blocks, estimated bytes) of the simulations now; the bytes count the
        optimum's window (its references held), the blocks only the curve's."""
        with self.lock:
            stack = self._stack.held_blocks if self._stack is not None else 0
            shadows = self._shadows.held_blocks if self._shadows is not None else 0
            shadow_bytes = _shadow_bytes(self._shadows)
            window = self._window.refs if self._window is not None else 0
        size = stack * STACK_BYTES_PER_BLOCK + shadow_bytes
        return stack + shadows, size + window * WINDOW_BYTES_PER_REF


def _prefix_counts(check: PrefixCheck | None) -> tuple[int, int]:
    """An estimator's prefix check as (checked, broken); none counted without one."""
    return (0, 0) if check is None else (check.checked, check.broken)


def _shadow_bytes(shadows: CurveEstimator | None) -> int:
    """The shadow tiers' estimator's memory now: its tiers', and its prefix check's where it
    runs one (no stack)."""
    if shadows is None:
        return 0
    check = shadows.prefix_check
    checked = 0 if check is None else check.held_blocks * PREFIX_CHECK_BYTES_PER_BLOCK
    return shadows.shadow_bytes + checked


def _window_policy(policy: str, simulated: Sequence[str]) -> str:
    """The policy the window replays: the tier's where the curve simulates it (a policy
    whose sampled replay was checked against full ones), else LRU, whose replay on the
    sample stands for the full one (the efficiency is then the tier's no longer, and the
    verdicts say nothing of it)."""
    return policy if policy in simulated and policy in policy_names() else STACK_POLICY


def _sampler(stream: SampledStream, rate: float | None) -> SpatialSampler | None:
    """The test that narrows the worker's sample to ``rate``; None when no narrowing is needed."""
    if rate is None or rate >= stream.rate:
        return None
    return SpatialSampler(rate, stream.seed)


def _holds(
    sampled: list[Sequence[BlockHash]], refs: list[int], block_refs: int
) -> Iterator[tuple[list[Sequence[BlockHash]], list[int], int]]:
    """A frame's requests (their sampled blocks, their block counts) in consecutive parts of
    at most ``STACK_HOLD_REFS`` sampled references (a longer request alone), each with its
    requests' block counts and the block references it stands for, of the frame's
    ``block_refs``: the last part takes what the others leave, the requests with none
    sampled included, as a whole frame counts them after its requests."""
    ends = list(accumulate(map(len, sampled)))
    if not ends or ends[-1] <= STACK_HOLD_REFS:
        yield sampled, refs, block_refs
        return
    start, left = 0, block_refs
    while start < len(sampled):
        done = ends[start - 1] if start else 0
        stop = max(start + 1, bisect_right(ends, done + STACK_HOLD_REFS))
        part_refs = left if stop == len(sampled) else sum(refs[start:stop])
        left -= part_refs
        yield sampled[start:stop], refs[start:stop], part_refs
        start = stop


def _narrowed(
    sampled: list[Sequence[BlockHash]], sampler: SpatialSampler | None
) -> list[Sequence[BlockHash]]:
    """Each request's sampled blocks that ``sampler`` keeps (all of them without one)."""
    if sampler is None:
        return sampled
    return [sampler.sample(hashes) for hashes in sampled]


class InsightState:
    """The curves' shared parts: their bounds and the shadow thread's queue."""

    def __init__(self, config: InsightConfig | None = None) -> None:
        self.config = InsightConfig() if config is None else config
        self.queue = ShadowQueue(self.config.queue_bytes)

    def new_publisher(self) -> PublisherInsight:
        return PublisherInsight(self.config, self.queue)


def _rise(last: int, now: int) -> int:
    """What a cumulative count of the worker's added since its last frame."""
    return now - last if now >= last else now
