"""A prometheus-client collector that reads kvscope snapshots at scrape time.

The core counts in plain integers; metric families are built only when
Prometheus asks. Constant labels (engine id, rank) are added to every
series, which is how the sidecar re-exports many workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from offload.telemetry.metrics import SPECS, Kind, Snapshot
from offload.wire.stats_frame import HistogramSnapshot, Sample, exposed_names

SnapshotSource = Callable[[], Iterable[tuple[Snapshot, Mapping[str, str]]]]
"""Yields (snapshot, extra labels) pairs: one per worker or component."""


class SnapshotCollector(Collector):
    """Exposes every snapshot a source yields, one family per metric name.

    Snapshots from several sources may disagree about a name (another type,
    other labels: a newer worker's metric, or a hostile one), or name a
    series another family prints (a gauge ``x_total`` beside a counter
    ``x``), or one the reader prints itself (``reserved``: a sidecar's own
    process families). ``FamilyShapes`` decides which samples are left out,
    and ``conflicting_samples`` says how many the last scrape left out.
    """

    def __init__(self, source: SnapshotSource, reserved: Iterable[str] = ()) -> None:
        self._source = source
        self._reserved = frozenset(reserved)
        self.conflicting_samples = 0

    def describe(self) -> list[Metric]:
        # Describing nothing lets registration skip a first collect() and its
        # invariant check at start-up; the families appear on the first scrape.
        return []

    def collect(self) -> Iterator[Metric]:
        shapes = FamilyShapes(self._reserved)
        families: dict[str, Metric] = {}
        conflicts = 0
        for snapshot, extra in self._source():
            for series in series_of(snapshot, extra):
                family_name = shapes.join(series.kind, series.name, series.label_names)
                if family_name is None:
                    conflicts += 1
                    continue
                family = families.get(family_name)
                if family is None:
                    family = families[family_name] = new_family(
                        series.kind, series.name, series.label_names
                    )
                add_series(family, series)
        self.conflicting_samples = conflicts
        yield from families.values()


class Series(NamedTuple):
    """One sample or histogram of a snapshot, with the extra labels its source adds."""

    kind: Kind
    name: str
    label_names: tuple[str, ...]
    """Its own label names, sorted, then the extra ones: the shape of its family."""
    label_values: list[str]
    """In ``label_names``' order."""
    sample: Sample | HistogramSnapshot


def series_of(snapshot: Snapshot, extra: Mapping[str, str]) -> Iterator[Series]:
    """Every sample of a snapshot, in the order a family's samples print: counters, gauges,
    then histograms, each in the snapshot's order."""
    kinds: tuple[tuple[Kind, list[Sample] | list[HistogramSnapshot]], ...] = (
        ("counter", snapshot.counters),
        ("gauge", snapshot.gauges),
        ("histogram", snapshot.histograms),
    )
    for kind, samples in kinds:
        for sample in samples:
            own = sorted(sample.labels)
            yield Series(
                kind,
                sample.name,
                (*own, *extra),
                [*(sample.labels[key] for key in own), *extra.values()],
                sample,
            )


class FamilyShapes:
    """Which family each series joins, as the series come: the first to name a family
    shapes it (its type and label names); a series of another shape, or one whose new
    family would print a name already printed (by another family, or ``reserved``), joins
    none, because adding it would mislabel it or fail the whole scrape.

    The answer for a series depends only on the families named before it, so series of
    one name and shape in a row all get the answer of the first.
    """

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._shapes: dict[str, tuple[Kind, tuple[str, ...]]] = {}
        self._printed: dict[str, str] = dict.fromkeys(reserved, "")  # a printed name -> family

    def join(self, kind: Kind, name: str, label_names: tuple[str, ...]) -> str | None:
        """The name of the family a series joins (made on first sight), None for none."""
        shape = (kind, label_names)
        family_name, suffixed = exposed_names(kind, name)
        known = self._shapes.get(family_name)
        if known is not None:
            return family_name if shape == known else None
        names = (family_name, *suffixed)
        if any(self._printed.get(printed, family_name) != family_name for printed in names):
            return None
        self._shapes[family_name] = shape
        self._printed.update(dict.fromkeys(names, family_name))
        return family_name


def new_family(kind: Kind, name: str, label_names: tuple[str, ...]) -> Metric:
    """The empty family a series of this kind, name and label names makes when it is the
    first to name it.

    A name this kvscope does not define (a newer worker's metric) is still
    exported, with a help text saying so, rather than dropped; a known name
    keeps its help only when it comes with its own type.
    """
    spec = SPECS.get(name)
    known_here = spec is not None and spec.kind == kind
    help_text = spec.help if known_here else "kvscope metric reported by a newer worker."
    return _FAMILIES[kind](name, help_text, labels=list(label_names))


def add_series(family: Metric, series: Series) -> None:
    """A series' samples into the family it joined."""
    sample = series.sample
    if isinstance(sample, HistogramSnapshot):
        buckets = [
            (_bound(upper), cumulative)
            for upper, cumulative in zip(sample.buckets, sample.counts, strict=True)
        ]
        family.add_metric(series.label_values, buckets, sample.sum)  # type: ignore[attr-defined]
    else:
        family.add_metric(series.label_values, sample.value)  # type: ignore[attr-defined]


def _bound(upper: float) -> str:
    return "+Inf" if upper == float("inf") else repr(upper)


_FAMILIES: dict[Kind, type[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
}
