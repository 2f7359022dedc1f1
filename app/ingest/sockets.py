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
"""

from __future__ import annotations

import zmq

from app.settings import IngestConfig


def receiving_socket(ctx: zmq.Context, kind: int, config: IngestConfig) -> zmq.Socket:
    """A socket of ``kind`` that takes no message over ``max_message_bytes`` and queues at
    most ``receive_hwm`` per peer; set before it binds or connects, since ZMQ gives each
    connection the options its socket had when the connection was made."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
    sock.setsockopt(zmq.RCVHWM, config.receive_hwm)
    return sock
