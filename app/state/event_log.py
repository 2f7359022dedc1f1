"""The sidecar's recent block events: a bounded ring with ids, and waiting for new ones.

Ids let a feed reader resume where it stopped (``/api/v1/events`` and its
stream); the ring keeps the last ``capacity`` events as decoded. ``record``
runs on the ingest thread, readers on the server's threads and event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from contextlib import suppress
from itertools import islice
from typing import NamedTuple

from app.decode import DecodedBatch, DecodedEvent

RATE_WINDOW_S = 10.0
"""The span over which ``events_per_s`` averages: long enough to smooth bursts."""


class LoggedEvent(NamedTuple):
    """One decoded event with its feed id, its publisher and the batch it came in."""

    id: int
    publisher: str
    seq: int
    ts: float
    event: DecodedEvent


class EventLog:
    """The most recent ``capacity`` events, with ids, for polling and streaming readers."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._lock = threading.Lock()
        self._ring: deque[LoggedEvent] = deque(maxlen=capacity)
        self._last_id = 0
        self._recent: deque[tuple[float, int]] = deque()  # (monotonic time, events) per batch
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def last_id(self) -> int:
        """The id of the newest event (0 before the first); equals the number recorded."""
        return self._last_id

    def record(self, publisher: str, seq: int, batch: DecodedBatch) -> None:
        """Append a batch's events (the ingest listener) and wake every waiting reader."""
        if not batch.events:
            return
        now = time.monotonic()
        with self._lock:
            first = self._last_id + 1
            self._ring.extend(
                LoggedEvent(first + offset, publisher, seq, batch.ts, event)
                for offset, event in enumerate(batch.events)
            )
            self._last_id += len(batch.events)
            self._recent.append((now, len(batch.events)))
            self._forget_before(now - RATE_WINDOW_S)
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            with suppress(RuntimeError):  # that reader's loop has closed: nobody to wake
                loop.call_soon_threadsafe(event.set)

    def since(self, last_id: int, limit: int) -> list[LoggedEvent]:
        """Up to ``limit`` events with ids above ``last_id``, oldest first.

        Events already pushed out of the ring are skipped: the first returned
        id then exceeds ``last_id + 1``, which is how a reader sees its loss.
        """
        with self._lock:
            if not self._ring:
                return []
            start = max(0, last_id + 1 - self._ring[0].id)
            return list(islice(self._ring, start, start + limit))

    def first_id(self) -> int:
        """The id of the oldest event still held (``last_id + 1`` when none is)."""
        with self._lock:
            return self._ring[0].id if self._ring else self._last_id + 1

    def events_per_s(self) -> float:
        """Events recorded per second, averaged over the last ``RATE_WINDOW_S``."""
        with self._lock:
            self._forget_before(time.monotonic() - RATE_WINDOW_S)
            return sum(count for _at, count in self._recent) / RATE_WINDOW_S

    def _forget_before(self, horizon: float) -> None:
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()

    async def wait_after(self, last_id: int) -> None:
        """Return once an event with an id above ``last_id`` exists.

        Registering happens under the same lock as ``record``, so an event
        recorded between a reader's check and its sleep still wakes it.
        """
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        waiter = (loop, wake)
        with self._lock:
            if self._last_id > last_id:
                return
            self._waiters.append(waiter)
        try:
            await wake.wait()
        finally:
            with self._lock, suppress(ValueError):  # already taken by ``record``
                self._waiters.remove(waiter)
