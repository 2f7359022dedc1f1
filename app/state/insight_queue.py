"""The queue between the ingest thread and the shadow thread, bounded in bytes.

Shadow tiers (whole managers per policy and capacity) cost far more per
sampled reference than the ingest thread can spend, so they run on a
thread of their own (app/ingest/shadow_thread.py). What waits for it is
bounded by an estimate of its memory; an item that does not fit is shed
whole and counted, never waited for: ingest must not slow down for a curve.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Final

from offload.base import BlockHash

LIST_BYTES: Final = 64
"""A Python list's own size, about: what each request and item costs besides its hashes."""
HASH_REF_BYTES: Final = 8
"""A list slot; the hash objects themselves are the decoded frame's, kept alive by the item."""
INT_HASH_BYTES: Final = 36
"""A Python int of up to 64 bits."""
BYTES_HASH_OVERHEAD: Final = 33
"""A bytes object's header; its content adds its length."""


def hashes_bytes(requests: Sequence[Sequence[BlockHash]]) -> int:
    """About the memory these requests hold (lists, slots and hash objects).

    A worker's hashes share one type, so the frame is priced in C-level passes
    (its hash types, then their lengths); only a frame that mixes types, which
    no worker sends, is priced hash by hash.
    """
    flat = list(chain.from_iterable(requests))
    total = LIST_BYTES * (len(requests) + 1) + HASH_REF_BYTES * len(flat)
    types = set(map(type, flat))
    if types <= {int}:
        return total + INT_HASH_BYTES * len(flat)
    if types == {bytes}:
        return total + BYTES_HASH_OVERHEAD * len(flat) + sum(map(len, flat))  # type: ignore[arg-type]
    return total + sum(
        INT_HASH_BYTES if type(h) is int else BYTES_HASH_OVERHEAD + len(h)  # type: ignore[arg-type]
        for h in flat
    )


Pace = Callable[[], None]
"""Called by a running item between two of its steps: returns once the shadow thread is
within its CPU share again, so the share holds inside a long item too."""


@dataclass(slots=True)
class ShadowWork:
    """One sample frame's requests for one publisher's shadow tiers (or one recomputation).

    ``apply`` runs them (on the shadow thread), calling the ``Pace`` it is
    given between steps; ``shed`` is called instead when the queue has no
    room, so the publisher counts what it lost.
    """

    apply: Callable[[Pace], None]
    shed: Callable[[], None]
    bytes: int


@dataclass(slots=True)
class ShadowQueue:
    """Items for the shadow thread, at most ``max_bytes`` of them (estimated)."""

    max_bytes: int
    bytes: int = 0
    items: int = 0
    unfinished: int = 0
    """Items put and not yet applied (queued, or being applied): 0 once the shadows caught up."""
    shed: int = 0
    """Items refused because the queue was full."""
    _queue: deque[ShadowWork] = field(default_factory=deque)
    _ready: threading.Condition = field(default_factory=threading.Condition)

    def put(self, work: ShadowWork) -> bool:
        """Queue ``work``, or shed it (its ``shed`` called, counted) when it does not fit."""
        with self._ready:
            fits = self.bytes + work.bytes <= self.max_bytes
            if fits:
                self._queue.append(work)
                self.bytes += work.bytes
                self.items += 1
                self.unfinished += 1
                self._ready.notify()
            else:
                self.shed += 1
        if not fits:
            work.shed()
        return fits

    def get(self, timeout: float) -> ShadowWork | None:
        """The oldest item, waiting up to ``timeout`` seconds for one; None if none came."""
        with self._ready:
            if not self._queue:
                self._ready.wait(timeout)
            if not self._queue:
                return None
            work = self._queue.popleft()
            self.bytes -= work.bytes
            self.items -= 1
            return work

    def finished(self) -> None:
        """One item ``get`` handed out was applied (or failed): the thread calls this."""
        with self._ready:
            self.unfinished -= 1
