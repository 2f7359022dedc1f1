"""Ingest over real ZMQ sockets: the index follows publishers through gaps and restarts.

Publishers are kvscope's own EventPublisher and, where a test needs a stream
kvscope's publisher would never send (a lost frame, garbage), a minimal
publisher speaking vLLM's protocol on real sockets. Waits poll a condition
for up to 15 s (tests/support/polling.py); nothing asserts on time.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import msgspec
import pytest

from app.ingest import Ingestor
from app.settings import PublisherEndpoints, SidecarSettings
from app.state.block_index import BlockIndex
from app.state.event_log import EventLog
from app.state.sidecar import SidecarState
from offload.base import OffloadingEvent
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import StatsFrame, WorkerConfig
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, kv_payload

pytestmark = pytest.mark.timeout(120)


def stored(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, "CPU", False)


def removed(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, "CPU", True)


def a_stats_frame() -> StatsFrame:
    return StatsFrame(
        ts=1.0, engine_id="e0", rank=0,
        config=WorkerConfig(policy="lru", capacity_blocks=8, block_size=16),
    )  # fmt: skip


def connected(ingestor: Ingestor, publisher: EventPublisher) -> None:
    """Probe with stats frames until the sidecar's subscription is live (slow joiner)."""
    state = ingestor.state.publishers[publisher.endpoint]

    def seen() -> bool:
        publisher.publish_stats(a_stats_frame())
        return state.stats_frames > 0

    wait_until(seen, "the sidecar receives the publisher")


def cpu_blocks(ingestor: Ingestor) -> set:
    with ingestor.state.lock:
        return {h for h in range(200) if ingestor.state.index.get(h) is not None}


@pytest.fixture
def publisher() -> Iterator[EventPublisher]:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as pub:
        yield pub


def start_ingest(*publishers: PublisherEndpoints) -> Ingestor:
    ingestor = Ingestor(SidecarState(BlockIndex(max_blocks=1000), EventLog(1000), publishers))
    ingestor.start()
    return ingestor


def endpoints(publisher: EventPublisher) -> PublisherEndpoints:
    return PublisherEndpoints(publisher.endpoint, publisher.replay_endpoint)


def test_the_index_holds_what_was_published(publisher: EventPublisher) -> None:
    ingestor = start_ingest(endpoints(publisher))
    try:
        connected(ingestor, publisher)
        publisher.publish_events([stored(*range(10))])
        publisher.publish_events([removed(3, 4), stored(20)])
        wait_until(lambda: cpu_blocks(ingestor) == {0, 1, 2, 5, 6, 7, 8, 9, 20}, "index")
        state = ingestor.state.publishers[publisher.endpoint]
        assert (state.gaps, state.missed, state.restarts, state.malformed) == (0, 0, 0, 0)
        assert state.stats is not None and state.stats.engine_id == "e0"
        with ingestor.state.lock:
            assert ingestor.state.index.blocks_by_medium() == {"CPU": 9}
    finally:
        ingestor.close()


class WatchedLock:
    """The sidecar's lock, noting how many blocks the index holds at each release."""

    def __init__(self, index: BlockIndex) -> None:
        self._lock = threading.Lock()
        self._index = index
        self.held_at_release: list[int] = []

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.held_at_release.append(len(self._index))
        self._lock.release()


def test_the_largest_batch_cap_the_settings_take_logs_every_event(
    publisher: EventPublisher,
) -> None:
    """``KVSCOPE_EVENT_BATCH_MAX`` takes 20 digits; one past ``sys.maxsize`` broke the log's
    cut of a batch, so every batch was counted as malformed and the feed stayed empty."""
    settings = SidecarSettings(connect=[publisher.endpoint], event_batch_max="9" * 20)
    ingestor = Ingestor(SidecarState.from_settings(settings))
    ingestor.start()
    try:
        connected(ingestor, publisher)
        publisher.publish_events([stored(1, 2, 3), stored(7)])
        state, log = ingestor.state.publishers[publisher.endpoint], ingestor.state.event_log
        wait_until(lambda: state.malformed or log.last_id == 2, "the batch logged or refused")
        assert state.malformed == 0
        assert [e.event.block_hashes for e in log.page(0, 10).events] == [[1, 2, 3], [7]]
    finally:
        ingestor.close()


