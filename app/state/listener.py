"""What the sidecar knows of its listen socket, kept by the ingest thread.

Frames that reach a publisher's stream are counted in that publisher's state;
these counters hold the rest: frames too malformed to name a stream, and
frames of new streams once ``max_publishers`` are tracked. The connections
open now, those refused past ``max_connections`` or ``max_connections_per_host``,
those refused from an address outside ``allow`` and those counted as admitted
before their handshake was known (``shed_connections``) are the listen gate's
(app/ingest/listen_gate.py); the streams that moved to another host are the sidecar's.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network


@dataclass(slots=True)
class ListenerState:
    """The listen socket's endpoints and the frames no publisher took (counts since start-up)."""

    endpoints: tuple[str, ...]
    """As configured (``--listen``)."""
    max_publishers: int
    max_connections: int
    max_connections_per_host: int
    allow: tuple[IPv4Network | IPv6Network, ...] = ()
    """The networks a peer must connect from (``listen_allow``); empty: any."""
    bound: tuple[str, ...] = ()
    """As bound, wildcard ports resolved: what publishers connect to. Empty until bound."""
    frames: int = 0
    malformed: int = 0
    refused: int = 0
    connections: int = 0
    refused_connections: int = 0
    refused_host_connections: int = 0
    refused_addresses: int = 0
    shed_connections: int = 0
    stream_moves: int = 0
    """Frames of a stream already heard that came from another host than its frame before
    (``SidecarState.listened_publisher``): an engine back from a new address, or two peers
    sending under one stream's name."""
    stream_move_resets: int = 0
    """Of those, the moves whose new host's share could not take the stream's locations:
    what the stream held was forgotten."""

    @property
    def name(self) -> str:
        return "listen " + ", ".join(self.endpoints)
