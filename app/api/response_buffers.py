"""The response bytes the server holds for clients still reading them, all connections together.

uvicorn writes a response into its connection's transport whole, and the
transport keeps what the client has not read yet: a default /api/v1/history
answers about 20 MiB, so ``max_connections`` clients that asked for it and
read slowly held about 20 GiB, bounded by nothing but ``send_timeout_s`` (and
that only for a client reading nothing at all). ``ResponseBuffers`` keeps the
total, for /metrics.

What is counted: the buffer of each connection whose transport paused
writing, that is whose buffer passed the transport's high-water mark (64 KiB;
``BoundedConnection`` reports each pause and resume). A connection below the
mark holds at most that, and is not counted: summing only the paused ones
leaves nothing to sum while clients read, which is every poll of the page.
"""

from __future__ import annotations

import asyncio


class ResponseBuffers:
    """Response bytes held now. Changed on the event loop only; ``held`` may be read from
    another thread (/metrics)."""

    def __init__(self) -> None:
        self._paused: set[asyncio.WriteTransport] = set()

    def paused(self, transport: asyncio.WriteTransport) -> None:
        """``transport``'s buffer passed its high-water mark: counted until it drains."""
        self._paused.add(transport)

    def resumed(self, transport: asyncio.WriteTransport) -> None:
        """``transport``'s buffer drained (or its connection is gone): no longer counted."""
        self._paused.discard(transport)

    def held(self) -> int:
        """Bytes held now in the paused transports' buffers (copied first: another thread
        may call this while the loop changes them)."""
        return sum(t.get_write_buffer_size() for t in tuple(self._paused))
