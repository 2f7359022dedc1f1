"""The HTTP side's limits: every buffer a request or a stream can grow, bounded in bytes,
and how long and how many connections may hold them.

One frozen object, given to ``create_app``, so a test can shrink a limit to
reach it with little data and two apps in one process never share one. Each
limit that refuses or drops something is counted (``HttpCounts``, exported on
/metrics as ``kvscope_sidecar_http_*``); the README lists them with their
defaults. ``from_settings`` reads them from ``SidecarSettings`` (``KVSCOPE_*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from app.settings import SidecarSettings

KIB: Final = 1024

SSE_CHUNK_BYTES: Final = 256 * KIB
"""Most event bytes rendered into one write to a stream (at least one event each)."""

MAX_PIPELINED: Final = 16
"""Most requests one connection may send ahead of the response it waits for (HTTP/1.1
pipelining): uvicorn queues each, parsed, until the ones before it are answered, and took
every one a client sent. No browser pipelines, so this is no setting."""


MAX_HEADER_FIELDS: Final = 100
"""Most header fields in one request head (Apache's LimitRequestFields). Each is a tuple of two
bytes objects once parsed, about 100 bytes beside its text: within ``max_header_bytes`` a head
of four-byte fields held 25 times its size, and one connection ``max_pipelined`` such heads.
Browsers send about 20, so this is no setting."""


def _setting(name: str) -> Any:
    """A limit's default: the setting's, so the two cannot disagree."""
    return SidecarSettings.model_fields[name].default


LOOPBACK_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS: Final = ("", "0.0.0.0", "::", "*")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one app bounds; the module constants are the defaults."""

    max_body_bytes: int = _setting("max_body_bytes")
    max_sse_clients: int = _setting("max_sse_clients")
    sse_client_queue_bytes: int = _setting("sse_client_queue_bytes")
    sse_chunk_bytes: int = SSE_CHUNK_BYTES
    events_response_bytes: int = _setting("events_response_bytes")
    max_header_bytes: int = _setting("max_header_bytes")
    header_timeout_s: float = _setting("header_timeout_s")
    send_timeout_s: float = _setting("send_timeout_s")
    min_send_bytes_per_s: int = _setting("min_send_bytes_per_s")
    max_connections: int = _setting("max_connections")
    response_buffer_bytes: int = _setting("response_buffer_bytes")
    max_pipelined: int = MAX_PIPELINED
    max_header_fields: int = MAX_HEADER_FIELDS
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS
    """Host header names served (any port); None serves every name."""

    @classmethod
    def from_settings(cls, settings: SidecarSettings) -> HttpLimits:
        """The settings' limits, with the host check following the bound address.

        Unless ``allowed_hosts`` names them, bound to one address the sidecar
        answers the loopback names and that address: a page on another site
        that rebinds its own name to this address (DNS rebinding) is refused,
        token or not. Bound to every address (``0.0.0.0``, the container
        image), its clients use names it cannot know (service names, pod
        addresses), so every name is served unless ``allowed_hosts`` is set.
        """
        if settings.allowed_hosts:
            hosts: tuple[str, ...] | None = tuple(settings.allowed_hosts)
        elif settings.host in WILDCARD_HOSTS:
            hosts = None
        else:
            hosts = tuple(dict.fromkeys((*LOOPBACK_HOSTS, settings.host)))
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_sse_clients=settings.max_sse_clients,
            sse_client_queue_bytes=settings.sse_client_queue_bytes,
            events_response_bytes=settings.events_response_bytes,
            max_header_bytes=settings.max_header_bytes,
            header_timeout_s=settings.header_timeout_s,
            send_timeout_s=settings.send_timeout_s,
            min_send_bytes_per_s=settings.min_send_bytes_per_s,
            max_connections=settings.max_connections,
            response_buffer_bytes=settings.response_buffer_bytes,
            allowed_hosts=hosts,
        )
