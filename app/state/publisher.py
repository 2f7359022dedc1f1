"""What the sidecar knows of one publisher's stream, kept by the ingest thread."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.settings import PublisherEndpoints
from app.state.worker_stats import WorkerStats
from app.streams import ListenStream
from offload.wire.stats_frame import StatsFrame

PublisherSource = PublisherEndpoints | ListenStream
"""How the sidecar meets a publisher: it connects to its PUB socket, or the publisher
connects to the sidecar's listen socket; either way it has a name and maybe a replay socket."""


@dataclass(slots=True)
class PublisherState:
    """One publisher's stream health and latest stats (all counts since start-up)."""

    source: PublisherSource
    last_seq: int | None = None
    last_frame_at: float | None = None
    frames: int = 0
    batches_applied: int = 0
    gaps: int = 0
    replayed: int = 0
    missed: int = 0
    restarts: int = 0
    malformed: int = 0
    stats_frames: int = 0
    stats: StatsFrame | None = field(default=None, repr=False)
    worker: WorkerStats | None = field(default=None, repr=False)
    """Totals and rates, replaced (never mutated) with each stats frame."""

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def seen(self) -> bool:
        return self.last_frame_at is not None
