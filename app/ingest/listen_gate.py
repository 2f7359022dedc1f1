"""The listen socket's door: at most ``max_connections`` peers admitted at once, and at most
``max_connections_per_host`` from one host.

ZMQ accepts any number of connections on a bound socket and gives each a
receive queue of its own (up to ``receive_buffer_bytes``, app/ingest/sockets.py),
so whoever reaches the endpoint could open connections until the sidecar
runs out of memory; ZMQ has no option that limits them. It does ask a ZAP
handler (ZMQ's authentication protocol, RFC 27) before a connection's
handshake completes, on a socket that has a ZAP domain: the gate is that
handler. It admits a handshake while fewer than the limit are admitted, and
answers 300 (a temporary refusal) past it: ZMQ then holds that connection
until its handshake times out (``HANDSHAKE_IVL_MS``) and closes it, and the
peer connects again, so a refused engine gets in once a place is free. A
connection that never finishes its handshake (a port scan, an idle TCP
socket) is never admitted and is closed by the same timeout.

A ZAP request names no connection, and the socket's monitor names
connections only by file descriptor, so the gate counts without pairing
them: a connection still open ``SETTLED_S`` after it was accepted finished
its handshake (ZMQ would have closed it otherwise), so it was admitted; one
younger than that is counted by its admission instead, an answer given
within ``SETTLED_S``. The count can only be high, never low, and only for
that long. A host's count is kept the same way, each connection's host read on
both sides: an admission's from its ZAP request's peer address, a settled
connection's from its descriptor's peer (asked when the monitor names it). A
host is an IP address; an ipc:// peer has none, and only the total limit
applies to it (the socket file's permissions say who connects there). Every
TCP peer that asks the gate has one: libzmq reads a peer's address once, as it
accepts the connection, and reads none only where the peer reset it before
then; a reset connection takes no write, and libzmq asks the ZAP handler (and
takes a message) only once its greeting is written, so such a peer never gets
that far (tests/app/test_listen.py resets one before ZMQ accepts it). The
gate, its socket and the monitor live in a ZMQ context of their own: a
monitor whose queue is full blocks its context's I/O thread, which must
never hold up the connect-mode sockets.

What the gate keeps is bounded: an open connection's host by ZMQ's own
connections (a descriptor each), an admission by ``max_connections`` (none is
given past it, and each is counted until it is forgotten), and the connections
not yet settled by ``YOUNG_PER_PLACE`` for each of the ``max_connections``
places. Past that a peer is opening connections faster than their handshakes
end (refused ones, and ones that never shake hands, stay open until
``HANDSHAKE_IVL_MS``): the oldest is settled at once, counted in
``shed_connections``. Shedding fails closed: a settled connection counts as
admitted until it closes, so the count is high while the flood's connections
stay open (a new peer may be refused meanwhile), never low.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Final

import zmq
from zmq.utils.monitor import parse_monitor_message

from app.state.listener import ListenerState

ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
"""Where ZMQ sends a context's ZAP requests (fixed by RFC 27)."""
ZAP_DOMAIN: Final = b"kvscope.listen"
"""Set on the listen socket: ZMQ asks the handler about that socket's peers only."""
ZAP_VERSION: Final = b"1.0"
ADMITTED: Final = (b"200", b"OK")
REFUSED: Final = (b"300", b"too many connections; try again")
HOST_REFUSED: Final = (b"300", b"too many connections from this host; try again")
NOT_ALLOWED: Final = (b"400", b"address not allowed")
"""A final refusal: ZMQ closes the connection at once and the peer does not retry it."""
HANDSHAKE_IVL_MS: Final = 5_000
"""How long a connection may take to finish its handshake: a refused one is closed after
this, and its peer connects again."""
SETTLED_S: Final = HANDSHAKE_IVL_MS / 1000 + 1.0
"""A connection open this long after it was accepted was admitted (a second's margin for
ZMQ's I/O thread to close the others)."""
YOUNG_PER_PLACE: Final = 16
"""How many connections not yet settled the gate waits on for each ``max_connections``
place: room for the place's own handshake and fifteen peers refused or still handshaking
beside it, before the oldest is counted as admitted (shed)."""


