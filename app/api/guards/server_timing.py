"""``Server-Timing`` on every response: how long the sidecar took, as the browser can read it.

A browser's own timing of a request includes its queueing, its network stack
and whatever else shares the machine; this header carries the sidecar's part
alone (from the request's arrival at the app to its response headers), so a
page's requests can be held against the API's latency in the server's own
measure. Browsers show it in their developer tools and expose it to the page
through Resource Timing's ``serverTiming``; it reveals nothing but a duration.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ServerTiming:
    """Add ``server-timing: app;dur=MILLISECONDS`` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def send_with_timing(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = (time.perf_counter() - began) * 1e3
                header = (b"server-timing", f"app;dur={took:.3f}".encode())
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await self.app(scope, receive, send_with_timing)
