"""The live event stream: each event rendered once, shared by every reader, bounded per reader.

Rendering an event per reader (as a generator per response did) costs the
event loop readers x events, which held up every other request. Here one
broadcaster task follows the event log, waits a tick so that events come in
batches, renders the batch once in a render thread (``render_frames``: at most
``sse_chunk_bytes``), and hands the same bytes to every reader's queue. A
reader whose queue would pass ``sse_client_queue_bytes`` is shed: its queue is
dropped, the shed counted, its slot given up at once, and its stream ends once
what was already written drains, so that its EventSource reconnects with
``Last-Event-ID`` and loses nothing the log still holds (a reader that reads
nothing never drains it: its connection's send deadline cuts it,
app/api/http_connection.py, while its slot already serves another reader). A reader
resuming from an older id is sent that backlog first, rendered by itself a
chunk at a time, each chunk written before the next is rendered, while the
broadcast queues behind it; a reader shed meanwhile (it read the backlog too
slowly for the broadcast queued behind it) gets no further chunk, rendered or
written: its stream ends as any shed reader's does. At most
``max_sse_clients`` streams are open; one more is a 503, counted.

A stream ends quietly whichever way it ends: its client gone (the server
reports the disconnect; nothing is logged), shed, or the server stopping
(``end_all``). A stopping server ends a backlog as shedding does, at the chunk
being written: it sent the rest, chunk by chunk, first, and a large backlog to
a slow reader held up the stop until the server's grace ran out and cut it.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import anyio
from fastapi import HTTPException, status
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.event_render import Rendered, render, sse_frames
from app.api.http_counts import HttpCounts
from app.api.limits import HttpLimits
from app.settings import MAX_PAGE_LIMIT
from app.state.event_log import EventLog, LoggedEvent

TICK_S: Final = 0.1
"""The broadcaster's wait after an event, gathering those that follow: at most ten writes a
second to each reader, however fast events come."""

KEEPALIVE_S: Final = 15.0
"""A comment goes out after this long without events, so proxies keep the stream open."""

BATCH_EVENTS: Final = MAX_PAGE_LIMIT
"""Events taken from the log per render (then cut to the chunk's byte budget)."""

RENDER_THREADS: Final = 2
"""Render threads, apart from the server's threadpool so routes never wait behind a backlog."""

RETRY_MS: Final = 1000
KEEPALIVE: Final = b": keep-alive\n\n"
OPENING: Final = b"retry: %d\n\n" % RETRY_MS
"""Written first: how soon a reader's EventSource reconnects once its stream ends (shed)."""


def render_frames(events: list[LoggedEvent], budget: int) -> tuple[Rendered, bytes]:
    """The leading events within ``budget`` bytes, and them as SSE frames (a thread's job)."""
    rendered = render(events, budget)
    return rendered, sse_frames(rendered)


class StreamReader:
    """One open stream: the broadcast bytes queued for it, at most ``max_queued`` of them.

    ``cursor`` is the newest id queued for it; ``backlog`` the ids (after, up to)
    it must be sent first, from the log, because it resumed from an older id.
    """

    def __init__(self, cursor: int, backlog_until: int, max_queued: int) -> None:
        self.backlog = (cursor, backlog_until)
        self.cursor = max(cursor, backlog_until)
        self.shed = False
        self._ended = False
        self._max_queued = max_queued
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._wake = asyncio.Event()

    def offer(self, events: Rendered, frames: bytes) -> bool:
        """Queue the broadcast events newer than ``cursor``; False (and shed) when they overflow."""
        if self.shed or not events.ids or events.ids[-1] <= self.cursor:
            return True
        if events.ids[0] <= self.cursor:  # joined while the broadcaster was behind the log
            keep = bisect_right(events.ids, self.cursor)
            frames = sse_frames(Rendered(events.ids[keep:], events.texts[keep:]))
        if self._queued + len(frames) > self._max_queued:
            self.shed = True
            self._queue.clear()
            self._queued = 0
            self._wake.set()
            return False
        self._queue.append(frames)
        self._queued += len(frames)
        self.cursor = events.ids[-1]
        self._wake.set()
        return True

    def end(self) -> None:
        self._ended = True
        self._wake.set()

    @property
    def ending(self) -> bool:
        """Whether its stream is to end (shed, or the server stopping): nothing more is
        rendered or written for it, only what is written drains."""
        return self.shed or self._ended

    async def next_chunk(self) -> bytes | None:
        """The next bytes to write: queued events, a keep-alive when idle, None once done."""
        while not self._queue:
            if self.ending:
                return None
            self._wake.clear()
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    await self._wake.wait()
            except TimeoutError:
                return KEEPALIVE
        if self.ending:
            return None
        chunk = self._queue.popleft()
        self._queued -= len(chunk)
        return chunk


class EventStreams:
    """The open streams of one app, and the broadcaster that feeds them."""

    def __init__(self, log: EventLog, limits: HttpLimits, counts: HttpCounts) -> None:
        self.log = log
        self.limits = limits
        self.counts = counts
        self.cursor = 0
        """The newest id broadcast (or passed: given to events the log shed); a reader joining
        now gets the rest from the log."""
        self._readers: set[StreamReader] = set()
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="kvscope-render")

    def __len__(self) -> int:
        return len(self._readers)

    def join(self, last_event_id: int | None) -> StreamReader:
        """A reader from ``last_event_id`` (live only when None); a 503 when streams are full.

        An id above the newest comes from an earlier sidecar process: such a
        reader gets everything held.
        """
        if len(self._readers) >= self.limits.max_sse_clients:
            self.counts.refuse("sse_clients_full")
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                f"{self.limits.max_sse_clients} event streams are open, the sidecar's most",
                headers={"Retry-After": "5"},
            )
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self.cursor = self.log.last_id
            self._task = loop.create_task(self._broadcast(), name="kvscope-sse-broadcast")
        newest = self.log.last_id
        start = newest if last_event_id is None else last_event_id
        reader = StreamReader(
            0 if start > newest else start, self.cursor, self.limits.sse_client_queue_bytes
        )
        self._readers.add(reader)
        return reader

    def leave(self, reader: StreamReader) -> None:
        self._readers.discard(reader)
        if not self._readers and self._task is not None:
            self._task.cancel()  # nobody to render for; the next reader starts another
            self._task = None

    def end_all(self) -> None:
        """End every stream (the server is stopping): each ends once what is written drains,
        its queue and the rest of its backlog unsent (its reader resumes them from the log)."""
        for reader in list(self._readers):
            reader.end()

    def close(self) -> None:
        self.end_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def render(self, events: list[LoggedEvent]) -> tuple[Rendered, bytes]:
        """``render_frames`` in a render thread, within one chunk's byte budget."""
        loop = asyncio.get_running_loop()
        budget = self.limits.sse_chunk_bytes
        return await loop.run_in_executor(self._pool, render_frames, events, budget)

    async def _broadcast(self) -> None:
        while True:
            await self.log.wait_after(self.cursor)
            await asyncio.sleep(TICK_S)
            events, _, newest = self.log.page(self.cursor, BATCH_EVENTS)
            if not events:
                # The ids after the cursor went to events the log shed (or pushed out): none
                # will be sent, so it waits past them, where it found nothing every tick.
                self.cursor = newest
                continue
            rendered, frames = await self.render(events)
            self.cursor = rendered.ids[-1]
            for reader in list(self._readers):
                if not reader.offer(rendered, frames):
                    self.counts.sse_shed += 1
                    self.leave(reader)  # its slot serves the next reader, not a stalled one

    async def backlog(self, reader: StreamReader) -> bytes | None:
        """The next chunk of the reader's backlog, rendered; None once it is all sent, or once
        the reader is shed or the server stopping: the rest would be rendered and written for
        a stream that ends anyway, and is sent again, from the log, when it resumes."""
        if reader.ending:
            return None
        after, until = reader.backlog
        events = [e for e in self.log.since(after, BATCH_EVENTS) if e.id <= until]
        if not events:
            return None
        rendered, frames = await self.render(events)
        self.counts.sse_backlog_events += len(rendered.ids)
        reader.backlog = (rendered.ids[-1], until)
        return frames


class EventStreamResponse(Response):
    """One reader's stream, written straight to the server (no generator, no per-event work)."""

    media_type = "text/event-stream"

    def __init__(self, streams: EventStreams, reader: StreamReader) -> None:
        self.streams = streams
        self.reader = reader
        self.status_code = status.HTTP_200_OK
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # proxies (nginx) must not buffer it
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_until_disconnect, receive, group.cancel_scope)
                await self._write(send)
                group.cancel_scope.cancel()
        except OSError:
            pass  # the client went away mid-write (servers that raise rather than report it)
        finally:
            self.streams.leave(self.reader)

    async def _write(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        await send(start)
        await _body(send, OPENING)
        while (chunk := await self.streams.backlog(self.reader)) is not None:
            await _body(send, chunk)
        while (chunk := await self.reader.next_chunk()) is not None:
            await _body(send, chunk)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _until_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` when the client disconnects: an idle stream otherwise never notices.

    The route refuses a request that declares a body, so what this reads before the
    disconnect is the request's empty end, never a body (nor the body limit's refusal).
    """
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
