"""The Host header check: a page on another site that rebinds its name to this server is refused.

DNS rebinding: a page from ``evil.example`` re-resolves that name to
127.0.0.1, and the browser then lets its script read this server's answers,
since to the browser it is still ``evil.example``. The browser still sends
``Host: evil.example``, so checking the name against the ones this server is
reached by stops it, with or without a token. The probes answer any name:
orchestrators call them by pod address, and they say nothing worth reading.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.guards.reply import send_error
from app.api.http_counts import HttpCounts

OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})


def host_name(header: bytes) -> str:
    """The name in a Host header, without its port, lower-case (IPv6 without brackets)."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text
    name, colon, port = text.rpartition(":")
    return name if colon and port.isdigit() else text


class AllowedHosts:
    """Serve only requests whose Host names one of ``hosts`` (any port); None serves every name."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...] | None, counts: HttpCounts) -> None:
        self.app = app
        self.hosts = None if hosts is None else frozenset(h.strip("[]").lower() for h in hosts)
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.hosts is None or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((value for key, value in scope["headers"] if key == b"host"), b"")
        if host_name(header) in self.hosts:
            await self.app(scope, receive, send)
            return
        self.counts.refuse("host_not_allowed")
        await send_error(
            send, 400, "Host header names no address this sidecar serves (see allowed_hosts)"
        )
