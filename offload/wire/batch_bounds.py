"""KV-event batches of bounded size: a flush's events cut into batches that any reader takes.

A reader refuses a message past its size limit (the sidecar's
``max_message_bytes``, 16 MiB by default), and ZMQ then drops the whole
connection, so a batch past it is lost with the next ones, and so is its
replay. A flush's events are usually a few kilobytes, but the removal a
reset announces names every block of the tier: half a million 32-byte
hashes print 16 MiB. So a flush sends at most ``MAX_BATCH_HASHES`` hashes a
batch, cutting an event where it must; the pieces of a stored event
continue one chain, each hanging under the last block of the piece before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from offload.base import OffloadingEvent

MAX_BATCH_HASHES: Final = 2**18
"""Most block hashes one batch names: about 8.7 MB of 32-byte hashes, half the sidecar's
default message limit, so that a flush is cut only when it must be (each cut is one more
message for ZMQ to hold: at 65,536 a subscriber that stopped reading doubled the worker's
growth)."""


def bounded_batches(
    events: list[OffloadingEvent], max_hashes: int = MAX_BATCH_HASHES
) -> Iterator[list[OffloadingEvent]]:
    """The events in order, in batches of at most ``max_hashes`` block hashes (an event
    with none still takes its place in a batch); the list itself when it fits in one."""
    if max_hashes < 1:
        raise ValueError(f"max_hashes must be at least 1, got {max_hashes}")
    if sum(len(event.block_hashes) for event in events) <= max_hashes:
        yield events
        return
    batch: list[OffloadingEvent] = []
    room = max_hashes
    for event in events:
        for piece in _pieces(event, max_hashes):
            if len(piece.block_hashes) > room:
                yield batch
                batch, room = [], max_hashes
            batch.append(piece)
            room -= len(piece.block_hashes)
    if batch:
        yield batch


def _pieces(event: OffloadingEvent, max_hashes: int) -> Iterator[OffloadingEvent]:
    """``event`` whole, or cut into pieces of at most ``max_hashes`` hashes."""
    hashes = event.block_hashes
    if len(hashes) <= max_hashes:
        yield event
        return
    parent = event.parent_block_hash
    for start in range(0, len(hashes), max_hashes):
        piece = hashes[start : start + max_hashes]
        yield OffloadingEvent(
            piece, event.block_size, event.medium, event.removed, parent, event.group_idx
        )
        parent = None if event.removed else piece[-1]
