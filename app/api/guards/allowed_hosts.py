"""The Host header check: a page on another site that rebinds its name to this server is refused.

DNS rebinding: a page from ``evil.example`` re-resolves that name to
127.0.0.1, and the browser then lets its script read this server's answers,
since to the browser it is still ``evil.example``. The browser still sends
``Host: evil.example``, so checking the name against the ones this server is
reached by stops it, with or without a token. The probes answer any name:
orchestrators call them by pod address, and they say nothing worth reading.
A request line's absolute URL (``GET http://evil.example/...``) names the server
instead of the Host header (RFC 9112 3.2.2): the connection puts its host in the
Host field (app/api/request_target.py), so that is the name checked here.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.guards.reply import send_error
from app.api.http_counts import HttpCounts

OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})


def host_name(header: bytes) -> str:
    """The name in a Host header, without its port, lower-case (IPv6 without brackets).

    A bracketed address counts only when nothing but a port follows the ``]``:
    ``[::1]evil.example`` is itself, and served by no name (it was read as ``::1``).
    """
    text = header.decode("latin-1").strip().lower()
    name, colon, port = text.rpartition(":")
    if not (colon and port.isdigit()):
        name = text
    if name.startswith("[") and name.endswith("]"):
        return name[1:-1]
    return name


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
        # Exactly one Host: of two, the first was checked and a proxy may route by the other.
        given = [value for key, value in scope["headers"] if key == b"host"]
        if len(given) == 1 and host_name(given[0]) in self.hosts:
            await self.app(scope, receive, send)
            return
        self.counts.refuse("host_not_allowed")
        await send_error(
            send,
            400,
            "Host header (or the request line's absolute URL) names no address this sidecar "
            "serves (see allowed_hosts)",
        )
