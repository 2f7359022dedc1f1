"""A prometheus-client collector that reads kvscope snapshots at scrape time.

The core counts in plain integers; metric families are built only when
Prometheus asks. Constant labels (engine id, rank) are added to every
series, which is how the sidecar re-exports many workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from offload.telemetry.metrics import SPECS, Kind, Snapshot
from offload.wire.stats_frame import exposed_names

SnapshotSource = Callable[[], Iterable[tuple[Snapshot, Mapping[str, str]]]]
"""Yields (snapshot, extra labels) pairs: one per worker or component."""


class SnapshotCollector(Collector):
    """Exposes every snapshot a source yields, one family per metric name.

    Snapshots from several sources may disagree about a name (another type,
    other labels: a newer worker's metric, or a hostile one), or name a
    series another family prints (a gauge ``x_total`` beside a counter
    ``x``), or one the reader prints itself (``reserved``: a sidecar's own
    process families). The first source to name a family shapes it; a
    sample of another shape, or one that would print a name already taken,
    is left out, because adding it would mislabel it or fail the whole
    scrape, and ``conflicting_samples`` says how many the last scrape left
    out.
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
        families: dict[str, _Shaped] = {}
        printed: dict[str, str] = dict.fromkeys(self._reserved, "")  # a printed name -> family
        conflicts = 0
        for snapshot, extra in self._source():
            for kind, samples in (("counter", snapshot.counters), ("gauge", snapshot.gauges)):
                for sample in samples:
                    family = _family(families, printed, sample.name, kind, sample.labels, extra)
                    if family is None:
                        conflicts += 1
                        continue
                    family.add_metric(_values(sample.labels, extra), sample.value)
            for hist in snapshot.histograms:
                family = _family(families, printed, hist.name, "histogram", hist.labels, extra)
                if family is None:
                    conflicts += 1
                    continue
                buckets = [
                    (_bound(upper), cumulative)
                    for upper, cumulative in zip(hist.buckets, hist.counts, strict=True)
                ]
                family.add_metric(_values(hist.labels, extra), buckets, hist.sum)
        self.conflicting_samples = conflicts
        yield from (family for family, _ in families.values())


_Shaped = tuple[Metric, tuple[Kind, tuple[str, ...]]]
"""A family and the shape (type, label names) its samples must have."""


def _family(
    families: dict[str, _Shaped],
    printed: dict[str, str],
    name: str,
    kind: Kind,
    labels: Mapping[str, str],
    extra: Mapping[str, str],
) -> Metric | None:
    """The family a sample belongs to, made on first sight with sorted label names; None
    for a sample whose type or label names differ from that family's, or whose new family
    would print a name that ``printed`` already gives another family.

    A name this kvscope does not define (a newer worker's metric) is still
    exported, with a help text saying so, rather than dropped; a known name
    keeps its help only when it comes with its own type.
    """
    shape = (kind, (*sorted(labels), *extra))
    family_name, names = exposed_names(kind, name)
    known = families.get(family_name)
    if known is not None:
        family, family_shape = known
        return family if shape == family_shape else None
    names = (family_name, *names)
    if any(printed.get(printed_name, family_name) != family_name for printed_name in names):
        return None
    spec = SPECS.get(name)
    known_here = spec is not None and spec.kind == kind
    help_text = spec.help if known_here else "kvscope metric reported by a newer worker."
    family = _FAMILIES[kind](name, help_text, labels=list(shape[1]))
    families[family_name] = (family, shape)
    printed.update(dict.fromkeys(names, family_name))
    return family


def _values(labels: Mapping[str, str], extra: Mapping[str, str]) -> list[str]:
    return [*(labels[key] for key in sorted(labels)), *extra.values()]


def _bound(upper: float) -> str:
    return "+Inf" if upper == float("inf") else repr(upper)


_FAMILIES: dict[Kind, type[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
}
