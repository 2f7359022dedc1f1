"""The sidecar's state as one object: what the ingest thread writes and the API reads."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from ipaddress import ip_network

from app.settings import IngestConfig, SidecarSettings
from app.state.block_index import BlockIndex
from app.state.event_log import EventLog
from app.state.history import (
    DEFAULT_TIERS,
    History,
    Kind,
    Reading,
    SeriesKey,
    TierSpec,
    max_label_sets,
)
from app.state.insight import InsightState
from app.state.listener import ListenerState
from app.state.publisher import PublisherSource, PublisherState
from app.streams import ListenStream


class SidecarState:
    """The block index, the event log, the listen socket and every publisher's state.

    The index is mutated and read only under ``lock``; the event log, the
    listener and the publisher states are safe to read without it. Listen mode
    adds publishers as they appear, on the ingest thread: ``publishers`` is then
    replaced by a larger mapping, never changed in place, so a reader iterates
    whichever mapping it took without a lock.
    """

    def __init__(
        self,
        index: BlockIndex,
        event_log: EventLog,
        publishers: Iterable[PublisherSource],
        listener: ListenerState | None = None,
        ingest: IngestConfig | None = None,
        history: History | None = None,
        insight: InsightState | None = None,
    ) -> None:
        self.index = index
        self.event_log = event_log
        self.history = History() if history is None else history
        """The aggregates over time, sampled by the ingest thread (``sample_history``)."""
        self.insight = InsightState() if insight is None else insight
        """The hit-ratio curves' bounds and their shadow thread's queue."""
        self.ingest = IngestConfig() if ingest is None else ingest
        """How the ingest thread reads: topics and the bounds on what peers send."""
        self.lock = threading.Lock()
        self.ingest_faults = 0
        """Faults of the sidecar's own (bugs, MemoryError) the ingest thread got past, each
        logged as an error with its traceback: a frame or message dropped, a step of its loop
        skipped, a batch applied in part."""
        self.ingest_stopped = False
        """Whether the ingest thread ended other than by ``Ingestor.close``: no publisher is
        read from then on, and /healthz says so."""
        self.listener = listener
        states = [PublisherState(p) for p in publishers]
        self.publishers: Mapping[str, PublisherState] = {s.name: s for s in states}
        # (topic, rank) -> state: where the ingest thread looks up a listened frame's publisher
        self._listened = {s.source.key: s for s in states if isinstance(s.source, ListenStream)}
        if not self.publishers and listener is None:
            raise ValueError("the sidecar needs a publisher to connect to or endpoints to bind")
        if self._listened and listener is None:
            raise ValueError("listen-mode publishers were declared without endpoints to listen on")

    @classmethod
    def from_settings(cls, settings: SidecarSettings) -> SidecarState:
        listener = (
            ListenerState(
                tuple(settings.listen),
                settings.listen_max_publishers,
                settings.listen_max_connections,
                settings.listen_max_connections_per_host,
                tuple(ip_network(network, strict=False) for network in settings.listen_allow),
            )
            if settings.listen
            else None
        )
        return cls(
            BlockIndex(
                settings.max_blocks,
                settings.max_media,
                media_per_host=settings.listen_max_media_per_host,
                locations_per_host=settings.listen_max_locations_per_host,
            ),
            EventLog(settings.event_buffer, settings.event_buffer_bytes, settings.event_batch_max),
            [*settings.publishers(), *settings.listen_streams()],
            listener,
            settings.ingest_config(),
            History(
                settings.history_max_series,
                (DEFAULT_TIERS[0], TierSpec(10, max(1, settings.history_retention_s // 10))),
                max_label_sets(settings.max_media),
            ),
            InsightState(settings.insight_config()),
        )

    def listened_publisher(
        self, topic: bytes, rank: int | None, host: str | None = None
    ) -> PublisherState | None:
        """The listen-mode publisher of stream (topic, rank), added on its first frame.

        None once the listener tracks ``max_publishers`` streams and this is a new
        one. ``ValueError`` when the topic cannot name a stream (app/streams.py).
        The stream's host is the ``host`` (IP address; None for an ipc:// peer) its
        latest frame came from: its locations count in that host's share of the
        index's (``BlockIndex.set_host``), so a peer opening stream after stream holds
        one host's share, not all of them, and a frame is held to its sender's share,
        whoever sent the stream's first. A move is counted in ``stream_moves``, and
        one whose locations the new host's share could not take, forgotten, in
        ``stream_move_resets``. Called by the ingest thread only.
        """
        listener = self.listener
        if listener is None:
            return None  # no listen socket: no stream is listened to (``__init__``)
        state = self._listened.get((topic, rank))
        if state is None:
            stream = ListenStream(topic, rank)  # first: a topic that names no stream is malformed
            if len(self._listened) >= listener.max_publishers:
                return None
            state = PublisherState(stream)
            self._listened[topic, rank] = state
            self.publishers = {**self.publishers, state.name: state}
        if state.host != host:
            state.host = host
            with self.lock:
                forgotten = self.index.set_host(state.name, host)
            if state.seen:
                listener.stream_moves += 1
                listener.stream_move_resets += forgotten
        return state

    def sample_history(self, now: float) -> None:
        """Record the aggregates ``/api/v1/stats`` shows, per publisher and medium, at ``now``.

        Per publisher: blocks and bytes held per medium (the index), its worker's totals
        (counters), rates (while it is connected) and transfer-latency quantiles (gauges)
        from its latest stats frames, and its stream's
        health counts, its replays by outcome among them; for the sidecar as a whole
        (publisher None): blocks tracked, the index's overflow, events received and events
        per second, and in listen mode the listen socket's counts (``listener_*``). The
        index is read under ``lock``, for as long as one pass over its per-location counts.
        """
        readings: list[Reading] = []

        def add(
            publisher: str | None, metric: str, kind: Kind, value: float | None, **labels: str
        ) -> None:
            if value is not None:
                readings.append(
                    Reading(SeriesKey(publisher, metric, tuple(labels.items())), kind, value)
                )

        with self.lock:
            usage = self.index.usage()
            tracked, overflow = len(self.index), self.index.overflow
        for row in usage:
            add(row.publisher, "blocks", "gauge", row.blocks, medium=row.medium)
            add(row.publisher, "bytes", "gauge", row.bytes, medium=row.medium)
            add(row.publisher, "stranded_blocks", "gauge", row.stranded, medium=row.medium)
        add(None, "tracked_blocks", "gauge", tracked)
        add(None, "overflow", "counter", overflow)
        add(None, "events", "counter", self.event_log.last_id)
        add(None, "events_per_s", "gauge", self.event_log.events_per_s())
        if self.listener is not None:
            for count in _LISTENER_COUNTS:
                add(None, f"listener_{count}", "counter", getattr(self.listener, count))
        for name, publisher in self.publishers.items():
            for metric in _STREAM_COUNTS:
                add(name, metric, "counter", getattr(publisher, metric))
            for outcome, count in publisher.replays.items():
                add(name, "replays", "counter", count, outcome=outcome)
            worker = publisher.worker
            if worker is None:
                continue
            for metric in _WORKER_COUNTS:
                add(name, metric, "counter", getattr(worker, metric))
            # Rates only while the publisher sends: a dead worker's last ones would stand as
            # now's for as long as the history keeps points (a gap says it instead).
            live = publisher.connected(now)
            for metric in _WORKER_RATES if live else ():
                add(name, metric, "gauge", getattr(worker, metric))
            for reason, count in worker.evictions.items():
                add(name, "evictions", "counter", count, reason=reason)
            for reason, count in worker.miss_blocks.items():
                add(name, "miss_blocks", "counter", count, reason=reason)
            for direction, per_s in worker.transfer_bytes_per_s.items() if live else ():
                add(name, "transfer_bytes_per_s", "gauge", per_s, direction=direction)
            for (direction, q), seconds in worker.transfer_latency_s.items():
                add(name, "transfer_latency_s", "gauge", seconds, direction=direction, quantile=q)
        self.history.add(now, readings)


_STREAM_COUNTS = (
    "frames",
    "gaps",
    "missed",
    "restarts",
    "malformed",
    "replayed",
    "held_dropped",
    "family_changes",
    "source_family_mismatches",
)
"""``PublisherState`` counts kept as history (counters): every one /api/v1/stats shows."""
_LISTENER_COUNTS = (
    "frames",
    "malformed",
    "refused",
    "refused_connections",
    "refused_host_connections",
    "refused_addresses",
    "shed_connections",
    "stream_moves",
    "stream_move_resets",
)
"""``ListenerState`` counts kept as history (counters), as ``listener_<count>``; its levels
(connections, publishers) and caps are not counts."""
_WORKER_COUNTS = (
    "lookup_hit_blocks",
    "lookup_blocks",
    "stores_completed",
    "loads",
    "dropped_frames",
    "dead_write_blocks",
)
"""``WorkerStats`` totals kept as history (counters): the hit ratio is the first over the second."""
_WORKER_RATES = ("stores_per_s", "loads_per_s", "evictions_per_s")
"""``WorkerStats`` rates kept as history (gauges)."""
