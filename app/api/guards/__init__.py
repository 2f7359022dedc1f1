"""Pure ASGI middlewares that check or shape every request before any route sees it.

Pure ASGI, not ``BaseHTTPMiddleware``: they add a few function calls per
request and leave streamed responses (the event stream) streaming.
``install_guards`` stacks them in the one order that works: the server
timing outermost (it times everything below it), then the security headers
(so they reach the refusals the inner ones send), then the Host check, then
the response budget (outside HEAD, so it sees a HEAD, which holds no body),
then HEAD, then the body limit nearest the routes.
"""

from __future__ import annotations

from fastapi import FastAPI

from app.api.guards.allowed_hosts import AllowedHosts
from app.api.guards.body_limit import BodyLimit
from app.api.guards.head import HeadAsGet
from app.api.guards.response_budget import ResponseBudget
from app.api.guards.security_headers import SecurityHeaders
from app.api.guards.server_timing import ServerTiming
from app.api.http_counts import HttpCounts
from app.api.limits import HttpLimits
from app.api.response_buffers import ResponseBuffers


def install_guards(
    app: FastAPI, limits: HttpLimits, counts: HttpCounts, buffers: ResponseBuffers
) -> None:
    """Add the guards to ``app`` (the last added runs first)."""
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, counts=counts)
    app.add_middleware(HeadAsGet)
    app.add_middleware(ResponseBudget, buffers=buffers, counts=counts)
    app.add_middleware(AllowedHosts, hosts=limits.allowed_hosts, counts=counts)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(ServerTiming)