def test_a_frame_is_applied_in_parts_letting_readers_in_between(
    publisher: EventPublisher,
) -> None:
    """The ingest thread lets the index's lock go after each part of a batch (two blocks a
    part here), so a reader waits for a part, not for a 16 MB frame."""
    index = BlockIndex(max_blocks=1000, part_blocks=2)
    sidecar = SidecarState(index, EventLog(1000), (endpoints(publisher),))
    lock = sidecar.lock = WatchedLock(index)  # type: ignore[assignment]
    ingestor = Ingestor(sidecar)
    ingestor.start()
    try:
        connected(ingestor, publisher)
        publisher.publish_events([stored(*range(5))])
        wait_until(lambda: cpu_blocks(ingestor) == set(range(5)), "index")
        assert {2, 4} <= set(lock.held_at_release), "the lock was let go between parts"
    finally:
        ingestor.close()


def test_a_sidecar_started_after_the_worker_catches_up_from_replay(
    publisher: EventPublisher,
) -> None:
    publisher.publish_events([stored(1, 2, 3)])
    wait_until(lambda: publisher.batches_published == 1, "first batch sent")
    publisher.publish_events([removed(2)])
    wait_until(lambda: publisher.batches_published == 2, "second batch sent")
    ingestor = start_ingest(endpoints(publisher))
    try:
        connected(ingestor, publisher)
        publisher.publish_events([stored(4)])
        wait_until(lambda: cpu_blocks(ingestor) == {1, 3, 4}, "caught up")
        state = ingestor.state.publishers[publisher.endpoint]
        assert state.replayed >= 2 and state.gaps == 0 and state.missed == 0
    finally:
        ingestor.close()


def probe_until_connected(raw: RawPublisher, ingestor: Ingestor) -> None:
    state = ingestor.state.publishers[raw.endpoints.endpoint]

    def seen() -> bool:
        raw.pub.send_multipart(
            [b"kvscope.stats", b"\0" * 8, msgspec.msgpack.encode(a_stats_frame())]
        )
        return state.stats_frames > 0

    wait_until(seen, "the sidecar receives the raw publisher")


def test_a_lost_frame_is_filled_from_the_replay_socket() -> None:
    raw = RawPublisher()
    ingestor = start_ingest(raw.endpoints)
    try:
        probe_until_connected(raw, ingestor)
        raw.send(0, kv_payload(stored(1, 2)))
        raw.send(1, kv_payload(stored(3)), lose=True)
        raw.send(2, kv_payload(removed(1)))
        wait_until(lambda: cpu_blocks(ingestor) == {2, 3}, "gap filled")
        state = ingestor.state.publishers[raw.endpoints.endpoint]
        assert (state.gaps, state.missed, state.last_seq) == (1, 0, 2)
    finally:
        ingestor.close()
        raw.close()


def test_malformed_frames_are_counted_and_skipped() -> None:
    raw = RawPublisher()
    ingestor = start_ingest(raw.endpoints)
    try:
        probe_until_connected(raw, ingestor)
        state = ingestor.state.publishers[raw.endpoints.endpoint]
        raw.pub.send_multipart([b"", (0).to_bytes(8, "big"), b"\xc1 not msgpack"])
        raw.pub.send_multipart([b"", b"short", kv_payload(stored(9))])
        raw.pub.send_multipart([b"only one frame"])
        wait_until(lambda: state.malformed == 3, "three malformed frames counted")
        raw.send(0, kv_payload(stored(7)))
        wait_until(lambda: cpu_blocks(ingestor) == {7}, "later frames still applied")
    finally:
        ingestor.close()
        raw.close()


def test_a_negative_sequence_number_is_malformed_and_wedges_nothing() -> None:
    """(-5) as 8 signed bytes was read as a restart, and every later gap replay then failed."""
    raw = RawPublisher()
    ingestor = start_ingest(raw.endpoints)
    try:
        probe_until_connected(raw, ingestor)
        state = ingestor.state.publishers[raw.endpoints.endpoint]
        for seq in range(10):
            raw.send(seq, kv_payload(stored(seq)))
        raw.pub.send_multipart([b"", (-5).to_bytes(8, "big", signed=True), kv_payload(stored(99))])
        raw.send(10, kv_payload(stored(10)), lose=True)  # a gap: replayed from seq 10
        for seq in range(11, 20):
            raw.send(seq, kv_payload(stored(seq)))
        wait_until(lambda: state.last_seq == 19, "the publisher advances past the bad frame")
        assert cpu_blocks(ingestor) == set(range(20))
        assert (state.malformed, state.restarts, state.gaps, state.missed) == (1, 0, 1, 0)
    finally:
        ingestor.close()
        raw.close()


