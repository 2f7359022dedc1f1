"""kvscope stats frames: a worker's metrics, published beside its KV events.

A frame is a snapshot of one worker's counters, gauges and histograms plus
the configuration needed to read them, on its own topic. The schema is
generic (a metric is a name, labels and a value) so a new metric needs no
schema change; frames are msgpack maps with a major ``version``.
docs/PROTOCOL.md gives the schema and its compatibility rules.
"""

from __future__ import annotations

import math
from itertools import pairwise

import msgspec

STATS_SCHEMA_VERSION = 1
"""The major schema version this module writes and reads."""


class UnsupportedStatsVersion(ValueError):
    """A frame's major version is one this decoder cannot read."""


class WorkerConfig(msgspec.Struct, kw_only=True, frozen=True):
    """What a reader needs to interpret the metrics: sizes and the policy.

    ``bytes_per_block`` is None where the worker has no KV geometry (e.g. a
    worker without real transfers).
    """

    policy: str
    capacity_blocks: int
    block_size: int
    bytes_per_block: int | None = None


class Sample(msgspec.Struct, kw_only=True, frozen=True):
    """One counter or gauge value; labels must be of low cardinality."""

    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    value: float


class HistogramSnapshot(msgspec.Struct, kw_only=True, frozen=True):
    """One histogram's state, Prometheus-style: ascending upper ``buckets``
    ending with ``math.inf``; ``counts[i]`` is the *cumulative* number of
    observations <= ``buckets[i]``, so ``counts[-1] == count``.

    Checked on construction and on decoding alike, so a malformed histogram is
    rejected where it is made or where it arrives, not when it is plotted.
    """

    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    buckets: list[float]
    counts: list[int]
    sum: float
    count: int

    def __post_init__(self) -> None:
        problem = _histogram_problem(self.buckets, self.counts, self.count)
        if problem:
            raise ValueError(f"histogram {self.name!r}: {problem}")


def _histogram_problem(buckets: list[float], counts: list[int], count: int) -> str | None:
    """What is wrong with a histogram's buckets and counts, or None."""
    if not buckets or len(buckets) != len(counts):
        return f"needs one count per bucket, got {len(buckets)} buckets, {len(counts)} counts"
    if any(upper <= lower for lower, upper in pairwise(buckets)):
        return "bucket bounds must be strictly ascending"
    if buckets[-1] != math.inf:
        return "the last bucket bound must be +inf"
    if any(later < earlier for earlier, later in pairwise(counts)):
        return "cumulative counts must not decrease"
    if counts[-1] != count:
        return f"the +inf bucket holds {counts[-1]} observations but count is {count}"
    return None


class StatsFrame(msgspec.Struct, kw_only=True, frozen=True):
    """A snapshot of one worker's telemetry at wall-clock time ``ts``."""

    version: int = STATS_SCHEMA_VERSION
    ts: float
    engine_id: str
    rank: int
    config: WorkerConfig
    counters: list[Sample] = msgspec.field(default_factory=list)
    gauges: list[Sample] = msgspec.field(default_factory=list)
    histograms: list[HistogramSnapshot] = msgspec.field(default_factory=list)


class _VersionOnly(msgspec.Struct):
    """Reads just the version, so a frame of another major version is refused
    with a clear error before its fields are checked against this schema."""

    version: int


_ENCODER = msgspec.msgpack.Encoder()
_VERSION_DECODER = msgspec.msgpack.Decoder(_VersionOnly)
_FRAME_DECODER = msgspec.msgpack.Decoder(StatsFrame)


def encode_stats_frame(frame: StatsFrame) -> bytes:
    """The msgpack payload of one frame (a map with every field named)."""
    return _ENCODER.encode(frame)


def decode_stats_frame(payload: bytes) -> StatsFrame:
    """Decode a frame of this major version; unknown fields are ignored.

    Raises ``UnsupportedStatsVersion`` for another major version and
    ``msgspec.DecodeError`` (a ``ValueError``) for anything that is not a
    stats frame.
    """
    version = _VERSION_DECODER.decode(payload).version
    if version != STATS_SCHEMA_VERSION:
        raise UnsupportedStatsVersion(
            f"stats frame has schema version {version}; this kvscope reads version "
            f"{STATS_SCHEMA_VERSION} only (upgrade the reader to read newer frames)"
        )
    return _FRAME_DECODER.decode(payload)
