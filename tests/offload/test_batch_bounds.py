"""A flush's KV events in batches every reader takes, however many blocks a reset names."""

from __future__ import annotations

import pytest
import zmq

from app.settings import IngestConfig
from offload.base import OffloadingEvent
from offload.wire.batch_bounds import MAX_BATCH_HASHES, bounded_batches
from offload.wire.kv_events import BlockRemoved, decode_batch
from offload.wire.publisher import EventPublisher
from tests.support.polling import wait_until

LIMIT = IngestConfig().max_message_bytes
"""The sidecar's message limit by default."""


def test_events_are_cut_at_the_bound_and_a_stored_chain_keeps_its_parents() -> None:
    events = [
        OffloadingEvent([1, 2], 16, "CPU", False, 0),
        OffloadingEvent(list(range(10, 17)), 16, "CPU", False, 2, group_idx=1),
        OffloadingEvent(list(range(20, 25)), 16, "CPU", True, group_idx=1),
        OffloadingEvent([], 16, "CPU", True),
    ]
    batches = list(bounded_batches(events, max_hashes=3))
    assert all(sum(len(e.block_hashes) for e in batch) <= 3 for batch in batches)
    flat = [event for batch in batches for event in batch]
    assert [h for e in flat for h in e.block_hashes] == [1, 2, *range(10, 17), *range(20, 25)]
    stored = [e for e in flat if not e.removed and e.block_hashes[0] >= 10]
    assert [(e.block_hashes, e.parent_block_hash) for e in stored] == [
        ([10, 11, 12], 2), ([13, 14, 15], 12), ([16], 15)
    ]  # fmt: skip
    assert all(e.parent_block_hash is None for e in flat if e.removed)
    assert [e.group_idx for e in flat] == [None, 1, 1, 1, 1, 1, None]  # each piece its group's
    assert flat[-1] == events[-1]


def test_a_flush_that_fits_is_one_batch_the_same_list() -> None:
    events = [OffloadingEvent([1, 2], 16, "CPU", False)]
    assert list(bounded_batches(events)) == [events]
    with pytest.raises(ValueError, match="max_hashes must be at least 1"):
        list(bounded_batches(events, max_hashes=0))


def test_a_reset_of_half_a_million_blocks_reaches_a_reader_with_the_default_limit() -> None:
    """500,000 32-byte hashes in one removal printed 16.2 MiB: over the sidecar's 16 MiB
    message limit, ZMQ dropped the connection and the reset (and its replay) were lost."""
    hashes = [number.to_bytes(32, "big") for number in range(500_000)]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.MAXMSGSIZE, LIMIT)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        with EventPublisher("tcp://127.0.0.1:*") as publisher:
            sub.connect(publisher.endpoint)

            def heard() -> bool:
                publisher.publish_events([OffloadingEvent([b"probe"], 16, "CPU", False)])
                return sub.poll(50) != 0

            wait_until(heard, "the subscriber hears the publisher")
            publisher.publish_events([OffloadingEvent(hashes, 16, "CPU", True)])
            received: list[bytes] = []

            def all_removed() -> bool:
                while sub.poll(50):
                    received.append(sub.recv_multipart()[2])
                batches = [decode_batch(payload) for payload in received]
                removed = [
                    h
                    for batch in batches
                    for event in batch.events
                    if isinstance(event, BlockRemoved)
                    for h in event.block_hashes
                ]
                return removed == hashes

            wait_until(all_removed, "every removal arrives")
    finally:
        ctx.destroy(linger=0)
    assert max(map(len, received)) < LIMIT
    assert len(received) > len(hashes) // MAX_BATCH_HASHES
