"""The response budget: an answer that would pass the bytes held for slow readers is a 503.

Checked at the answer's start, from its ``Content-Length``, before uvicorn
writes any of it (app/api/response_buffers.py says what is held). An answer
that would pass ``response_buffer_bytes`` (less its scrape reserve, unless it is
a /metrics scrape) is replaced by a 503 with ``Retry-After``, counted as
``response_buffer_full``; the route's body is dropped. Not checked: an answer
without a length (the event stream, which bounds each reader's bytes itself), a
HEAD's (it carries no body), and the probes', a few bytes that orchestrators
must have from a busy sidecar too.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.guards.allowed_hosts import OPEN_PATHS
from app.api.guards.reply import send_error
from app.api.http_counts import HttpCounts
from app.api.response_buffers import ResponseBuffers

RETRY_AFTER: Final = ((b"retry-after", b"5"),)
"""As the other 503s: readers drain their answers, or are cut by ``send_timeout_s``."""

SCRAPE_PATH: Final = "/metrics"
"""Answered within the budget's scrape reserve too (app/api/response_buffers.py)."""


def _content_length(start: Message) -> int | None:
    """The ``Content-Length`` of a response's start (the app's own: a valid number), if any."""
    for name, value in start.get("headers", ()):
        if name == b"content-length":
            return int(value)
    return None


class ResponseBudget:
    """Refuse answers that ``buffers`` has no room for."""

    def __init__(self, app: ASGIApp, buffers: ResponseBuffers, counts: HttpCounts) -> None:
        self.app = app
        self.buffers = buffers
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "HEAD" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        charged = 0  # what of the admitted answer is not yet written
        refused = False
        scrape = scope["path"] == SCRAPE_PATH

        async def send_within_budget(message: Message) -> None:
            nonlocal charged, refused
            if refused:
                return
            if message["type"] == "http.response.start":
                length = _content_length(message)
                if length is not None and not self.buffers.admit(length, scrape):
                    refused = True
                    await self._refuse(send, length, scrape)
                    return
                charged = length or 0
            await send(message)
            if charged and message["type"] == "http.response.body":
                body = len(message.get("body", b""))
                charged -= body
                self.buffers.written(body)

        try:
            await self.app(scope, receive, send_within_budget)
        finally:
            self.buffers.written(charged)

    async def _refuse(self, send: Send, length: int, scrape: bool) -> None:
        self.counts.refuse("response_buffer_full")
        room = self.buffers.room(scrape)
        most = "the sidecar's most" if scrape else "the sidecar's most less its scrape reserve"
        detail = (
            f"{self.buffers.held()} bytes of answers wait for clients still reading them; "
            f"this one's {length} more would pass {room}, {most}"
        )
        await send_error(send, 503, detail, RETRY_AFTER)
