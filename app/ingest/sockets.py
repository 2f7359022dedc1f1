"""The sockets the sidecar receives on, bounded in bytes though ZMQ counts messages.

ZMQ queues up to its receive high-water mark of messages per connected peer
(1,000 by default), each up to ``max_message_bytes``: 64 GiB a connection at
the old defaults, which a flooding peer could fill unseen. Each receiving
socket here queues ``IngestConfig.receive_hwm`` messages per peer instead
(``receive_buffer_bytes`` over ``max_message_bytes``). Past them ZMQ stops
reading that connection, so the rest waits in the kernel's socket buffers and
then on the sender, whose PUB socket drops (or, kvscope's, refuses and counts)
what does not fit: the sidecar sees a gap in that publisher's sequence, and
replays it or counts it missed.

Each also pings its peers (ZMQ heartbeats, by the publisher's rule:
``offload/wire/heartbeat.py``) and drops one that answers none for
``peer_timeout_s``: a subscriber sends nothing once subscribed, so a connection
whose far end vanished without closing it (a host lost, a network cut) looked
alive forever, and a connect-mode socket never connected again to the worker
that came back.
"""

from __future__ import annotations

import zmq

from app.settings import IngestConfig
from offload.wire.heartbeat import set_heartbeat


def receiving_socket(ctx: zmq.Context, kind: int, config: IngestConfig) -> zmq.Socket:
    """A socket of ``kind`` that takes no message over ``max_message_bytes``, queues at
    most ``receive_hwm`` per peer and drops a peer silent for ``peer_timeout_s``; set
    before it binds or connects, since ZMQ gives each connection the options its socket
    had when the connection was made."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
    sock.setsockopt(zmq.RCVHWM, config.receive_hwm)
    set_heartbeat(sock, config.peer_timeout_s)
    return sock
