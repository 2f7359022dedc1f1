"""A loopback TCP relay whose connections a test can cut: a real broken connection, on demand.

A browser's event stream survives an emulated "offline" (Chromium keeps open
connections), so a test of what a page does after its connection breaks
puts this relay between the browser and the server and closes every relayed
connection at once; new connections go through as before. A test of a peer
that vanished without closing its connection (a host lost, a network cut)
stalls them instead: each stays open and carries nothing more.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

CHUNK = 65_536


class TcpRelay:
    """Accepts on a free loopback port and relays each connection to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._stalled: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while (data := source.recv(CHUNK)) and not self._is_stalled(source):
                sink.sendall(data)
        except OSError:
            pass
        if not self._is_stalled(source):
            self._drop(source, sink)

    def _is_stalled(self, sock: socket.socket) -> bool:
        with self._lock:
            return sock in self._stalled

    def _drop(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):  # already shut
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> int:
        """Break every connection open now, as a failed network would; returns how many."""
        with self._lock:
            current = list(self._open)
        self._drop(*current)
        return len(current) // 2

    def stall(self) -> int:
        """Relay nothing more on every connection open now, nor close it, as a host that
        vanished would; returns how many. Their peers see nothing until they give up."""
        with self._lock:
            self._stalled |= self._open
            return len(self._open) // 2

    def close(self) -> None:
        self._server.close()
        self.cut()

    def __enter__(self) -> TcpRelay:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
