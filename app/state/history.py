"""A bounded in-memory time series of the sidecar's aggregates, so a page opened late sees the past.

Samples (one value per series, taken together at one instant) go into every
tier; a tier turns them into points of a fixed resolution, each the aggregate
of the samples whose time falls in that point's bucket:

- a **gauge** (occupancy, a rate, a ratio's parts read as levels) is the mean of
  the bucket's samples, so a coarse point is the average of what a fine one saw;
- a **counter** (a total since the worker started) is the bucket's *last*
  sample, the total at the bucket's end: the difference of two points is the
  increase between them, and a drop is a restart.

A series absent from every sample of a bucket has no value there (NaN, null
in the API). A bucket is written when a sample falls past it, so a tier's
newest point is its last *complete* bucket; samples older than the bucket
being filled (a clock that went back) are dropped.

Memory is fixed by construction: every tier keeps at most ``points`` points
(a ring overwriting its oldest), one shared timestamp ring per tier and one
value ring per series, each value a C double (8 bytes); at most
``max_series`` series are kept, and at most ``max_label_sets`` of one
publisher's metric (one per medium, reason or direction), and samples of
further series are refused and counted. The second bound is the peers': a
worker names the label values of its reasons and directions, and a series is
kept for good once met, so one stats frame naming hundreds of reasons took
every series, and the publishers met after it had none. The rings' payload is therefore at most
``8 * (max_series + 1) * sum(points of each tier)`` bytes (``max_bytes``):
with the default tiers (1 s for 15 min, 10 s for 6 h: 3,060 points) and 512
series, about 12 MiB. Series keys, the per-tier pending bucket and Python object
headers add a little per series, not per point.

Written by the ingest thread, read by the API: one lock around each call,
held for one sample's worth of work or one copy of a window.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from app.settings import SidecarSettings

Kind = Literal["gauge", "counter"]


class SeriesKey(NamedTuple):
    """Which series: the publisher (None for the sidecar as a whole), the metric, its labels."""

    publisher: str | None
    metric: str
    labels: tuple[tuple[str, str], ...] = ()


class Reading(NamedTuple):
    """One series' value in one sample."""

    key: SeriesKey
    kind: Kind
    value: float


@dataclass(frozen=True, slots=True)
class TierSpec:
    """A resolution and how many points of it are kept (retention = resolution_s * points)."""

    resolution_s: int
    points: int

    @property
    def retention_s(self) -> int:
        return self.resolution_s * self.points


DEFAULT_TIERS: Final = (TierSpec(1, 900), TierSpec(10, 2160))
"""1 s for the last 15 minutes, 10 s for the last 6 hours."""

DEFAULT_MAX_SERIES: Final = SidecarSettings.model_fields["history_max_series"].default
"""Enough for 11 kvscope publishers' every series (about 40 each, 45 with both GPU and CPU, by
medium, reason, direction and replay outcome) beside the sidecar's own; more publishers need a
larger setting."""

DEFAULT_MAX_LABEL_SETS: Final = SidecarSettings.model_fields["max_media"].default
"""Series one publisher's metric may have at least: one per medium the index tracks (its
default count), and over the reasons (five) and directions (two) a kvscope worker names."""


def max_label_sets(max_media: int) -> int:
    """Series one publisher's metric may have in a sidecar tracking ``max_media`` media: one
    per medium, and never fewer than ``DEFAULT_MAX_LABEL_SETS``."""
    return max(max_media, DEFAULT_MAX_LABEL_SETS)


POINT_BYTES: Final = array("d").itemsize
"""One stored value (or timestamp): a C double."""


class Window(NamedTuple):
    """A copy of one tier from some time on: shared timestamps, and each series' values."""

    resolution_s: int
    times: list[float]
    series: list[tuple[SeriesKey, Kind, list[float | None]]]


