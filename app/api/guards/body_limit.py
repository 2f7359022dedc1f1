"""The request body limit, enforced while the body is read, not after.

A declared ``Content-Length`` over the limit is refused before a byte is
read; a body sent in chunks is counted as it arrives and refused the moment
it passes the limit. Either way the sidecar holds at most the limit, and the
refusal is a 413 naming it, counted as ``body_too_large``.
"""

from __future__ import annotations

from fastapi import HTTPException, status
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.guards.reply import send_error
from app.api.http_counts import HttpCounts


def too_large(max_bytes: int) -> str:
    return f"request body larger than {max_bytes} bytes, the sidecar's limit"


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` inside FastAPI's body reading, which passes HTTPExceptions on."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            status.HTTP_413_CONTENT_TOO_LARGE, too_large(max_bytes), {"Connection": "close"}
        )


class BodyLimit:
    """Refuse request bodies over ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int, counts: HttpCounts) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            self.counts.refuse("body_too_large")
            await send_error(send, status.HTTP_413_CONTENT_TOO_LARGE, too_large(self.max_bytes))
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    self.counts.refuse("body_too_large")
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, receive_within_limit, send)
