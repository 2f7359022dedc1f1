"""The sidecar's state as one object: what the ingest thread writes and the API reads."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from app.settings import PublisherEndpoints, SidecarSettings
from app.state.block_index import BlockIndex
from app.state.event_log import EventLog
from app.state.publisher import PublisherState


class SidecarState:
    """The block index, the event log and every publisher's state.

    The index is mutated and read only under ``lock``; the event log and the
    publisher states are safe to read without it.
    """

    def __init__(
        self, index: BlockIndex, event_log: EventLog, publishers: Iterable[PublisherEndpoints]
    ) -> None:
        self.index = index
        self.event_log = event_log
        self.lock = threading.Lock()
        self.publishers = {p.name: PublisherState(p) for p in publishers}
        if not self.publishers:
            raise ValueError("the sidecar needs at least one publisher to connect to")

    @classmethod
    def from_settings(cls, settings: SidecarSettings) -> SidecarState:
        return cls(
            BlockIndex(settings.max_blocks), EventLog(settings.event_buffer), settings.publishers()
        )
