"""Prometheus's text format (0.0.4), byte for byte as ``prometheus_client.generate_latest``
writes it, with what repeats from one scrape to the next kept.

``generate_latest`` checks and escapes every family's name and every sample's name
and labels on every scrape, though a series keeps its name and labels from one
scrape to the next and only its value changes: that was most of what a scrape of
the sidecar's own families cost. ``TextFormat`` keeps each family's ``# HELP`` and
``# TYPE`` lines and each series' written name and labels, and writes only the
values anew. It keeps what the last rendering wrote and nothing older, so a series
that goes (a publisher's, a curve point's) is forgotten one rendering later.

``head_text`` and ``sample_text`` write one family's header and sample lines on their
own, for text kept elsewhere (a publisher's part of the workers' families).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
"""Samples that ``generate_latest`` moves out of their family into gauges of their own."""

_HeadKey = tuple[str, str, str, str]
"""A family's name, type, help text and unit: all its header lines depend on."""
_SeriesKey = tuple[str, str, tuple[tuple[str, str], ...]]
"""A family's name, and its sample's name and labels (in the order the family gave them):
whether ``generate_latest`` moves a sample out of its family depends on both names."""


class _Families:
    """Families as a collector, for ``generate_latest``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


class TextFormat:
    """Writes families as ``generate_latest`` does, keeping the header lines and series
    names it wrote last time.

    A family with a timestamped sample or an OpenMetrics-only one (``_created``,
    ``_gsum``, ``_gcount``) is written by ``generate_latest`` itself: none of the
    sidecar's has one, and its output for them is not worth copying.

    Two renderings at once (two threads) are safe: each reads the kept text and builds
    its own, and the last to finish keeps its own.
    """

    def __init__(self) -> None:
        self._heads: dict[_HeadKey, str] = {}
        self._series: dict[_SeriesKey, str] = {}

    def render(self, families: Iterable[Metric]) -> bytes:
        """The text of every family, in order."""
        last_heads, last_series = self._heads, self._series
        heads: dict[_HeadKey, str] = {}
        series: dict[_SeriesKey, str] = {}
        out: list[str] = []
        for family in families:
            lines = _sample_lines(family, last_series, series)
            if lines is None:
                out.append(generate_latest(_Families([family])).decode())
                continue
            key = (family.name, family.type, family.documentation, family.unit)
            heads[key] = head = last_heads.get(key) or head_text(family)
            out.append(head)
            out.extend(lines)
        self._heads, self._series = heads, series
        return "".join(out).encode()


def _sample_lines(
    family: Metric, last: dict[_SeriesKey, str], kept: dict[_SeriesKey, str]
) -> list[str] | None:
    """The family's sample lines, each series' name and labels taken from ``last`` where
    written there, and put in ``kept``; None when a sample is timestamped or
    OpenMetrics-only."""
    lines = []
    for sample in family.samples:
        if sample.timestamp is not None:
            return None
        key = (family.name, sample.name, tuple(sample.labels.items()))
        prefix = last.get(key)
        if prefix is None:
            if any(sample.name == family.name + suffix for suffix in _OPENMETRICS_SUFFIXES):
                return None
            prefix = _series(sample)
        kept[key] = prefix
        lines.append(prefix + floatToGoString(sample.value) + "\n")
    return lines


def head_text(family: Metric) -> str:
    """The family's ``# HELP`` and ``# TYPE`` lines, as ``generate_latest`` writes them for
    the family without its samples (it renames some types and adds ``_total`` to a
    counter's name)."""
    empty = Metric(family.name, family.documentation, family.type, family.unit)
    return generate_latest(_Families([empty])).decode()


def sample_text(family: Metric) -> str:
    """The family's sample lines as ``generate_latest`` writes them, for a family with no
    timestamped or OpenMetrics-only sample (``SnapshotCollector``'s: its samples carry no
    timestamp, and a family's sample names are its own name and the suffixes its type
    prints)."""
    return "".join(
        _series(sample) + floatToGoString(sample.value) + "\n" for sample in family.samples
    )


def _series(sample: Sample) -> str:
    """The sample's line up to its value: its escaped name and labels, sorted by name."""
    name = escape_metric_name(sample.name)
    if not sample.labels:
        return name + " "
    labels = ",".join(
        f'{_label_name(label)}="{_escaped(value)}"'
        for label, value in sorted(sample.labels.items())
    )
    return f"{name}{{{labels}}} "


_label_name = lru_cache(maxsize=1024)(escape_label_name)
"""A label name escaped: checking one is a regular expression's work, and a family's
names repeat on each of its lines (``le`` on every bucket's)."""


def _escaped(value: str) -> str:
    """A label value as ``generate_latest`` writes it: backslash, newline and quote escaped."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
