"""The workers' metric families as exposition text, rendered once per stats frame.

A worker's families change only when its next stats frame arrives (once a
second by default), while Prometheus, dashboards and probes may scrape far
more often; rendering them is most of a scrape's work (building every family
from the frames, and writing every sample). So the text is kept and
served again until a publisher's frame is replaced, or a publisher comes or
goes.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.api.exposition_text import TextFormat
from app.state.sidecar import SidecarState
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import Snapshot
from offload.wire.stats_frame import StatsFrame

_Frames = tuple[tuple[str, StatsFrame], ...]
"""Each publisher with a stats frame, and that frame."""


class WorkerFamilies:
    """Every publisher's latest stats frame, labelled with who sent it, as exposition text.

    ``reserved`` names the series the reader prints itself: a worker's sample
    that would print one is left out and counted (``conflicting_samples``),
    as are samples that disagree with another publisher's (SnapshotCollector).
    """

    def __init__(self, state: SidecarState, reserved: Iterable[str] = ()) -> None:
        self._state = state
        self._reserved = frozenset(reserved)
        self._format = TextFormat()
        self._rendered: tuple[_Frames, bytes, int] = ((), b"", 0)
        """The frames last rendered, their text and the samples they left out: one tuple,
        replaced whole, so that concurrent scrapes never see a mix of two renderings."""

    @property
    def conflicting_samples(self) -> int:
        """Samples the text leaves out: another type or labels than the first publisher gave
        their metric, or a name the reader prints itself."""
        return self._rendered[2]

    def text(self) -> bytes:
        """The families of every publisher's latest frame; rendered again only when the
        frames changed since the last call."""
        frames = tuple(
            (name, publisher.stats)
            for name, publisher in list(self._state.publishers.items())
            if publisher.stats is not None
        )
        last, text, _ = self._rendered
        if not _same(frames, last):
            collector = SnapshotCollector(lambda: _snapshots(frames), self._reserved)
            text = self._format.render(collector.collect())
            self._rendered = (frames, text, collector.conflicting_samples)
        return text


def _same(frames: _Frames, last: _Frames) -> bool:
    """Whether two renderings' inputs are the same publishers with the very same frames
    (frames are immutable and replaced whole, so identity is equality here)."""
    return len(frames) == len(last) and all(
        name == last_name and frame is last_frame
        for (name, frame), (last_name, last_frame) in zip(frames, last, strict=True)
    )


def _snapshots(frames: _Frames) -> Iterable[tuple[Snapshot, dict[str, str]]]:
    for name, frame in frames:
        snapshot = Snapshot(frame.counters, frame.gauges, frame.histograms)
        yield snapshot, {"publisher": name, "engine": frame.engine_id, "rank": str(frame.rank)}