class _Tier:
    """One resolution's ring of points plus the bucket being filled. Not thread-safe."""

    def __init__(self, spec: TierSpec) -> None:
        self.spec = spec
        self.times = array("d")
        self.values: dict[SeriesKey, array] = {}
        self._oldest = 0  # ring index of the oldest point, once the ring is full
        self._bucket: float | None = None
        self._sums: dict[SeriesKey, tuple[float, int]] = {}
        self._lasts: dict[SeriesKey, float] = {}

    def add(self, ts: float, readings: Iterable[Reading]) -> None:
        bucket = math.floor(ts / self.spec.resolution_s) * self.spec.resolution_s
        if self._bucket is not None and bucket != self._bucket:
            if bucket < self._bucket:
                return  # the clock went back: keep the points in time order
            self._flush()
        self._bucket = bucket
        for key, kind, value in readings:
            if kind == "counter":
                self._lasts[key] = value
            else:
                total, count = self._sums.get(key, (0.0, 0))
                self._sums[key] = (total + value, count + 1)

    def _flush(self) -> None:
        """Write the pending bucket as a point: gauges' means, counters' last values."""
        assert self._bucket is not None
        point = {key: total / count for key, (total, count) in self._sums.items()}
        point.update(self._lasts)
        self._sums, self._lasts = {}, {}
        length = len(self.times)
        full = length == self.spec.points
        for key in point:
            if key not in self.values:
                self.values[key] = array("d", [math.nan]) * length
        at = self._oldest if full else length
        if full:
            self.times[at] = self._bucket
            self._oldest = (self._oldest + 1) % length
        else:
            self.times.append(self._bucket)
        for key, ring in self.values.items():
            value = point.get(key, math.nan)
            if full:
                ring[at] = value
            else:
                ring.append(value)

    def window(
        self, since: float, keep: Iterable[SeriesKey]
    ) -> tuple[list[float], dict[SeriesKey, list[float | None]]]:
        """Times at or after ``since``, oldest first, and the ``keep`` series' values there
        (in ``keep``'s order; a series with no point yet is left out)."""
        order = [*range(self._oldest, len(self.times)), *range(self._oldest)]
        order = [i for i in order if self.times[i] >= since]
        values = {
            key: [None if math.isnan(v) else v for v in (ring[i] for i in order)]
            for key, ring in ((key, self.values.get(key)) for key in keep)
            if ring is not None
        }
        return [self.times[i] for i in order], values

    def holds_since(self, since: float) -> bool:
        """Whether every point from ``since`` on is still here: none was overwritten yet,
        or the oldest kept is no later than ``since``."""
        if not self.times:
            return False
        return len(self.times) < self.spec.points or self.times[self._oldest] <= since

    @property
    def stored(self) -> int:
        """Doubles held: the timestamps and every series' values."""
        return len(self.times) * (1 + len(self.values))


class History:
    """Every series of the sidecar's aggregates, at each tier's resolution, in bounded memory."""

    def __init__(
        self,
        max_series: int = DEFAULT_MAX_SERIES,
        tiers: Iterable[TierSpec] = DEFAULT_TIERS,
        max_label_sets: int = DEFAULT_MAX_LABEL_SETS,
    ) -> None:
        self.max_series = max_series
        self.max_label_sets = max_label_sets
        self.tiers: tuple[TierSpec, ...] = tuple(sorted(tiers, key=lambda t: t.resolution_s))
        if not self.tiers or len({t.resolution_s for t in self.tiers}) != len(self.tiers):
            raise ValueError("history tiers need distinct resolutions, at least one")
        self._tiers = [_Tier(spec) for spec in self.tiers]
        self._kinds: dict[SeriesKey, Kind] = {}
        self._label_sets: Counter[tuple[str | None, str]] = Counter()
        """Series kept per (publisher, metric)."""
        self.refused = 0
        """Readings dropped because ``max_series`` series were already kept, or
        ``max_label_sets`` of their publisher's metric."""
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        """The most the rings' payload can take (see the module docstring)."""
        return POINT_BYTES * (self.max_series + 1) * sum(t.points for t in self.tiers)

    @property
    def bytes(self) -> int:
        """The rings' payload now: 8 bytes per stored timestamp and value."""
        with self._lock:
            return POINT_BYTES * sum(tier.stored for tier in self._tiers)

    @property
    def series(self) -> int:
        return len(self._kinds)

    def add(self, ts: float, readings: Iterable[Reading]) -> None:
        """One sample, taken at ``ts`` (unix seconds); a series' kind is its first reading's."""
        with self._lock:
            kept = []
            for reading in readings:
                key = reading.key
                kind = self._kinds.get(key)
                if kind is None:
                    metric = (key.publisher, key.metric)
                    sets = self._label_sets[metric]
                    if len(self._kinds) >= self.max_series or sets >= self.max_label_sets:
                        self.refused += 1
                        continue
                    self._label_sets[metric] = sets + 1
                    kind = self._kinds[key] = reading.kind
                kept.append(Reading(key, kind, reading.value))
            for tier in self._tiers:
                tier.add(ts, kept)

    def window(
        self, since: float, resolution_s: int | None = None, publisher: str | None = None
    ) -> Window:
        """The points from ``since`` on at ``resolution_s`` (one of the tiers'), or else at
        the finest tier that still holds all of them (the coarsest when none does).

        Series in order of first sight; only ``publisher``'s when given, and only those
        with a value in the window.
        ``ValueError`` for a resolution no tier has.
        """
        with self._lock:
            tier = self._pick(since, resolution_s)
            keep = [k for k in self._kinds if publisher is None or k.publisher == publisher]
            times, values = tier.window(since, keep)
            kinds: Mapping[SeriesKey, Kind] = dict(self._kinds)
        series = [
            (key, kinds[key], column)
            for key, column in values.items()
            if any(v is not None for v in column)
        ]
        return Window(tier.spec.resolution_s, times, series)

    def _pick(self, since: float, resolution_s: int | None) -> _Tier:
        if resolution_s is not None:
            for tier in self._tiers:
                if tier.spec.resolution_s == resolution_s:
                    return tier
            offered = ", ".join(str(t.resolution_s) for t in self.tiers)
            # the offered ones first: a route echoing this cuts it short (a resolution may be
            # thousands of digits)
            raise ValueError(f"offered: {offered}; no history at resolution {resolution_s} s")
        for tier in self._tiers:
            if tier.holds_since(since):
                return tier
        return self._tiers[-1]
