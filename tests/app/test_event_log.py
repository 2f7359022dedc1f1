"""The event log's rate: exact, in memory that does not grow with the batch rate."""

from __future__ import annotations

import tracemalloc

from app.decode import DecodedBatch, DecodedEvent
from app.state import event_log
from app.state.event_log import RATE_WINDOW_S, EventLog


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