class ListenGate:
    """The ZAP handler and the monitor of one listen socket, read by the ingest thread.

    Built on the listen socket before it binds (ZMQ copies a socket's options
    into each connection as it is made); the ingest thread polls ``sockets``
    and hands each ready one to ``on_ready``.
    """

    def __init__(self, ctx: zmq.Context, sock: zmq.Socket, listener: ListenerState) -> None:
        self.listener = listener
        self._zap = ctx.socket(zmq.ROUTER)
        self._zap.bind(ZAP_ENDPOINT)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.sockets = (self._zap, self._monitor)
        self._opened: dict[int, str | None] = {}
        """Each open connection's host, by descriptor."""
        self._young: OrderedDict[int, float] = OrderedDict()
        """When each open connection not yet settled was accepted (monotonic seconds), by
        descriptor, oldest first; at most ``_young_cap``."""
        self._young_cap = YOUNG_PER_PLACE * listener.max_connections
        self._settled = 0
        self._settled_from: Counter[str] = Counter()
        """How many open connections are settled: in all, and from each host."""
        self._admissions: deque[tuple[float, str | None]] = deque()
        """When each handshake of the last ``SETTLED_S`` was admitted, and its host, oldest
        first."""
        self._admitted_from_host: Counter[str] = Counter()
        """How many of ``_admissions`` are from each host.

        The counts are kept as connections come, settle and go, so that a handshake
        is decided in time independent of how many connections are open: summed anew
        for each, every peer that opened connections by the thousand (idle ones
        included, which count for nothing) slowed every handshake and, retrying its
        refused ones, held up the ingest thread that the gate shares."""
        self._serves_ipc = any(e.startswith("ipc://") for e in listener.endpoints)
        """Whether a peer without an IP address can be an ipc:// endpoint's (``ipc_peer``)."""

    def on_ready(self, sock: zmq.Socket) -> None:
        """Read what is waiting: the monitor's events, then (for the ZAP socket) answers."""
        self._read_events()
        if sock is self._zap:
            self._answer()
        self.listener.connections = self._admitted()

    def _read_events(self) -> None:
        """Every event the monitor holds: connections accepted, and closed."""
        monitor = self._monitor
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            descriptor = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._accept(descriptor)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._close(descriptor)

    def _accept(self, descriptor: int) -> None:
        """Count the connection of ``descriptor`` young; with ``_young_cap`` young already,
        settle the oldest first (``shed_connections``: counted as admitted until it closes,
        whether it was or not, so the limits hold)."""
        self._close(descriptor)  # a descriptor reused: the old one closed
        self._opened[descriptor] = descriptor_host(descriptor)
        self._advance()  # those due settle by age: only a young one is shed
        if len(self._young) >= self._young_cap:
            self._settle(self._young.popitem(last=False)[0])
            self.listener.shed_connections += 1
        self._young[descriptor] = time.monotonic()

    def _close(self, descriptor: int) -> None:
        """Forget the connection of ``descriptor``, if one is open: its place if settled,
        else its wait (a closed connection is no longer young, so it takes no room there)."""
        if descriptor not in self._opened:
            return
        host = self._opened.pop(descriptor)
        if self._young.pop(descriptor, None) is None:
            self._settled -= 1
            _discount(self._settled_from, host)

    def _settle(self, descriptor: int) -> None:
        """Count the open connection of ``descriptor`` as admitted, in all and by its host."""
        self._settled += 1
        host = self._opened[descriptor]
        if host is not None:
            self._settled_from[host] += 1

    def _admitted(self) -> int:
        """Connections admitted and open: those settled, and those admitted since."""
        self._advance()
        return self._settled + len(self._admissions)

    def _admitted_from(self, host: str) -> int:
        """Connections admitted and open from ``host``, counted as ``_admitted`` counts."""
        self._advance()
        return self._settled_from[host] + self._admitted_from_host[host]

    def _advance(self) -> None:
        """Bring the counts to now: a connection accepted over ``SETTLED_S`` ago was admitted,
        and counts as settled; admissions older than that are forgotten (their connections
        are settled now, or closed)."""
        settled = time.monotonic() - SETTLED_S
        admissions = self._admissions
        while admissions and admissions[0][0] < settled:
            _discount(self._admitted_from_host, admissions.popleft()[1])
        young = self._young
        while young and next(iter(young.values())) < settled:
            self._settle(young.popitem(last=False)[0])

    def _decide(self, address: bytes) -> tuple[bytes, bytes]:
        """A final refusal for a peer outside ``allow``; else admitted while fewer than the
        limits are (in all, and from the peer's host), a temporary refusal past them. A peer
        of an ipc:// endpoint has no IP address: the socket file's permissions say who
        connects there, not ``allow`` nor the host limit (the settings refuse ``allow``
        beside an abstract socket, which has no file)."""
        listener = self.listener
        local = self._serves_ipc and ipc_peer(address)
        if listener.allow and not local and not allowed(address, listener.allow):
            listener.refused_addresses += 1
            return NOT_ALLOWED
        if self._admitted() >= listener.max_connections:
            listener.refused_connections += 1
            return REFUSED
        host = address_host(address)  # None for an ipc:// peer
        if host is not None and self._admitted_from(host) >= listener.max_connections_per_host:
            listener.refused_host_connections += 1
            return HOST_REFUSED
        self._admissions.append((time.monotonic(), host))
        if host is not None:
            self._admitted_from_host[host] += 1
        return ADMITTED

    def _answer(self) -> None:
        """Answer every waiting request (``_decide``), each after the monitor's events.

        ZMQ reports a connection's accept before its handshake asks the gate, so once
        a request is here its accept is in the monitor's queue: read before the request
        is decided, the accept is never later than the admission, and the connection is
        counted as settled before its admission is forgotten. Read only once before all
        the requests, an accept that came meanwhile was read after its admission, and
        between the admission's ``SETTLED_S`` and the read's the connection counted for
        nothing: its host could be given a place too many, kept while that peer stayed."""
        while True:
            try:
                request = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._read_events()
            # [peer, b"", version, request id, domain, address, routing id, mechanism, ...]
            if len(request) < 8 or request[2] != ZAP_VERSION:
                continue  # not a ZAP request of this version: ZMQ sends none such
            status = self._decide(request[5])
            self._zap.send_multipart([request[0], b"", ZAP_VERSION, request[3], *status, b"", b""])


