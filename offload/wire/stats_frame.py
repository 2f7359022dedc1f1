"""kvscope stats frames: a worker's metrics, published beside its KV events.

A frame is a snapshot of one worker's counters, gauges and histograms plus
the configuration needed to read them, on its own topic. The schema is
generic (a metric is a name, labels and a value) so a new metric needs no
schema change; frames are msgpack maps with a major ``version``.
docs/PROTOCOL.md gives the schema and its compatibility rules.

A frame comes from the network and its names become a reader's Prometheus
series, so decoding checks what an exposition needs (a bad frame is refused
whole, ``InvalidStatsFrame``, never half-applied): every number finite, every
count and size non-negative, names and labels of Prometheus's form and
bounded (offload/wire/labels.py), at most ``MAX_SAMPLES`` samples, at most
``MAX_PRINTED_BYTES`` of exposition text, no name the reader reserves
(``RESERVED_PREFIX``, ``RESERVED_LABELS``), and no two series that would
print as one. The constraints bind readers only: a writer's own
structs are not checked on construction (but histograms are, see below).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import pairwise
from typing import Annotated, Final

import msgspec

from offload.wire.labels import Finite, Ident, LabelName, LabelValue, MetricName, Rank
from offload.wire.schema_version import check_version
from offload.wire.untrusted import decode

STATS_SCHEMA_VERSION = 1
"""The major schema version this module writes and reads."""

MAX_SAMPLES: Final = 4096
"""Most counters, gauges or histograms one frame may carry (each list); kvscope sends ~60."""

MAX_LABELS: Final = 16
"""Most labels one sample may carry; kvscope's carry at most three."""

MAX_BUCKETS: Final = 256
"""Most buckets one histogram may carry; kvscope's carry about 25."""

MAX_PRINTED_BYTES: Final = 1 << 20
"""Most bytes a frame's series may print in a reader's exposition, its labels escaped.

A histogram repeats its labels on each bucket's line, so a frame within the
other limits (a 23 MB frame: 4,096 histograms of 256 buckets and 16 long
labels) would print 3 GB on every scrape; kvscope's frames print about 30 KB."""

PRINTED_LINE_BYTES: Final = 40
"""What a line prints beside its name and the frame's labels: a suffix, braces, the value."""

RESERVED_PREFIX: Final = "kvscope_sidecar_"
"""Metric names the sidecar exports itself: a frame that used one would print a family twice."""

RESERVED_LABELS: Final = frozenset({"publisher", "engine", "rank", "le", "quantile"})
"""Label names readers add (the publisher, the engine id and rank) or Prometheus's own."""

_Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_Value = Annotated[float, msgspec.Meta(ge=-(2.0**63), le=2.0**63)]
"""A metric's value: finite, and small enough that sums over many frames stay finite."""
_Size = Annotated[int, msgspec.Meta(ge=0, le=2**48)]
_Labels = Annotated[dict[LabelName, LabelValue], msgspec.Meta(max_length=MAX_LABELS)]


class UnsupportedStatsVersion(ValueError):
    """A frame's major version is one this decoder cannot read."""


class InvalidStatsFrame(ValueError):
    """A frame of this version whose content breaks a rule above; the message says which."""


class WorkerConfig(msgspec.Struct, kw_only=True, frozen=True):
    """What a reader needs to interpret the metrics: sizes and the policy.

    ``bytes_per_block`` is None where the worker has no KV geometry (e.g. a
    worker without real transfers).
    """

    policy: Ident
    capacity_blocks: _Size
    block_size: _Size
    bytes_per_block: _Size | None = None


class Sample(msgspec.Struct, kw_only=True, frozen=True):
    """One counter or gauge value; labels must be of low cardinality."""

    name: MetricName
    labels: _Labels = msgspec.field(default_factory=dict)
    value: _Value


class HistogramSnapshot(msgspec.Struct, kw_only=True, frozen=True):
    """One histogram's state, Prometheus-style: ascending upper ``buckets``
    ending with ``math.inf``; ``counts[i]`` is the *cumulative* number of
    observations <= ``buckets[i]``, so ``counts[-1] == count``.

    Checked on construction and on decoding alike, so a malformed histogram is
    rejected where it is made or where it arrives, not when it is plotted.
    """

    name: MetricName
    labels: _Labels = msgspec.field(default_factory=dict)
    buckets: Annotated[list[float], msgspec.Meta(max_length=MAX_BUCKETS)]
    counts: list[_Count]
    sum: _Value
    count: _Count

    def __post_init__(self) -> None:
        problem = _histogram_problem(self.buckets, self.counts, self.count)
        if problem:
            raise ValueError(f"histogram {self.name!r}: {problem}")


