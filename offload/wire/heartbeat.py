"""ZMQ heartbeats (ZMTP PING and PONG) on every kvscope socket that talks to peers, by one
rule: the publisher's sockets and the sidecar's receiving sockets alike.

Neither side of a PUB/SUB connection hears from the other unprompted: a
subscriber sends nothing once subscribed, and a publisher nothing while its
engine idles. So a connection whose far end vanished without closing it (a
host lost, a network cut) or stopped reading looked alive forever. With
heartbeats on, each side PINGs its peer, and libzmq closes a connection that
brings nothing in (a PONG, or any frame) within the peer timeout of a PING.
"""

from __future__ import annotations

from typing import Final

import zmq

PINGS_PER_TIMEOUT: Final = 6
"""PINGs sent in each peer timeout. The timeout runs from a PING, so a peer that fell
silent is cut between one and one and a sixth timeouts after it did: the more PINGs,
the nearer to the timeout, each a few bytes per peer."""


def set_heartbeat(sock: zmq.Socket, peer_timeout_s: float) -> None:
    """Make ``sock`` PING each peer ``PINGS_PER_TIMEOUT`` times a ``peer_timeout_s`` and
    drop one that answers none for ``peer_timeout_s``.

    Set before the socket binds or connects: libzmq gives each connection the
    options its socket had when the connection was made.
    """
    timeout_ms = round(peer_timeout_s * 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, round(timeout_ms / PINGS_PER_TIMEOUT)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
