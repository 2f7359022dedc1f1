"""The response bytes the server holds for clients still reading them, all connections together.

uvicorn writes a response into its connection's transport whole, and the
transport keeps what the client has not read yet: a default /api/v1/history
answers about 20 MiB, so ``max_connections`` clients that asked for it and
read slowly held about 20 GiB, bounded by nothing but ``send_timeout_s`` (and
that only for a client reading nothing at all). ``ResponseBuffers`` keeps the
total, for the guard that refuses an answer that would pass
``response_buffer_bytes`` (app/api/guards/response_budget.py) and for /metrics.

The budget's last eighth is kept for Prometheus scrapes: other answers may
hold at most the rest, so slow readers of large answers cannot keep the scrape
that would show them from being answered.

What is counted:

- the buffer of each connection whose transport paused writing, that is whose
  buffer passed the transport's high-water mark (64 KiB; ``BoundedConnection``
  reports each pause and resume). A connection below the mark holds at most
  that, and is not counted: summing only the paused ones leaves the check
  nothing to sum while clients read, which is every poll of the page.
- each answer admitted but not yet written into its transport, from its check
  on: a response waits for its connection's earlier one to drain before it is
  written, and an answer admitted meanwhile must not take its room.
"""

from __future__ import annotations

import asyncio


class ResponseBuffers:
    """Response bytes held now against ``budget``. Changed on the event loop only; ``held``
    may be read from another thread (/metrics)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.scrape_reserve = budget // 8
        """Of ``budget``, what only scrapes may take."""
        self._paused: set[asyncio.WriteTransport] = set()
        self._pending = 0
        """Bytes of admitted answers not yet handed to their transport."""

    def paused(self, transport: asyncio.WriteTransport) -> None:
        """``transport``'s buffer passed its high-water mark: counted until it drains."""
        self._paused.add(transport)

    def resumed(self, transport: asyncio.WriteTransport) -> None:
        """``transport``'s buffer drained (or its connection is gone): no longer counted."""
        self._paused.discard(transport)

    def held(self) -> int:
        """Bytes held now: the paused transports' buffers and the admitted answers not yet
        written (copied first: another thread may call this while the loop changes them)."""
        return self._pending + sum(t.get_write_buffer_size() for t in tuple(self._paused))

    def room(self, scrape: bool) -> int:
        """The bytes that may be held once an answer is admitted: all of ``budget`` for a
        scrape, the rest less the scrape reserve for any other answer."""
        return self.budget if scrape else self.budget - self.scrape_reserve

    def admit(self, length: int, scrape: bool) -> bool:
        """Whether an answer of ``length`` bytes fits (a scrape's into the reserve as well),
        and if so charge it until ``written``.

        One larger than its room is admitted while nothing else is held, so every answer can
        be had from an otherwise idle sidecar.
        """
        held = self.held()
        if held and held + length > self.room(scrape):
            return False
        self._pending += length
        return True

    def written(self, length: int) -> None:
        """``length`` bytes of an admitted answer are in its transport (or never will be):
        counted from now by its transport's buffer, if at all."""
        self._pending -= length
