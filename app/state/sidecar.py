"""The sidecar's state as one object: what the ingest thread writes and the API reads."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from app.settings import IngestConfig, SidecarSettings
from app.state.block_index import BlockIndex
from app.state.event_log import EventLog
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
    ) -> None:
        self.index = index
        self.event_log = event_log
        self.ingest = IngestConfig() if ingest is None else ingest
        """How the ingest thread reads: topics and the bounds on what peers send."""
        self.lock = threading.Lock()
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
            ListenerState(tuple(settings.listen), settings.listen_max_publishers)
            if settings.listen
            else None
        )
        return cls(
            BlockIndex(settings.max_blocks, settings.max_media),
            EventLog(settings.event_buffer, settings.event_buffer_bytes, settings.event_batch_max),
            [*settings.publishers(), *settings.listen_streams()],
            listener,
            settings.ingest_config(),
        )

    def listened_publisher(self, topic: bytes, rank: int | None) -> PublisherState | None:
        """The listen-mode publisher of stream (topic, rank), added on its first frame.

        None once the listener tracks ``max_publishers`` streams and this is a new
        one. ``ValueError`` when the topic cannot name a stream (app/streams.py).
        Called by the ingest thread only.
        """
        state = self._listened.get((topic, rank))
        if state is not None or self.listener is None:
            return state
        stream = ListenStream(topic, rank)  # first: a topic that names no stream is malformed
        if len(self._listened) >= self.listener.max_publishers:
            return None
        state = PublisherState(stream)
        self._listened[topic, rank] = state
        self.publishers = {**self.publishers, state.name: state}
        return state
