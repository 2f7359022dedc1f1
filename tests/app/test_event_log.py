"""The event log's rate: exact, in memory that does not grow with the batch rate; and its
estimate of what an event keeps, a bound."""

from __future__ import annotations

import tracemalloc

import pytest

from app.decode import DecodedBatch, DecodedEvent, decode_kv_payload
from app.state import event_log
from app.state.event_log import RATE_WINDOW_S, EventLog
from offload.wire.kv_events import BlockStored, KVEventBatch, encode_batch


def one_event_batch(block_hash: int) -> DecodedBatch:
    return DecodedBatch(ts=1.0, rank=None, events=[DecodedEvent("stored", [block_hash], "CPU")])


def test_the_rate_counts_every_event_in_memory_bounded_whatever_the_batch_rate() -> None:
    """A peer sending tiny batches as fast as ingest takes them once grew the rate's memory by
    an entry per batch for the whole window (millions of entries)."""
    log = EventLog(capacity=10)
    batches = [one_event_batch(n) for n in range(50_000)]
    tracemalloc.start()
    try:
        for number, batch in enumerate(batches):
            log.record("p", number, batch)
        held = tracemalloc.Filter(True, event_log.__file__)
        taken = sum(
            s.size for s in tracemalloc.take_snapshot().filter_traces([held]).statistics("filename")
        )
    finally:
        tracemalloc.stop()
    assert log.events_per_s() == 50_000 / RATE_WINDOW_S
    assert log.last_id == 50_000
    assert taken < 64 << 10, f"{taken} bytes held for 50,000 batches"


@pytest.mark.parametrize(
    ("hashes", "parent"),
    [
        ([2**62 + n for n in range(4)], 2**62 - 1),
        ([bytes([n]) * 32 for n in range(4)], b"\xff" * 32),
        ([bytes([n]) * 64 for n in range(1)], b"\xff" * 64),
        ([10**18], None),
    ],
    ids=["int", "bytes32", "bytes64", "no parent"],
)
def test_an_events_estimated_bytes_bound_what_decoding_and_logging_it_keeps(
    hashes: list, parent: object
) -> None:
    """The log's byte budget is only a bound if each estimate is: it left out the parent
    hash and priced the event's objects under what they take (458 bytes held against 405
    estimated for one bytes hash and its parent)."""
    stored = BlockStored(hashes, parent, [], 16, None, "CPU", None, group_idx=2**31 - 1)
    payload = encode_batch(KVEventBatch(ts=1.0, events=[stored] * 1000))
    tracemalloc.start()
    try:
        events = decode_kv_payload(payload).events
        logged = [event_log.LoggedEvent(n, "p", 0, 1.0, e) for n, e in enumerate(events)]
        taken, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert taken <= sum(event_log.estimated_bytes(entry.event) for entry in logged)