def test_a_sequence_that_jumps_billions_ahead_is_a_restart_not_billions_missed() -> None:
    raw = RawPublisher()
    ingestor = start_ingest(raw.endpoints)
    try:
        probe_until_connected(raw, ingestor)
        state = ingestor.state.publishers[raw.endpoints.endpoint]
        raw.send(0, kv_payload(stored(1)))
        raw.send(1, kv_payload(stored(2)))
        wait_until(lambda: state.last_seq == 1, "the first batches applied")
        with raw._lock:
            raw.buffer.clear()  # a new sequence: nothing before it to replay
        raw.send(2**62, kv_payload(stored(3)))
        wait_until(lambda: state.last_seq == 2**62, "the jumped batch applied")
        assert cpu_blocks(ingestor) == {3}
        assert (state.restarts, state.gaps, state.missed) == (1, 0, 0)
    finally:
        ingestor.close()
        raw.close()


def test_a_restarted_publisher_resets_its_own_view_only() -> None:
    first, other = RawPublisher(), RawPublisher()
    ingestor = start_ingest(first.endpoints, other.endpoints)
    try:
        probe_until_connected(first, ingestor)
        probe_until_connected(other, ingestor)
        first.send(0, kv_payload(stored(1, 2)))
        first.send(1, kv_payload(stored(3)))
        other.send(0, kv_payload(stored(50)))
        wait_until(lambda: cpu_blocks(ingestor) == {1, 2, 3, 50}, "both streams applied")
        with first._lock:
            first.buffer.clear()  # the restarted process has an empty replay buffer
        first.send(0, kv_payload(stored(4)))  # the sequence starts over
        wait_until(lambda: cpu_blocks(ingestor) == {4, 50}, "first publisher's view rebuilt")
        assert ingestor.state.publishers[first.endpoints.endpoint].restarts == 1
        assert ingestor.state.publishers[other.endpoints.endpoint].restarts == 0
    finally:
        ingestor.close()
        first.close()
        other.close()


def test_the_ingest_thread_collects_the_young_generation_itself(
    publisher: EventPublisher,
) -> None:
    """The event log frees an old event per new one, so CPython's allocation count would
    leave its young objects to pile up: the thread collects them (and, every tenth time, the
    middle generation they are promoted to) on its own clock, idle or busy."""
    collections: list[tuple[str, int]] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append((threading.current_thread().name, info["generation"]))

    ingestor = start_ingest(endpoints(publisher))
    try:
        connected(ingestor, publisher)
        for start in range(0, 30_000, 10):  # 3,000 events: three times round the event log
            publisher.publish_events([stored(*range(start, start + 10))])
        wait_until(lambda: ingestor.state.event_log.last_id >= 3000, "every event logged")
        gc.callbacks.append(record)
        try:
            wait_until(lambda: ("kvscope-ingest", 0) in collections, "a young collection")
            wait_until(lambda: ("kvscope-ingest", 1) in collections, "a middle collection")
        finally:
            gc.callbacks.remove(record)
    finally:
        ingestor.close()


def test_a_publisher_on_an_ipv6_address_is_bound_reached_and_replayed_from() -> None:
    """The settings take a bracketed IPv6 address to bind and to connect to, but ZMQ reaches
    one only from a socket with its IPv6 option set: the publisher's bind failed ('No such
    device'), and the sidecar's subscription and replay connected for ever in silence."""
    with EventPublisher("tcp://[::1]:*", "tcp://[::1]:*") as publisher:
        publisher.publish_events([stored(1, 2)])
        wait_until(lambda: publisher.batches_published == 1, "first batch sent")
        ingestor = start_ingest(endpoints(publisher))
        try:
            connected(ingestor, publisher)
            publisher.publish_events([stored(3)])
            wait_until(lambda: cpu_blocks(ingestor) == {1, 2, 3}, "caught up from replay")
            state = ingestor.state.publishers[publisher.endpoint]
            assert state.replayed >= 1 and state.missed == 0
        finally:
            ingestor.close()
