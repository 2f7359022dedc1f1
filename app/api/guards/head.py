"""HEAD on every GET route: the GET's status and headers, no body; and a 405 says so.

FastAPI routes declare GET only, so HEAD was a 405; link checkers and
monitors send HEAD. The request goes on as a GET, the first body message is
sent empty and final, and the route is then cancelled, which also ends a
stream that would never finish on its own. A 405 for another method lists
the route's methods in ``Allow``, which must name every method served (RFC
9110, 15.5.6): FastAPI's said ``GET`` alone, so HEAD is added beside it.
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _allowing_head(start: Message) -> Message:
    """A 405's start whose ``Allow`` names HEAD wherever it names GET."""
    headers = [
        (name, value + b", HEAD")
        if name == b"allow" and b"GET" in value.split(b", ") and b"HEAD" not in value
        else (name, value)
        for name, value in start.get("headers", ())
    ]
    return {**start, "headers": headers}


class HeadAsGet:
    """Answer HEAD as GET without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] != "HEAD":

            async def send_allowing_head(message: Message) -> None:
                if message["type"] == "http.response.start" and message["status"] == 405:
                    message = _allowing_head(message)
                await send(message)

            await self.app(scope, receive, send_allowing_head)
            return
        with anyio.CancelScope() as cancel:

            async def send_headers_only(message: Message) -> None:
                if message["type"] == "http.response.start":
                    await send(message)
                elif message["type"] == "http.response.body" and not cancel.cancel_called:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    cancel.cancel()

            await self.app({**scope, "method": "GET"}, receive, send_headers_only)
