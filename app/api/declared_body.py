"""Whether a request's head declares a body, read once for the connection and the routes.

The connection (app/api/http_connection.py) arms its body deadline and refuses an
Upgrade with a body by it, and the event stream (app/api/routes/events.py) refuses a
request that would send one: both read the same head, so they read it by one rule.
"""

from __future__ import annotations

from collections.abc import Iterable


def declares_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether ``headers`` (names lower-case, as uvicorn hands them on) declare chunks or a
    Content-Length above 0: ``00`` is 0 too (RFC 9110 8.6 allows any number of digits,
    which the parser has checked are digits)."""
    return any(
        name == b"transfer-encoding"
        or (name == b"content-length" and value.strip().lstrip(b"0") != b"")
        for name, value in headers
    )
