"""The index's listing: every block record entered, in creation order, for cursor paging.

A record stays listed when its block goes (finding it would cost a search per
removal): it is dead from then on, its location mask zero, and the index
counts it. Once the dead outnumber the live, a sweep drops them a few chunks
per batch applied, so no batch pays for the whole listing at once. Records
sit in tuples of ``CHUNK``: a tuple of untracked records leaves the cyclic
garbage collector's lists the first time it is seen, so a listing of millions
adds nothing to a full collection.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from operator import attrgetter
from typing import Final

from app.state.held_block import HeldBlock

CHUNK: Final = 4096
"""Records per chunk: the unit a sweep examines and the collector sees as one object."""

SLACK: Final = 1024
"""Dead records tolerated beyond the live ones before a sweep starts."""

SWEEP_RATE: Final = 4
"""Records a sweep examines per record the same batch appended: it catches up within a
third of its own length."""

SWEEP_MIN: Final = 8 * CHUNK
"""Records a running sweep examines per batch at least, so it ends when few blocks arrive."""

_held = attrgetter("mask")  # a record's mask is zero once its block is gone
_seq = attrgetter("seq")


class Listing:
    """Records in ascending sequence number, dead ones dropped as it goes.

    The index appends each new record to ``open`` (the open chunk), counts
    each record that dies in ``dead``, and calls ``settle`` once per batch: it
    closes full chunks and starts or continues a sweep.

    Memory: a sweep starts when the dead pass the live by ``slack`` (at most
    ``2 * max_blocks + slack`` records, plus one batch's appends) and ends
    before the listing grows by a third: never more than four records per block
    the index may hold (plus the slack and a chunk or two), and about two under
    a churn that drops the oldest blocks first.
    """

    def __init__(self, chunk: int = CHUNK, slack: int = SLACK, sweep_min: int = SWEEP_MIN) -> None:
        if chunk < 1 or slack < 0 or sweep_min < 1:
            raise ValueError(
                "chunk and sweep_min must be positive and slack not negative, "
                f"got {chunk}, {slack}, {sweep_min}"
            )
        self._chunk, self._slack, self._sweep_min = chunk, slack, sweep_min
        self.open: list[HeldBlock] = []
        """The open chunk: the newest records, appended by the index."""
        self.dead = 0
        """Listed records whose block is gone: the index counts them as they die."""
        self._closed: list[tuple[HeldBlock, ...]] = []
        self._lasts: list[int] = []  # each closed chunk's last sequence number, for bisect
        self._closed_records = 0
        self._sweep_at: int | None = None  # the next closed chunk a running sweep examines
        self._settled = 0  # records listed when it last settled

    def __len__(self) -> int:
        return self._closed_records + len(self.open)

    @property
    def closed_chunks(self) -> int:
        """Closed chunks: at most ``2 * len(self) / chunk + 2``, since a sweep merges two
        neighbours that fit in one and every chunk it has not reached yet is full."""
        return len(self._closed)

    def settle(self) -> None:
        """Close the open chunk's full chunks, then start or continue a sweep."""
        appended = len(self) - self._settled
        self._close_full_chunks()
        if self._sweep_at is None and self.dead > len(self) - self.dead + self._slack:
            self._sweep_at = 0
        if self._sweep_at is not None:
            self._sweep(self._sweep_at, max(SWEEP_RATE * appended, self._sweep_min))
        self._settled = len(self)

    def compact(self) -> None:
        """Drop every dead record now: after a mass removal (a publisher's reset), which paid
        for a walk of the index already, rather than leave pages to step over the dead."""
        self._close_full_chunks()
        self._sweep(0, len(self))
        self._settled = len(self)

    def _close_full_chunks(self) -> None:
        chunk, records = self._chunk, self.open
        while len(records) >= chunk:
            self._closed.append(tuple(records[:chunk]))
            self._lasts.append(records[chunk - 1].seq)
            self._closed_records += chunk
            del records[:chunk]

    def after(self, cursor: int | None) -> Iterator[HeldBlock]:
        """Every record, dead ones included, whose sequence number is above ``cursor`` (all of
        them for None), in order."""
        first = 0 if cursor is None else bisect_right(self._lasts, cursor)
        for records in (*self._closed[first:], self.open):
            start = 0 if cursor is None else bisect_right(records, cursor, key=_seq)
            yield from records[start:]

    def _sweep(self, number: int, budget: int) -> None:
        """Examine closed chunks from ``number`` on until ``budget`` records are seen; past the
        last, the open chunk too, which ends the sweep.

        Each examined chunk keeps its live records and is merged into the chunk
        before it when both fit in one, so the chunks stay bounded in number.
        """
        closed, lasts = self._closed, self._lasts
        while budget > 0 and number < len(closed):
            budget -= len(closed[number])
            records = self._live(closed[number])
            self._closed_records -= len(closed[number]) - len(records)
            if number and len(closed[number - 1]) + len(records) <= self._chunk:
                closed[number - 1] += records
                if records:
                    lasts[number - 1] = records[-1].seq
                del closed[number], lasts[number]
            elif not records:
                del closed[number], lasts[number]
            else:
                closed[number], lasts[number] = records, records[-1].seq
                number += 1
        if number < len(closed):
            self._sweep_at = number
            return
        self.open = list(self._live(tuple(self.open)))
        self._sweep_at = None

    def _live(self, records: tuple[HeldBlock, ...]) -> tuple[HeldBlock, ...]:
        """The records of one chunk still held (the same tuple when all are); counts the rest."""
        live = tuple(filter(_held, records))
        self.dead -= len(records) - len(live)
        return live if len(live) < len(records) else records
