"""Loopback ports held for a test whose code under test must bind a port it is told.

Where the code can bind ``tcp://127.0.0.1:*`` and report what it bound, tests do
that instead; this is for tests about the port itself (moved by a data-parallel
rank, freed for the next bind). A port probed free and released could be taken
by another process before the code bound it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager


@contextmanager
def held_tcp_ports(count: int = 1) -> Iterator[int]:
    """The first of ``count`` consecutive ports on 127.0.0.1, each held until the block ends.

    Each holder binds its port alone, then takes SO_REUSEADDR and never listens. By
    Linux's rule, sockets that all have SO_REUSEADDR may share a port none of them
    listens on: ZMQ binds with it, so the code under test binds the port, closes it
    and binds it again, while two of its own listeners still collide. Nothing that
    asks for a free port (a bind to port 0, an outgoing connection) is given a held
    one, and a bind without SO_REUSEADDR, another holder's included, is refused.
    """
    for _ in range(100):
        with ExitStack() as stack:
            holders = [stack.enter_context(socket.socket()) for _ in range(count)]
            holders[0].bind(("127.0.0.1", 0))
            base = holders[0].getsockname()[1]
            try:
                for offset, holder in enumerate(holders[1:], 1):
                    holder.bind(("127.0.0.1", base + offset))
            except (OSError, OverflowError):  # taken, or past the last port
                continue
            for holder in holders:  # only now: bound with it, a holder could share a port
                holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            yield base
            return
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")