def _discount(counts: Counter[str], host: str | None) -> None:
    """One fewer from ``host`` (none: not counted by host), a host at none forgotten (hosts
    come and go: the counter holds only those with connections)."""
    if host is None:
        return
    counts[host] -= 1
    if counts[host] <= 0:
        del counts[host]


def ipc_peer(address: bytes) -> bool:
    """Whether the peer address of a ZAP request can be an ipc:// peer's: libzmq shows one
    as ``localhost:UID:GID:PID`` where the system tells a socket's peer credentials, else
    as ``localhost`` (or nothing, where the name lookup fails). A TCP peer's is its IP
    address: libzmq has none only for a connection reset before it was accepted, which
    never asks (the module's docstring); were one to, only a socket that binds an ipc://
    endpoint would let it past ``allow``."""
    return not address or address == b"localhost" or address.startswith(b"localhost:")


def address_host(address: bytes) -> str | None:
    """The host of a ZAP request's peer address (an IP as text), as ``descriptor_host``
    gives it; None where it is no IP address (an ipc:// peer's)."""
    try:
        ip = peer_ip(address.decode("ascii"))
    except UnicodeDecodeError:
        return None
    return None if ip is None else str(ip)


def message_host(part: zmq.Frame) -> str | None:
    """The host of the peer a part of a listen socket's message came from (ZMQ's
    ``Peer-Address`` property, the address its ZAP request showed), as ``address_host``
    gives it; None for an ipc:// peer. A TCP peer's frame always has its IP address
    there: libzmq reads none only for a connection reset before it was accepted, which
    never sends a frame (the module's docstring), and otherwise leaves the property off
    only for a ZMTP 1.0 or 2.0 peer, which libzmq refuses on a socket with a ZAP domain
    (the gate sets one). So the ZMQError is a guard: no TCP peer's frame is of no host."""
    try:
        address = part.get("Peer-Address")
    except zmq.ZMQError:
        return None
    return address_host(address.encode("ascii", "replace"))


def descriptor_host(descriptor: int) -> str | None:
    """The host of the peer of an accepted connection's descriptor (ZMQ's, so read through a
    duplicate that this closes), as ``address_host`` gives it; None for an ipc:// peer, a
    descriptor already closed, or a connection its peer reset already (ZMQ closes it
    as it reads the reset): such a connection is counted as of no host, and only while
    it is open, and its admission, if it was given one, by the host its ZAP request
    showed."""
    try:
        duplicate = os.dup(descriptor)
    except OSError:
        return None
    try:
        peer = socket.socket(fileno=duplicate)
    except OSError:
        os.close(duplicate)
        return None
    with peer:
        try:
            name = peer.getpeername()
        except OSError:
            return None
    ip = peer_ip(name[0]) if isinstance(name, tuple) else None
    return None if ip is None else str(ip)


def peer_ip(text: str) -> IPv4Address | IPv6Address | None:
    """A peer's IP address from its text, None if it is not one: an IPv4 peer of a
    dual-stack socket, shown IPv4-mapped, is its IPv4 address, and a scope id is dropped
    (the same host, whichever interface it came by)."""
    try:
        ip = ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # as it is on an IPv4 socket: ::/0 admits no IPv4 host there
    return ip


def allowed(address: bytes, networks: Sequence[IPv4Network | IPv6Network]) -> bool:
    """Whether the peer address of a ZAP request (an IP as text) is in one of ``networks``
    (``peer_ip``). An address that does not parse is in none."""
    try:
        ip = peer_ip(address.decode("ascii"))
    except UnicodeDecodeError:
        return False
    return ip is not None and any(ip in network for network in networks)
