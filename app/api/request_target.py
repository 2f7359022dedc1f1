"""A request line's target by its form (RFC 9112 3.2): a path is served as written, an absolute
URL's host stands in for the Host header, and the forms that name no resource here are refused.

uvicorn keeps only the path of an absolute-form target (``GET http://evil.example/api/v1/stats``)
and drops its host, so the Host check read the Host header while the request line named another
server. RFC 9112 3.2.2 has a server ignore the Host header for such a target and use the
target's own host: that is the one checked (``BoundedConnection`` puts it in the Host field).
An authority-form target (``CONNECT host:port``) asks for a tunnel, and an asterisk-form one
(``OPTIONS *``) about the server as a whole; the sidecar is no proxy and answers neither
(uvicorn answered the first with a parser error naming nothing, the second with a 404).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from app.api.guards.allowed_hosts import host_name

SCHEMES: Final = frozenset({b"http", b"https"})
"""The schemes of an absolute-form target the sidecar serves (matched in any case)."""


class TargetRefused(ValueError):
    """A request target that names no resource the sidecar serves; its message says why, in
    fixed words (never the client's bytes)."""


@dataclass(frozen=True)
class RequestTarget:
    """A target the sidecar serves: ``path`` in origin-form (a path, then any query), and the
    host an absolute-form target named (with any port), None for origin-form."""

    path: bytes
    host: bytes | None


def read_target(target: bytes) -> RequestTarget:
    """``target`` (the request line's, as the parser passed it) as served, or ``TargetRefused``.

    An absolute URL's empty path is ``/`` (RFC 9110 4.2.3): uvicorn failed on one, answering
    a parser error naming nothing. Its user information is refused, as RFC 9110 4.2.4 has a
    recipient treat it, and so is an empty host (4.2.1).
    """
    if target.startswith(b"/"):
        return RequestTarget(_served_path(target), None)
    if target == b"*":
        raise TargetRefused(
            "the request target * (asterisk-form, as OPTIONS * sends) asks about the server "
            "as a whole, which the sidecar does not answer: send a path"
        )
    scheme, separated, rest = target.partition(b"://")
    if not separated:  # the parser passes no other form, and this one only after CONNECT
        raise TargetRefused(
            "the request target is in authority-form (host:port, as CONNECT sends): the "
            "sidecar is no proxy and opens no tunnel; send a path"
        )
    if scheme.lower() not in SCHEMES:
        raise TargetRefused("an absolute request target's scheme must be http or https")
    ends = [index for index in map(rest.find, (b"/", b"?", b"#")) if index >= 0]
    end = min(ends, default=len(rest))
    authority, path = rest[:end], rest[end:]
    if b"@" in authority:
        raise TargetRefused("an absolute request target may not carry user information (user@host)")
    if not host_name(authority):
        raise TargetRefused("an absolute request target names no host")
    return RequestTarget(_served_path(path if path.startswith(b"/") else b"/" + path), authority)


def _served_path(target: bytes) -> bytes:
    """``target`` (origin-form), or ``TargetRefused`` where its path holds an encoded slash.

    uvicorn decodes the path before routing, so ``/api%2Fv1/stats`` was served as
    ``/api/v1/stats``: a proxy in front that allows or denies by the raw path (``/metrics``
    only, say) read one path and the sidecar served another. No path of the sidecar's
    holds a slash within a segment, so none is lost.
    """
    path = target.partition(b"?")[0].partition(b"#")[0]
    if b"%2f" in path.lower():
        raise TargetRefused(
            "the request path holds an encoded slash (%2F), which no path or block hash of "
            "the sidecar's holds (a proxy in front may read it as another path)"
        )
    return target
