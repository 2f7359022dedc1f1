"""What the sidecar knows of one publisher's stream, kept by the ingest thread."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.settings import PublisherEndpoints
from app.state.worker_stats import WorkerStats
from offload.wire.stats_frame import StatsFrame


@dataclass(slots=True)
class PublisherState:
    """One publisher's stream health and latest stats (all counts since start-up)."""

    endpoints: PublisherEndpoints
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
    def seen(self) -> bool:
        return self.last_frame_at is not None
