"""The listen socket's door: at most ``max_connections`` peers connected at once.

ZMQ accepts any number of connections on a bound socket and gives each a
receive queue of its own (up to ``receive_buffer_bytes``, app/ingest/sockets.py),
so whoever reaches the endpoint could open connections until the sidecar
runs out of memory; ZMQ has no option that limits them. It does ask a ZAP
handler (ZMQ's authentication protocol, RFC 27) before a connection's
handshake completes, on a socket that has a ZAP domain: the gate is that
handler. It knows the connections open from the socket's monitor (accepted
and disconnected, by file descriptor) and refuses a handshake while they
are over the limit. ZMQ then closes that connection and, taking a refused
handshake as final, does not retry it: the peer connects again when it
restarts. The monitor's events are read before each answer, so a burst of
connections is counted before any of them is let in, and ZMQ heartbeats
drop a peer that vanished without closing, so its place is freed.
"""

from __future__ import annotations

from typing import Final

import zmq
from zmq.utils.monitor import parse_monitor_message

from app.state.listener import ListenerState

ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
"""Where ZMQ sends a context's ZAP requests (fixed by RFC 27)."""
ZAP_DOMAIN: Final = b"kvscope.listen"
"""Set on the listen socket only: ZMQ asks the handler about no other socket's peers."""
ZAP_VERSION: Final = b"1.0"
HEARTBEAT_IVL_MS: Final = 5_000
HEARTBEAT_TIMEOUT_MS: Final = 15_000
"""A peer that answers no ZMQ heartbeat for this long is disconnected, so a host that
vanished without closing its connection frees its place."""


class ListenGate:
    """The ZAP handler and the monitor of one listen socket, read by the ingest thread.

    ``prepare`` sets the socket up before it binds (ZMQ copies a socket's
    options into each connection as it is made); the ingest thread polls
    ``sockets`` and hands each ready one to ``on_ready``.
    """

    def __init__(self, ctx: zmq.Context, listener: ListenerState) -> None:
        self.listener = listener
        self._zap = ctx.socket(zmq.ROUTER)
        self._zap.bind(ZAP_ENDPOINT)
        self._monitor: zmq.Socket | None = None
        self._open: set[int] = set()

    def prepare(self, sock: zmq.Socket) -> None:
        """Route ``sock``'s handshakes through the gate and watch its connections."""
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)

    @property
    def sockets(self) -> tuple[zmq.Socket, ...]:
        return (self._zap,) if self._monitor is None else (self._zap, self._monitor)

    def on_ready(self, sock: zmq.Socket) -> None:
        """Read what is waiting: the monitor's events, then (for the ZAP socket) answers."""
        self._read_events()
        if sock is self._zap:
            self._answer()

    def _read_events(self) -> None:
        """Every event the monitor holds: the open connections, by file descriptor (a
        descriptor accepted again was closed and reused, so a lost event heals itself)."""
        monitor = self._monitor
        if monitor is None:
            return
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._open.add(event["value"])
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._open.discard(event["value"])
        self.listener.connections = len(self._open)

    def _answer(self) -> None:
        """Answer every waiting request: 200 while the connections open (this one among
        them) are within the limit, 400 past it."""
        while True:
            try:
                request = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # [peer, b"", version, request id, domain, address, routing id, mechanism, ...]
            if len(request) < 8 or request[2] != ZAP_VERSION:
                continue  # not a ZAP request of this version: ZMQ sends none such
            admitted = len(self._open) <= self.listener.max_connections
            if not admitted:
                self.listener.refused_connections += 1
            status = (b"200", b"OK") if admitted else (b"400", b"too many connections")
            self._zap.send_multipart([request[0], b"", ZAP_VERSION, request[3], *status, b"", b""])
