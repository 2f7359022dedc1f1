"""The shape shared by the middlewares that only add headers to every HTTP response."""

from __future__ import annotations

from abc import ABC, abstractmethod

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Header = tuple[bytes, bytes]


class ResponseHeaders(ABC):
    """Add ``headers(began)`` to every HTTP response's start (``began``: ``arrived()``'s value)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def arrived(self) -> float:
        """Taken when the request arrives; handed to ``headers``."""
        return 0.0

    @abstractmethod
    def headers(self, began: float) -> tuple[Header, ...]:
        """The headers to add to this response."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = self.arrived()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                added = self.headers(began)
                message = {**message, "headers": [*message.get("headers", ()), *added]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
