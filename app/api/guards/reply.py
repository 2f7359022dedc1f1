"""A JSON error a guard answers itself, shaped like FastAPI's own (``{"detail": ...}``)."""

from __future__ import annotations

import json

from starlette.types import Send


async def send_error(
    send: Send, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """Answer ``status`` with ``{"detail": detail}``; the connection closes after it."""
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
