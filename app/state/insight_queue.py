"""The queue between the ingest thread and the shadow thread, bounded in bytes.

Shadow tiers (whole managers per policy and capacity) cost far more per
sampled reference than the ingest thread can spend, so they run on a
thread of their own (app/ingest/shadow_thread.py). What waits for it is
bounded by an estimate of its memory; an item that does not fit is shed
whole and counted, never waited for: ingest must not slow down for a curve.
The publishers share the queue: each holds at most an equal share among
those that queued lately, so one that sends far more than the others (or
floods on purpose) sheds its own items, not theirs, while one alone has
all of it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Final

from offload.base import BlockHash

LIST_BYTES: Final = 80
"""A Python list's own size with the collector's header and the slot that holds it (as
tracemalloc counts them): what each request and item costs besides its hashes."""
HASH_REF_BYTES: Final = 9
"""A list slot and its share of the spare room a decoded list grows with (an eighth); the
hash objects are the decoded frame's, kept alive by the item."""
INT_HASH_BYTES: Final = 36
"""A Python int of up to 64 bits."""
COUNT_BYTES: Final = 36
"""A block count beside a request's hashes: its list slot and its int."""
BYTES_HASH_OVERHEAD: Final = 33
"""A bytes object's header; its content adds its length."""
ACTIVE_S: Final = 10.0
"""A publisher that queued (or tried to) within this many seconds counts in the share."""


def requests_bytes(requests: Sequence[Sequence[BlockHash]], counts: Sequence[int]) -> int:
    """About the memory a frame's requests hold: their hashes (lists, slots and hash
    objects) and the column of their block counts.

    A worker's hashes share one type, so the frame is priced in C-level passes
    over its hashes (their types, then their lengths), with no list built for
    them; only a frame that mixes types, which no worker sends, is priced hash
    by hash.
    """
    count = sum(map(len, requests))
    total = LIST_BYTES * (len(requests) + 2) + COUNT_BYTES * len(counts) + HASH_REF_BYTES * count
    types = set(map(type, chain.from_iterable(requests)))
    if types <= {int}:
        return total + INT_HASH_BYTES * count
    if types == {bytes}:
        lengths = sum(map(len, chain.from_iterable(requests)))  # type: ignore[arg-type]
        return total + BYTES_HASH_OVERHEAD * count + lengths
    return total + sum(
        INT_HASH_BYTES if type(h) is int else BYTES_HASH_OVERHEAD + len(h)  # type: ignore[arg-type]
        for h in chain.from_iterable(requests)
    )


Pace = Callable[[], None]
"""Called by a running item between two of its steps: returns once the shadow thread is
within its CPU share again, so the share holds inside a long item too."""


@dataclass(slots=True)
class ShadowWork:
    """One sample frame's requests for one publisher's shadow tiers (or one recomputation).

    ``apply`` runs them (on the shadow thread), calling the ``Pace`` it is
    given between steps; ``shed`` is called instead when the queue has no
    room, so the publisher counts what it lost. ``owner`` is the publisher
    (anything hashable that names it), for its share of the queue.
    """

    apply: Callable[[Pace], None]
    shed: Callable[[], None]
    bytes: int
    owner: Hashable


@dataclass(slots=True)
class ShadowQueue:
    """Items for the shadow thread, at most ``max_bytes`` of them (estimated), each owner at
    most its share: ``max_bytes`` over the owners that put (or tried to) in the last
    ``ACTIVE_S`` seconds of ``clock``."""

    max_bytes: int
    clock: Callable[[], float] = time.monotonic
    bytes: int = 0
    items: int = 0
    unfinished: int = 0
    """Items put and not yet applied (queued, or being applied): 0 once the shadows caught up."""
    shed: int = 0
    """Items refused because the queue, or their owner's share of it, was full."""
    _queue: deque[ShadowWork] = field(default_factory=deque)
    _held: dict[Hashable, int] = field(default_factory=dict)
    """Bytes queued per owner (an owner leaves it when its last item is taken)."""
    _asked: OrderedDict[Hashable, float] = field(default_factory=OrderedDict)
    """When each owner last put, oldest first: those within ``ACTIVE_S`` share the queue."""
    _ready: threading.Condition = field(default_factory=threading.Condition)

    def put(self, work: ShadowWork) -> bool:
        """Queue ``work``, or shed it (its ``shed`` called, counted) when it does not fit."""
        with self._ready:
            share = self.max_bytes / self._active(work.owner)  # first: an owner refused counts
            held = self._held.get(work.owner, 0) + work.bytes
            fits = self.bytes + work.bytes <= self.max_bytes and held <= share
            if fits:
                self._queue.append(work)
                self._held[work.owner] = held
                self.bytes += work.bytes
                self.items += 1
                self.unfinished += 1
                self._ready.notify()
            else:
                self.shed += 1
        if not fits:
            work.shed()
        return fits

    def _active(self, owner: Hashable) -> int:
        """Owners that put lately, ``owner`` (putting now) among them; the others forgotten."""
        now = self.clock()
        asked = self._asked
        asked[owner] = now
        asked.move_to_end(owner)
        while next(iter(asked.values())) < now - ACTIVE_S:
            asked.popitem(last=False)
        return len(asked)

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
            left = self._held.pop(work.owner, 0) - work.bytes
            if left:
                self._held[work.owner] = left
            return work

    def finished(self) -> None:
        """One item ``get`` handed out was applied (or failed): the thread calls this."""
        with self._ready:
            self.unfinished -= 1