def _histogram_problem(buckets: list[float], counts: list[int], count: int) -> str | None:
    """What is wrong with a histogram's buckets and counts, or None."""
    if not buckets or len(buckets) != len(counts):
        return f"needs one count per bucket, got {len(buckets)} buckets, {len(counts)} counts"
    if not all(math.isfinite(upper) for upper in buckets[:-1]):
        return "bucket bounds must be numbers, +inf only as the last"
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
    ts: Finite
    engine_id: Ident
    rank: Rank
    config: WorkerConfig
    counters: Annotated[list[Sample], msgspec.Meta(max_length=MAX_SAMPLES)] = msgspec.field(
        default_factory=list
    )
    gauges: Annotated[list[Sample], msgspec.Meta(max_length=MAX_SAMPLES)] = msgspec.field(
        default_factory=list
    )
    histograms: Annotated[list[HistogramSnapshot], msgspec.Meta(max_length=MAX_SAMPLES)] = (
        msgspec.field(default_factory=list)
    )


_ENCODER = msgspec.msgpack.Encoder()
_FRAME_DECODER = msgspec.msgpack.Decoder(StatsFrame)


def encode_stats_frame(frame: StatsFrame) -> bytes:
    """The msgpack payload of one frame (a map with every field named)."""
    return _ENCODER.encode(frame)


def decode_stats_frame(payload: bytes) -> StatsFrame:
    """Decode a frame of this major version; unknown fields are ignored.

    Raises ``UnsupportedStatsVersion`` for another major version,
    ``msgspec.DecodeError`` for anything that is not a stats frame, and
    ``InvalidStatsFrame`` for one that breaks the rules in the module doc
    (all three are ``ValueError``).
    """
    check_version(payload, "stats", STATS_SCHEMA_VERSION, UnsupportedStatsVersion)
    frame = decode(_FRAME_DECODER, payload)
    problem = _frame_problem(frame)
    if problem:
        raise InvalidStatsFrame(problem)
    return frame


def exposed_names(kind: str, name: str) -> tuple[str, tuple[str, ...]]:
    """A metric's family name and the sample names it prints, as prometheus-client does.

    A counter's family drops a ``_total`` suffix and prints ``<family>_total``;
    a histogram prints ``_bucket``, ``_count`` and ``_sum`` series.
    """
    if kind == "counter":
        family = name.removesuffix("_total")
        return family, (f"{family}_total",)
    if kind == "histogram":
        return name, (f"{name}_bucket", f"{name}_count", f"{name}_sum")
    return name, (name,)


def _series(frame: StatsFrame) -> Iterator[tuple[str, str, dict[str, str], int]]:
    """(kind, name, labels, lines printed) of every sample and histogram of a frame."""
    for kind, samples in (("counter", frame.counters), ("gauge", frame.gauges)):
        for sample in samples:
            yield kind, sample.name, sample.labels, 1
    for hist in frame.histograms:
        yield "histogram", hist.name, hist.labels, len(hist.buckets) + 2  # _count and _sum


def _printed_bytes(name: str, labels: dict[str, str], lines: int) -> int:
    """The exposition bytes of a series' lines, its label values escaped (at most doubled:
    a backslash or a quote prints two characters)."""
    label_bytes = sum(
        len(key) + len(value) + value.count("\\") + value.count('"') + 4
        for key, value in labels.items()
    )
    return lines * (len(name) + label_bytes + PRINTED_LINE_BYTES)


def _frame_problem(frame: StatsFrame) -> str | None:
    """Why a decoded frame cannot be exported as it is, or None."""
    if any(sample.value < 0 for sample in frame.counters):
        return "a counter is negative"
    families: dict[str, tuple[str, frozenset[str]]] = {}  # family -> (kind, label names)
    printed: dict[str, str] = {}  # a printed name (family or sample) -> its family
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    printed_bytes = 0
    for kind, name, labels, lines in _series(frame):
        if name.startswith(RESERVED_PREFIX):
            return f"metric names starting {RESERVED_PREFIX!r} are the reader's own"
        if RESERVED_LABELS.intersection(labels):
            return f"label names {sorted(RESERVED_LABELS)} are the reader's own"
        family, names = exposed_names(kind, name)
        shape = (kind, frozenset(labels))
        known = families.setdefault(family, shape)
        if known != shape:
            return "one metric family with two types or two sets of label names"
        for printed_name in (family, *names):
            if printed.setdefault(printed_name, family) != family:
                return "two metric families that print the same series name"
        key = (family, tuple(sorted(labels.items())))
        if key in series:
            return "one series given twice"
        series.add(key)
        printed_bytes += _printed_bytes(name, labels, lines)
        if printed_bytes > MAX_PRINTED_BYTES:
            return f"its series would print more than {MAX_PRINTED_BYTES} bytes of exposition"
    return None
