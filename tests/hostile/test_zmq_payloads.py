"""Big payloads and label-like strings from a peer stay bounded (issue 15, items 6 and 7).

The event log was bounded in events, not bytes: a 4.5 MB frame added ~20 MB
to it, and two events of a giant frame made one feed page of 186 MB. Media
were unbounded: 50,000 distinct names grew the sidecar by 200 MB and made
every block's location mask a 50,000-bit integer; a 1 MB medium name was
taken. Frames go over real sockets to a live ingest thread.
"""

from __future__ import annotations

import sys
import tracemalloc

import pytest

from app.decode import decode_kv_payload
from app.state.event_log import EventLog
from offload.base import OffloadingEvent
from offload.wire.kv_events import BlockStored, KVEventBatch, encode_batch
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, ingesting, kv_payload, wait_connected

pytestmark = pytest.mark.timeout(120)

MiB = 2**20


def stored(*hashes: int, medium: str = "CPU") -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, medium, False)


def test_the_event_log_keeps_its_byte_bound_whatever_the_frames_hold() -> None:
    """Frames of 200,000 hashes each: the log sheds what does not fit and counts it."""
    log = EventLog(10_000, max_bytes=4 * MiB, max_batch_events=50)
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints, max_blocks=10, event_log=log) as ingestor:
            state = wait_connected(raw, ingestor)
            payloads = []
            for seq in range(10):
                giant = stored(*range(seq * 200_000, (seq + 1) * 200_000))  # one giant event
                payloads += [kv_payload(giant), kv_payload(*(stored(h) for h in range(100)))]
            tracemalloc.start()  # counts what the sidecar keeps, not the peer's own payloads
            try:
                for seq, payload in enumerate(payloads):
                    raw.send(seq, payload)
                # A wait for each frame: all twenty (ten of 200,000 hashes, traced) can take
                # a loaded machine longer than one wait, each of them never does.
                for seq in range(len(payloads)):
                    wait_until(
                        lambda seq=seq: state.last_seq is not None and state.last_seq >= seq,
                        f"frame {seq} applied",
                    )
                held, _peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert log.bytes <= log.max_bytes
            assert held < 3 * log.max_bytes  # +650 MB for one 100 MB frame before
            assert log.shed == 10 * (1 + 50)  # the giant events, and 50 past each batch's cap
            assert log.last_id == 10 * 101  # every event still took its id
            page = log.since(0, 1000, max_bytes=64 * 1024)
            assert 1 <= len(page) < 1000
    finally:
        raw.close()


def test_events_whose_first_hash_is_an_int_keep_the_byte_bound_with_bytes_after_it() -> None:
    """The log priced an event by its first hash: an int, then 64-byte hashes, held 2.6
    times its bound."""
    tail = [bytes([n % 256]) * 32 + n.to_bytes(32, "big") for n in range(300)]
    batches = [
        decode_kv_payload(
            encode_batch(
                KVEventBatch(1.0, [BlockStored([n, *tail], None, [], 16, None, "CPU", None)])
            )
        )
        for n in range(400)
    ]
    log = EventLog(10_000, max_bytes=4 * MiB)
    for seq, batch in enumerate(batches):
        log.record("p", seq, batch)
    assert log.bytes <= log.max_bytes
    kept = sum(  # the hash lists and hashes the log keeps alive
        sys.getsizeof(entry.event.block_hashes) + sum(map(sys.getsizeof, entry.event.block_hashes))
        for entry in log.since(0, 10_000)
    )
    assert 0 < kept <= log.max_bytes


def test_a_page_of_the_log_skips_the_ids_it_no_longer_holds() -> None:
    log = EventLog(5, max_bytes=MiB, max_batch_events=3)
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints, event_log=log) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(*(stored(h) for h in range(4))))  # ids 1-4, 4 shed
            raw.send(1, kv_payload(*(stored(h) for h in range(10, 13))))  # ids 5-7
            wait_until(lambda: state.last_seq == 1, "both applied")
            assert [event.id for event in log.since(0, 10)] == [2, 3, 5, 6, 7]
            assert [event.id for event in log.since(3, 10)] == [5, 6, 7]
            assert log.first_id() == 2 and log.shed == 1
    finally:
        raw.close()


def test_media_past_the_cap_are_refused_and_counted_and_blocks_stay_fast() -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints, max_blocks=10_000, max_media=4) as ingestor:
            state = wait_connected(raw, ingestor)
            for seq in range(200):
                raw.send(seq, kv_payload(stored(seq, medium=f"m{seq}")))
            wait_until(lambda: state.last_seq == 199, "every frame applied")
            index = ingestor.state.index
            with ingestor.state.lock:
                # The fourth place is held for the GPU, which no frame names.
                assert set(index.blocks_by_medium()) == {"m0", "m1", "m2"}
                assert index.locations.refused_media == {
                    "publisher": 0,
                    "host": 0,
                    "max_media": 197,
                }
                assert len(index) == 3
    finally:
        raw.close()


def big_medium_payload(medium: str) -> bytes:
    event = BlockStored([1], None, [], 16, None, medium, None)
    return encode_batch(KVEventBatch(ts=1.0, events=[event, BlockStored([2], None, [], 16, None,
                                                                        "CPU", None)]))  # fmt: skip


@pytest.mark.parametrize("medium", ["x" * MiB, "CPU\n", "C P U", "\u00e9"])
def test_a_medium_name_too_long_or_of_odd_characters_is_a_malformed_event(medium: str) -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, big_medium_payload(medium))
            wait_until(lambda: state.last_seq == 0, "the frame applied")
            with ingestor.state.lock:
                assert ingestor.state.index.blocks_by_medium() == {"CPU": 1}
            assert state.malformed == 1
    finally:
        raw.close()


def test_a_bytes_block_hash_longer_than_64_bytes_is_a_malformed_event() -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            long_hash = BlockStored([b"h" * 65], None, [], 16, None, "CPU", None)
            fine = BlockStored([b"h" * 32], None, [], 16, None, "CPU", None)
            raw.send(0, encode_batch(KVEventBatch(ts=1.0, events=[long_hash, fine])))
            wait_until(lambda: state.last_seq == 0, "the frame applied")
            assert state.malformed == 1 and len(ingestor.state.index) == 1
    finally:
        raw.close()


@pytest.mark.parametrize(
    "empty",
    [
        BlockStored([b""], None, [], 16, None, "CPU", None),
        BlockStored([b"h" * 32], b"", [], 16, None, "CPU", None),
    ],
    ids=["hash", "parent"],
)
def test_an_empty_bytes_block_hash_is_a_malformed_event(empty: BlockStored) -> None:
    """An empty hash was indexed and listed as ``0x``, a name /api/v1/blocks/{hash} refuses:
    a block no lookup could fetch."""
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            fine = BlockStored([b"f" * 32], None, [], 16, None, "CPU", None)
            raw.send(0, encode_batch(KVEventBatch(ts=1.0, events=[empty, fine])))
            wait_until(lambda: state.last_seq == 0, "the frame applied")
            assert state.malformed == 1
            with ingestor.state.lock:
                assert len(ingestor.state.index) == 1
                assert ingestor.state.index.get(b"f" * 32) is not None
    finally:
        raw.close()
