"""HEAD on every GET route: the GET's status and headers, no body.

FastAPI routes declare GET only, so HEAD was a 405; link checkers and
monitors send HEAD. The request goes on as a GET, the first body message is
sent empty and final, and the route is then cancelled, which also ends a
stream that would never finish on its own.
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """Answer HEAD as GET without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        with anyio.CancelScope() as cancel:

            async def send_headers_only(message: Message) -> None:
                if message["type"] == "http.response.start":
                    await send(message)
                elif message["type"] == "http.response.body" and not cancel.cancel_called:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    cancel.cancel()

            await self.app({**scope, "method": "GET"}, receive, send_headers_only)
