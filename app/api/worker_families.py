"""The workers' metric families as exposition text, each publisher's rendered once per stats
frame.

A worker's families change only when its next stats frame arrives (once a
second by default), while Prometheus, dashboards and probes may scrape far
more often; rendering them is most of a scrape's work (building every family
from the frames, and writing every sample). So the text is kept and served
again until a publisher's frame is replaced, or a publisher comes or goes.
With many publishers one of them has nearly always sent a frame since the
last scrape, so each publisher's part of the text is kept too, and only the
parts of the publishers whose frames were replaced are written again; the
text is then the kept parts joined, family by family.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import groupby
from operator import attrgetter
from typing import NamedTuple

from app.api.exposition_text import head_text, sample_text
from app.state.sidecar import SidecarState
from offload.telemetry.collector import FamilyShapes, add_series, new_family, series_of
from offload.telemetry.metrics import Kind, Snapshot
from offload.wire.stats_frame import StatsFrame

_run_key = attrgetter("kind", "name", "label_names")
"""What the series of one run share."""


class _Run(NamedTuple):
    """Series of one name, type and label names in a row in a frame, as sample lines: they
    join one family, or none, together (``FamilyShapes``)."""

    kind: Kind
    name: str
    label_names: tuple[str, ...]
    lines: bytes
    samples: int


class _Part(NamedTuple):
    """One publisher's frame and its runs of series."""

    frame: StatsFrame
    runs: tuple[_Run, ...]


class _Rendered(NamedTuple):
    """One rendering, replaced whole, so that concurrent scrapes never see a mix of two."""

    parts: Mapping[str, _Part]
    """Each publisher with a stats frame, in the state's order."""
    heads: Mapping[tuple[Kind, str], bytes]
    """The ``# HELP`` and ``# TYPE`` lines of each family the text has, by the kind and
    name of the series that made it."""
    text: bytes
    conflicting_samples: int
    held_bytes: int
    """The text's, the parts' and the header lines' bytes."""


class WorkerFamilies:
    """Every publisher's latest stats frame, labelled with who sent it, as exposition text,
    byte for byte what ``SnapshotCollector`` over the same frames writes.

    ``reserved`` names the series the reader prints itself: a worker's sample
    that would print one is left out and counted (``conflicting_samples``),
    as are samples that disagree with another publisher's (``FamilyShapes``).

    What it keeps is the last rendering: its text, and each publisher's part
    (the sample lines of its latest frame) and each family's header lines
    once. Parts of publishers gone are dropped with the next rendering, so it
    holds at most about twice the text of one frame per publisher tracked
    (``held_bytes``), each frame's text bounded on decoding
    (``offload.wire.stats_frame.MAX_PRINTED_BYTES``, besides the labels the
    reader adds).
    """

    def __init__(self, state: SidecarState, reserved: Iterable[str] = ()) -> None:
        self._state = state
        self._reserved = frozenset(reserved)
        self._rendered = _Rendered({}, {}, b"", 0, 0)

    @property
    def conflicting_samples(self) -> int:
        """Samples the text leaves out: another type or labels than the first publisher gave
        their metric, or a name the reader prints itself."""
        return self._rendered.conflicting_samples

    @property
    def held_bytes(self) -> int:
        """Bytes of text kept from the last rendering: the text, the parts and the headers."""
        return self._rendered.held_bytes

    def text(self) -> bytes:
        """The families of every publisher's latest frame; rendered again only when the
        frames changed since the last call, and then only the changed frames' parts."""
        frames = [
            (name, publisher.stats)
            for name, publisher in list(self._state.publishers.items())
            if publisher.stats is not None
        ]
        last = self._rendered
        if _same(frames, last.parts):
            return last.text
        parts = {}
        for name, frame in frames:
            kept = last.parts.get(name)
            parts[name] = kept if kept is not None and kept.frame is frame else _part(name, frame)
        self._rendered = rendered = _joined(parts, last.heads, self._reserved)
        return rendered.text


def _same(frames: list[tuple[str, StatsFrame]], parts: Mapping[str, _Part]) -> bool:
    """Whether a rendering's parts are of the same publishers, in order, with the very same
    frames (frames are immutable and replaced whole, so identity is equality here)."""
    return len(frames) == len(parts) and all(
        name == kept_name and frame is part.frame
        for (name, frame), (kept_name, part) in zip(frames, parts.items(), strict=True)
    )


def _part(name: str, frame: StatsFrame) -> _Part:
    """The publisher's frame as runs of sample lines, each written as the family it would
    make on its own writes them (a family's lines are the same whichever series made it)."""
    snapshot = Snapshot(frame.counters, frame.gauges, frame.histograms)
    extra = {"publisher": name, "engine": frame.engine_id, "rank": str(frame.rank)}
    runs = []
    for (kind, metric, label_names), run in groupby(series_of(snapshot, extra), _run_key):
        family = new_family(kind, metric, label_names)
        samples = 0
        for series in run:
            add_series(family, series)
            samples += 1
        runs.append(_Run(kind, metric, label_names, sample_text(family).encode(), samples))
    return _Part(frame, tuple(runs))


def _joined(
    parts: Mapping[str, _Part],
    last_heads: Mapping[tuple[Kind, str], bytes],
    reserved: frozenset[str],
) -> _Rendered:
    """The parts' runs gathered family by family, in the order ``SnapshotCollector`` makes
    the families, each family's header lines taken from ``last_heads`` where written there."""
    shapes = FamilyShapes(reserved)
    families: dict[str, list[bytes]] = {}
    heads: dict[tuple[Kind, str], bytes] = {}
    conflicts = 0
    for part in parts.values():
        for run in part.runs:
            family_name = shapes.join(run.kind, run.name, run.label_names)
            if family_name is None:
                conflicts += run.samples
                continue
            lines = families.get(family_name)
            if lines is None:
                key = (run.kind, run.name)
                head = last_heads.get(key)
                if head is None:
                    head = head_text(new_family(run.kind, run.name, run.label_names)).encode()
                heads[key] = head
                lines = families[family_name] = [head]
            lines.append(run.lines)
    text = b"".join(line for lines in families.values() for line in lines)
    held = sum(len(run.lines) for part in parts.values() for run in part.runs)
    held += len(text) + sum(map(len, heads.values()))
    return _Rendered(parts, heads, text, conflicts, held)
