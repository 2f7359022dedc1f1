"""What the sidecar knows of one publisher's stream, kept by the ingest thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from app.settings import PublisherEndpoints
from app.state.insight import PublisherInsight
from app.state.worker_stats import WorkerStats
from app.streams import ListenStream
from offload.wire.stats_frame import StatsFrame

PublisherSource = PublisherEndpoints | ListenStream
"""How the sidecar meets a publisher: it connects to its PUB socket, or the publisher
connects to the sidecar's listen socket; either way it has a name and maybe a replay socket."""

ReplayOutcome = Literal["complete", "timeout", "deadline", "oversize", "malformed", "unstarted"]
REPLAY_OUTCOMES: Final[tuple[ReplayOutcome, ...]] = get_args(ReplayOutcome)
"""How a replay ended: its answer ended (end marker, or the gap's last batch arrived);
nothing arrived for ``replay_timeout_s``; it was still answering at ``replay_deadline_s``;
its answers passed ``replay_max_bytes``; an answer broke the protocol (not four frames,
a bad sequence frame, a sequence number that repeats or goes back); or it never started,
its socket refused (no file descriptor left, an endpoint ZMQ cannot connect to), so
nothing was asked."""


CONNECTED_WITHIN_S: Final = 10.0
"""A publisher counts as connected when a frame arrived this recently (twice a worker's
heartbeat): its latest rates stand for now only while it is."""


@dataclass(slots=True)
class PublisherState:
    """One publisher's stream health and latest stats (all counts since start-up)."""

    source: PublisherSource
    host: str | None = None
    """The IP address a listen-mode stream's latest frame came from, whose share of the
    index's its locations count in (``BlockIndex.set_host``); None for a publisher the
    sidecar connects to, or a stream unheard or last heard from an ipc:// peer."""
    last_seq: int | None = None
    last_frame_at: float | None = None
    frames: int = 0
    batches_applied: int = 0
    gaps: int = 0
    replayed: int = 0
    """Batches applied from replay answers (not those received and not needed)."""
    missed: int = 0
    restarts: int = 0
    malformed: int = 0
    stats_frames: int = 0
    replays: dict[ReplayOutcome, int] = field(
        default_factory=lambda: dict.fromkeys(REPLAY_OUTCOMES, 0)
    )
    """Replays asked of this publisher's replay socket, by how they ended."""
    held_dropped: int = 0
    """Live KV frames dropped because those held during a replay reached ``replay_hold_bytes``;
    each shows as a gap afterwards, filled by the next replay when the publisher still has it."""
    family_changes: int = 0
    """Times its connect socket was made again, or its replay endpoint's IPv6 option set
    anew, for the address family its host name came to resolve to while it was unheard
    (app/ingest/families.py)."""
    source_family_mismatches: int = 0
    """Times an endpoint of its (live or replay) came to resolve, while it was unheard, to
    addresses of the other family alone than the source address it leaves from, which ZMQ
    cannot connect across (``family_mismatch``): counted once each time, until an answer lets
    it connect again."""
    unreadable_ahead: dict[int, None] = field(default_factory=dict, repr=False)
    """Numbers past the next one whose live KV payload was no batch, counted in ``malformed``
    as it came: a replay that brings the same bytes later uses the number up without
    counting them again, and a gap left unfilled does not count it missed too. In arrival
    order, bounded by the ingest thread; each forgotten once the sequence passes it, all when
    the publisher restarts."""
    stats: StatsFrame | None = field(default=None, repr=False)
    worker: WorkerStats | None = field(default=None, repr=False)
    """Totals and rates, replaced (never mutated) with each stats frame."""
    insight: PublisherInsight | None = field(default=None, repr=False)
    """Its sampled access stream and hit-ratio curve, from its first sample frame."""

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def seen(self) -> bool:
        return self.last_frame_at is not None

    def connected(self, now: float) -> bool:
        """Whether a frame arrived within ``CONNECTED_WITHIN_S`` of ``now``."""
        return self.last_frame_at is not None and now - self.last_frame_at <= CONNECTED_WITHIN_S
