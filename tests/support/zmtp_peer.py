"""A ZMQ peer written by hand over a plain TCP socket, that never answers a PING.

libzmq answers every PING itself, so no ZMQ socket can play a peer that fell
silent; this one speaks ZMTP 3.1 (the NULL mechanism's greeting and READY
command) and then only reads, counting the PINGs that reach it until the
other side closes the connection.
"""

from __future__ import annotations

import socket
import struct

GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\0") + bytes(32)
"""ZMTP 3.1's greeting: signature, version 3.1, the NULL mechanism, as-server 0, filler."""

COMMAND = 0x04
LONG = 0x02
READ_LIMIT_S = 60.0
"""How long one read may wait before the peer gives up: far past any timeout tested."""


def handshake(sock: socket.socket, socket_type: bytes) -> None:
    """Greet the ZMQ socket at the other end of ``sock`` as a ``socket_type`` socket."""
    sock.settimeout(READ_LIMIT_S)
    sock.sendall(GREETING)
    _read_exactly(sock, len(GREETING))
    sock.sendall(ready_command(socket_type))


def ready_command(socket_type: bytes) -> bytes:
    """The NULL mechanism's READY command of a ``socket_type`` socket, framed."""
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return bytes([COMMAND, len(ready)]) + ready


def pings_until_closed(sock: socket.socket) -> int:
    """Read frames, answering none, until the other side closes; the PINGs among them."""
    pings = 0
    try:
        while True:
            flags = _read_exactly(sock, 1)[0]
            size_bytes = _read_exactly(sock, 8 if flags & LONG else 1)
            body = _read_exactly(sock, int.from_bytes(size_bytes, "big"))
            if flags & COMMAND and body[1 : 1 + body[0]] == b"PING":
                pings += 1
    except (ConnectionError, EOFError):
        return pings


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the peer closed the connection")
        data += chunk
    return data
