"""The sidecar's recent block events: a bounded ring with ids, and waiting for new ones.

Ids let a feed reader resume where it stopped (``/api/v1/events`` and its
stream); the ring keeps the last ``capacity`` events as decoded, and at most
``max_bytes`` of them by estimate: an event holds its block hashes, so a few
events of a giant frame could otherwise keep hundreds of megabytes and make one
page of the feed as large. Of one batch at most ``max_batch_events`` are kept,
and an event estimated above ``max_event_bytes`` is not kept at all; events not
kept still take their ids (a reader sees the hole, as for events pushed out)
and are counted in ``shed``. ``record`` runs on the ingest thread, readers on
the server's threads and event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from bisect import bisect_right
from collections import deque
from contextlib import suppress
from itertools import islice
from operator import attrgetter
from typing import Final, NamedTuple

from app.decode import DecodedBatch, DecodedEvent
from offload.wire.labels import MAX_HASH_BYTES

RATE_WINDOW_S = 10.0
"""The span over which ``events_per_s`` averages: long enough to smooth bursts."""

RATE_BUCKET_S: Final = 0.1
"""Batches recorded this close together are counted as one: the rate's memory is a hundred
counts, however many batches a peer sends a second (an entry per batch grew with the rate)."""

DEFAULT_MAX_BYTES: Final = 64 * 2**20
DEFAULT_MAX_BATCH_EVENTS: Final = 1000

# What one logged event costs in memory, at most (CPython, 64-bit): the
# LoggedEvent and DecodedEvent objects, the hash list's header and the medium
# (329 bytes with tracemalloc, rounded up), plus per hash, the parent's included,
# its pointer and object: an int's, or a bytes object's header and at most
# MAX_HASH_BYTES of content (decoding refuses longer hashes).
_EVENT_BYTES: Final = 360
_INT_HASH_BYTES: Final = 8 + 40  # a 64-bit int is 36 bytes, 40 as the allocator rounds it
_BYTES_HASH_BYTES: Final = 8 + 33 + MAX_HASH_BYTES

_ID: Final = attrgetter("id")


def estimated_bytes(event: DecodedEvent) -> int:
    """The memory one event keeps, by its hash count (its parent's too), every hash priced
    as a bytes hash if any is one (by its first alone, ints then bytes held 2.6 times the
    bound)."""
    hashes = event.block_hashes
    kinds = set(map(type, hashes))
    parent = event.parent_block_hash
    if parent is not None:
        kinds.add(type(parent))
    per_hash = _BYTES_HASH_BYTES if bytes in kinds else _INT_HASH_BYTES
    return _EVENT_BYTES + (len(hashes) + (parent is not None)) * per_hash


class LoggedEvent(NamedTuple):
    """One decoded event with its feed id, its publisher and the batch it came in."""

    id: int
    publisher: str
    seq: int
    ts: float
    event: DecodedEvent


class Page(NamedTuple):
    """Events after an id, and the ids the log reached when they were read."""

    events: list[LoggedEvent]
    first_id: int
    """The oldest id held (``last_id + 1`` when none is)."""
    last_id: int
    """The newest id given."""


class EventLog:
    """The most recent events (``capacity`` of them, ``max_bytes`` at most), with ids."""

    def __init__(
        self,
        capacity: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_batch_events: int = DEFAULT_MAX_BATCH_EVENTS,
    ) -> None:
        for name, value in (
            ("capacity", capacity),
            ("max_bytes", max_bytes),
            ("max_batch_events", max_batch_events),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.max_batch_events = max_batch_events
        self.max_event_bytes = max(_EVENT_BYTES, max_bytes // 64)
        """An event estimated larger is not kept: one event never takes the whole log."""
        self.shed = 0
        """Events given an id but not kept: past a batch's cap, or larger than an event may be."""
        self._lock = threading.Lock()
        self._ring: deque[LoggedEvent] = deque()
        self._sizes: deque[int] = deque()  # estimated_bytes of each event in the ring
        self._bytes = 0
        self._last_id = 0
        self._recent: deque[tuple[float, int]] = deque()  # (bucket start, events) per bucket
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def last_id(self) -> int:
        """The id of the newest event (0 before the first); equals the number recorded."""
        return self._last_id

    @property
    def bytes(self) -> int:
        """The estimated memory of the events held."""
        return self._bytes

    def record(self, publisher: str, seq: int, batch: DecodedBatch) -> None:
        """Append a batch's events (the ingest listener) and wake every waiting reader."""
        events = batch.events
        if not events:
            return
        now = time.monotonic()
        with self._lock:
            ring, sizes = self._ring, self._sizes
            first = self._last_id + 1
            # Cut at the batch's length: islice takes no stop past sys.maxsize, and the
            # setting (KVSCOPE_EVENT_BATCH_MAX) takes 20 digits.
            kept = islice(events, min(len(events), self.max_batch_events))
            for offset, event in enumerate(kept):
                size = estimated_bytes(event)
                if size > self.max_event_bytes:
                    self.shed += 1
                    continue
                ring.append(LoggedEvent(first + offset, publisher, seq, batch.ts, event))
                sizes.append(size)
                self._bytes += size
            self.shed += max(0, len(events) - self.max_batch_events)
            while len(ring) > self.capacity or self._bytes > self.max_bytes:
                ring.popleft()
                self._bytes -= sizes.popleft()
            self._last_id += len(events)
            recent = self._recent
            if recent and now - recent[-1][0] < RATE_BUCKET_S:
                recent[-1] = (recent[-1][0], recent[-1][1] + len(events))
            else:
                recent.append((now, len(events)))
            self._forget_before(now - RATE_WINDOW_S)
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            with suppress(RuntimeError):  # that reader's loop has closed: nobody to wake
                loop.call_soon_threadsafe(event.set)

    def since(self, last_id: int, limit: int, max_bytes: int | None = None) -> list[LoggedEvent]:
        """Up to ``limit`` events with ids above ``last_id``, oldest first.

        Events already pushed out of the ring (or shed) are skipped: the first
        returned id then exceeds ``last_id + 1``, which is how a reader sees its
        loss. With ``max_bytes``, the page ends before the event that would take
        its estimated size past it (the first event is always returned), so a
        page of events holding many hashes stays bounded too.
        """
        with self._lock:
            return self._since(last_id, limit, max_bytes)

    def page(self, last_id: int, limit: int) -> Page:
        """``since(last_id, limit)`` with the ``first_id`` and ``last_id`` of the same moment.

        Read one after the other, a record in between made a page that contradicts
        itself: a ``first_id`` past its own first event (a loss reported of events it
        holds), a ``last_id`` short of its own last event.
        """
        with self._lock:
            return Page(self._since(last_id, limit, None), self._first_id(), self._last_id)

    def _since(self, last_id: int, limit: int, max_bytes: int | None) -> list[LoggedEvent]:
        start = bisect_right(self._ring, last_id, key=_ID)
        if max_bytes is None:
            return list(islice(self._ring, start, start + limit))
        found: list[LoggedEvent] = []
        total = 0
        held = zip(self._ring, self._sizes, strict=True)
        for event, size in islice(held, start, start + limit):
            total += size
            if found and total > max_bytes:
                break
            found.append(event)
        return found

    def first_id(self) -> int:
        """The id of the oldest event still held (``last_id + 1`` when none is)."""
        with self._lock:
            return self._first_id()

    def _first_id(self) -> int:
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
