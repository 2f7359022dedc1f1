"""One publisher's worker counters: totals from its latest stats frame, rates from the two latest.

Computed once per stats frame, on the ingest thread, so a rate spans two
consecutive frames of one publisher whoever reads it and however often.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from app.state.histogram_quantile import increase, quantile
from offload.telemetry import metrics as m
from offload.wire.stats_frame import HistogramSnapshot, StatsFrame

LATENCY_QUANTILES: Final = ("0.5", "0.99")
"""The transfer-latency quantiles kept per direction (as the label values history shows)."""


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Totals since the worker started; ``*_per_s`` None until a second frame (or after a reset)."""

    lookup_hit_blocks: int = 0
    lookup_blocks: int = 0
    evictions: dict[str, int] = field(default_factory=dict)
    miss_blocks: dict[str, int] = field(default_factory=dict)
    """Blocks lookups lost, by reason (cold, evicted, not_admitted, no_room, in_flight,
    prefix_lost)."""
    stores_completed: int = 0
    loads: int = 0
    dropped_frames: int = 0
    dead_write_blocks: int = 0
    stores_per_s: float | None = None
    loads_per_s: float | None = None
    evictions_per_s: float | None = None
    transfer_bytes_per_s: dict[str, float] = field(default_factory=dict)
    transfer_latency_s: dict[tuple[str, str], float] = field(default_factory=dict)
    """(direction, quantile) -> seconds, over the jobs finished between the two frames."""
    admission_hit_ratios: dict[str, float] = field(default_factory=dict)
    """Under the gated policy: each admission candidate's recent hit ratio in its model."""
    admission_followed: str | None = None
    """Under the gated policy: the candidate the tier runs as."""

    @classmethod
    def between(cls, previous: StatsFrame | None, frame: StatsFrame) -> WorkerStats:
        """Totals of ``frame``; rates from ``previous`` (the publisher's frame before it) to it."""
        seconds = 0.0 if previous is None else frame.ts - previous.ts

        def rate(spec: m.MetricSpec) -> float | None:
            if previous is None:
                return None
            return _rate(_total(previous, spec), _total(frame, spec), seconds)

        transfer: dict[str, float] = {}
        if previous is not None:
            moved = _by_label(previous, m.TRANSFER_BYTES_TOTAL, "direction")
            for direction, value in _by_label(frame, m.TRANSFER_BYTES_TOTAL, "direction").items():
                per_s = _rate(moved.get(direction, 0.0), value, seconds)
                if per_s is not None:
                    transfer[direction] = per_s
        followed = _candidates(frame, m.ADMISSION_CANDIDATE_FOLLOWED)
        return cls(
            lookup_hit_blocks=int(_total(frame, m.LOOKUP_HIT_BLOCKS_TOTAL)),
            lookup_blocks=int(_total(frame, m.LOOKUP_BLOCKS_TOTAL)),
            evictions={
                reason: int(value)
                for reason, value in _by_label(frame, m.EVICTED_BLOCKS_TOTAL, "reason").items()
            },
            miss_blocks={
                reason: int(value)
                for reason, value in _by_label(frame, m.LOOKUP_MISS_BLOCKS_TOTAL, "reason").items()
            },
            stores_completed=int(_total(frame, m.STORE_COMPLETED_BLOCKS_TOTAL)),
            loads=int(_total(frame, m.LOAD_BLOCKS_TOTAL)),
            dropped_frames=int(_total(frame, m.PUBLISHER_DROPPED_FRAMES_TOTAL)),
            dead_write_blocks=int(_total(frame, m.DEAD_WRITE_BLOCKS_TOTAL)),
            stores_per_s=rate(m.STORE_COMPLETED_BLOCKS_TOTAL),
            loads_per_s=rate(m.LOAD_BLOCKS_TOTAL),
            evictions_per_s=rate(m.EVICTED_BLOCKS_TOTAL),
            transfer_bytes_per_s=transfer,
            transfer_latency_s={} if previous is None else _latency(previous, frame),
            admission_hit_ratios=_candidates(frame, m.ADMISSION_CANDIDATE_HIT_RATIO),
            admission_followed=next((name for name, on in followed.items() if on == 1), None),
        )


def block_bytes_by_medium(frame: StatsFrame) -> dict[str, int]:
    """The bytes of one block on each medium the frame's worker holds blocks on."""
    block_bytes = frame.config.bytes_per_block
    if block_bytes is None:
        return {}
    return {
        sample.labels["medium"]: block_bytes
        for sample in frame.gauges
        if sample.name == m.BLOCKS_CAPACITY.name and "medium" in sample.labels
    }


def _latency(previous: StatsFrame, frame: StatsFrame) -> dict[tuple[str, str], float]:
    """Transfer-time quantiles per direction of the jobs that finished between two frames."""
    before = _durations(previous)
    latency: dict[tuple[str, str], float] = {}
    for direction, after in _durations(frame).items():
        counts = increase(before.get(direction), after)
        if counts is not None:
            for q in LATENCY_QUANTILES:
                seconds = quantile(float(q), after.buckets, counts)
                if 0 <= seconds <= MAX_LATENCY_S:
                    latency[direction, q] = seconds
    return latency


MAX_LATENCY_S: Final = 2.0**63
"""A quantile outside 0 to this is the worker's bucket bounds, not any transfer's time: left
out, so that the history's means of it stay finite (one near the largest float made a point
of the history infinite)."""


def _durations(frame: StatsFrame) -> dict[str, HistogramSnapshot]:
    """The frame's transfer-duration histogram per direction (the first, if one is repeated)."""
    found: dict[str, HistogramSnapshot] = {}
    for histogram in frame.histograms:
        if histogram.name == m.TRANSFER_DURATION_SECONDS.name:
            found.setdefault(histogram.labels.get("direction", ""), histogram)
    return found


CANDIDATE_NAME: Final = re.compile(r"[a-z0-9_]{1,64}")
"""An admission candidate's name as kvscope writes them (``Candidate.label``); others are
not shown (the sentence a verdict builds from it is read by people and pages)."""


def _candidates(frame: StatsFrame, spec: m.MetricSpec) -> dict[str, float]:
    """A per-candidate gauge in 0..1, the first medium's value each; a candidate whose name
    or value is not one kvscope sends is left out."""
    found: dict[str, float] = {}
    for sample in frame.gauges:
        if sample.name != spec.name:
            continue
        name = sample.labels.get("candidate", "")
        if CANDIDATE_NAME.fullmatch(name) and 0 <= sample.value <= 1:  # NaN fails too
            found.setdefault(name, sample.value)
    return found


def _total(frame: StatsFrame, spec: m.MetricSpec) -> float:
    return sum(sample.value for sample in frame.counters if sample.name == spec.name)


def _by_label(frame: StatsFrame, spec: m.MetricSpec, label: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for sample in frame.counters:
        if sample.name == spec.name:
            key = sample.labels.get(label, "")
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


MAX_RATE: Final = 2.0**63
"""A larger rate is two frames' timestamps a hair apart, not a rate: None, which sums stay
finite without (an infinite rate would make the stats answer unencodable)."""


def _rate(before: float, after: float, seconds: float) -> float | None:
    """A counter's rate, or None over no time, across a reset (a restarted worker), or absurd."""
    if not seconds > 0 or after < before:
        return None
    per_s = (after - before) / seconds
    return per_s if per_s <= MAX_RATE else None
