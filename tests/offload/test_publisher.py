"""The publisher over real ZMQ sockets on loopback: order, topics, replay, drops.

Every port is a wildcard bind or one held for the test (tests/support/ports.py), so
tests never collide. Waits are generous polls (several seconds) that return as soon as
the frame arrives: a healthy run takes well under a second, a loaded one still passes.
Nothing asserts on how long anything took.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from offload.base import OffloadingEvent
from offload.cpu.manager import CPUOffloadingManager
from offload.telemetry import metrics as m
from offload.wire import publisher as publisher_module
from offload.wire.framing import DEFAULT_STATS_TOPIC, END_OF_REPLAY_SEQ
from offload.wire.heartbeat import PINGS_PER_TIMEOUT
from offload.wire.kv_events import (
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    to_kv_events,
)
from offload.wire.log_limit import LogLimiter
from offload.wire.publisher import EventPublisher, NullPublisher
from offload.wire.stats_frame import (
    HistogramSnapshot,
    Sample,
    StatsFrame,
    UnsupportedStatsVersion,
    WorkerConfig,
    decode_stats_frame,
    encode_stats_frame,
)
from offload.worker_telemetry import WorkerTelemetry, publisher_snapshot
from tests.support.polling import wait_until
from tests.support.ports import held_tcp_ports
from tests.support.zmtp_peer import handshake, pings_until_closed

pytestmark = pytest.mark.timeout(120)

WAIT_MS = 10_000
KV_TOPIC = b""


def stored(*hashes: object) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), block_size=16, medium="CPU", removed=False)


def removed(*hashes: object) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), block_size=16, medium="CPU", removed=True)


def a_frame(ts: float = 1.0) -> StatsFrame:
    return StatsFrame(
        ts=ts,
        engine_id="engine-0",
        rank=0,
        config=WorkerConfig(policy="lru", capacity_blocks=64, block_size=16, bytes_per_block=4096),
        counters=[Sample(name="kvscope_stores_total", labels={"medium": "CPU"}, value=7.0)],
        gauges=[Sample(name="kvscope_blocks_used", value=3.0)],
        histograms=[
            HistogramSnapshot(
                name="kvscope_transfer_seconds",
                labels={"direction": "gpu_to_cpu"},
                buckets=[0.001, 0.01, math.inf],
                counts=[1, 3, 4],
                sum=0.05,
                count=4,
            )
        ],
    )


def recv(sock: zmq.Socket) -> list[bytes]:
    assert sock.poll(WAIT_MS), f"nothing received within {WAIT_MS} ms"
    return sock.recv_multipart()


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def publisher() -> Iterator[EventPublisher]:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as pub:
        yield pub


def subscribe(ctx: zmq.Context, publisher: EventPublisher) -> tuple[zmq.Socket, int]:
    """A SUB socket known to be connected to a fresh publisher, and its last stats seq.

    A new subscription takes a moment to reach the PUB socket, and frames sent
    before that are lost ("slow joiner"). Probing with stats frames until one
    arrives proves the subscription is live without spending KV sequence
    numbers; reading on to the last probe (seq = probes - 1 on a fresh
    publisher) leaves no probe in flight.
    """
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, KV_TOPIC)
    sub.connect(publisher.endpoint)
    probes = 0
    deadline = time.monotonic() + WAIT_MS / 1000
    while not sub.poll(50):
        assert time.monotonic() < deadline, "the subscriber never connected"
        publisher.publish_stats(a_frame())
        probes += 1
    while recv_topic(sub, DEFAULT_STATS_TOPIC)[0] != probes - 1:
        pass
    return sub, probes - 1


def recv_topic(sub: zmq.Socket, topic: bytes) -> tuple[int, bytes]:
    """The next (seq, payload) on one topic; the default KV topic b"" matches all."""
    while True:
        got_topic, seq, payload = recv(sub)
        if got_topic == topic:
            return seq_of(seq), payload


def replay(ctx: zmq.Context, publisher: EventPublisher, request: bytes) -> list[list[bytes]]:
    """Ask the replay socket as a DEALER; every answer up to and including the end."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    dealer.send_multipart([b"", request])
    answers = []
    while not answers or answers[-1][2] != END_OF_REPLAY_SEQ:
        answers.append(recv(dealer))
    dealer.close(linger=0)
    return answers


def publish_kv_batches(n: int) -> list[list[OffloadingEvent]]:
    """The events of publish_kv's n batches."""
    return [[stored(i, f"h{i}".encode()), removed(i - 1)] for i in range(n)]


def publish_kv(publisher: EventPublisher, n: int) -> list[list[OffloadingEvent]]:
    """n batches mixing stores and removals, int and bytes hashes.

    Each publish waits for its batch to go out, so that the flush coalesces
    nothing and batch i holds exactly the i-th publish.
    """
    batches = publish_kv_batches(n)
    for sent, batch in enumerate(batches, start=1):
        publisher.publish_events(batch)
        wait_until(lambda sent=sent: publisher.batches_published == sent, f"batch {sent} sent")
    return batches


def assert_batch_matches(payload: bytes, events: list[OffloadingEvent]) -> None:
    assert_events_match(decode_batch(payload).events, events)


def assert_events_match(wire_events: list, events: list[OffloadingEvent]) -> None:
    assert len(wire_events) == len(events)
    for got, sent in zip(wire_events, events, strict=True):
        assert type(got) is (BlockRemoved if sent.removed else BlockStored)
        assert got.block_hashes == sent.block_hashes
        assert got.medium == "CPU"
        if isinstance(got, BlockStored):
            assert (got.block_size, got.token_ids, got.parent_block_hash) == (16, [], None)


def test_wildcard_endpoints_report_the_bound_ports(publisher: EventPublisher) -> None:
    assert publisher.endpoint.startswith("tcp://127.0.0.1:")
    assert not publisher.endpoint.endswith("*")
    assert publisher.replay_endpoint is not None
    assert not publisher.replay_endpoint.endswith("*")


def test_kv_batches_arrive_in_order_with_contiguous_sequences(
    ctx: zmq.Context, publisher: EventPublisher
) -> None:
    sub, _ = subscribe(ctx, publisher)
    sent = [[stored(i, f"h{i}".encode()), removed(i)] for i in range(25)]
    for events in sent:
        publisher.publish_events(events)
        publisher.publish_events([])  # nothing to say: no batch, no sequence number
    expected = [event for events in sent for event in events]

    # Publishes queued within one flush interval travel as one batch: what is
    # guaranteed is the order of the events and gap-free sequence numbers.
    received: list[tuple[int, bytes]] = []
    while sum(len(decode_batch(payload).events) for _, payload in received) < len(expected):
        received.append(recv_topic(sub, KV_TOPIC))

    assert [seq for seq, _ in received] == list(range(len(received)))
    wait_until(lambda: publisher.events_published == len(expected), "every event sent")
    got = [event for _, payload in received for event in decode_batch(payload).events]
    assert_events_match(got, expected)


def test_an_event_msgpack_cannot_carry_is_left_out_and_counted_not_its_batch(
    ctx: zmq.Context, publisher: EventPublisher
) -> None:
    """An int hash past 64 bits failed the whole batch's encoding: its good events were lost
    with no sequence number used, so no subscriber could see a gap."""
    sub, _ = subscribe(ctx, publisher)
    publisher.publish_events([stored(1, 2), stored(2**64), removed(1)])
    seq, payload = recv_topic(sub, KV_TOPIC)
    assert seq == 0
    assert_batch_matches(payload, [stored(1, 2), removed(1)])
    assert publisher.unsendable_events == 1
    publisher.publish_events([stored(2**70), removed(b"x" * 8, -(2**64))])  # nothing to send
    publisher.publish_events([stored(3)])
    seq, payload = recv_topic(sub, KV_TOPIC)
    assert seq == 1  # the batch with nothing sendable took no number
    assert_batch_matches(payload, [stored(3)])
    assert publisher.unsendable_events == 3
    snapshot = publisher_snapshot(publisher)
    [sample] = [c for c in snapshot.counters if c.name == m.PUBLISHER_UNSENDABLE_EVENTS_TOTAL.name]
    assert sample.value == 3


def test_stats_frames_have_their_own_topic_and_sequence(
    ctx: zmq.Context, publisher: EventPublisher
) -> None:
    sub, last_probe = subscribe(ctx, publisher)
    frames = [a_frame(ts=float(i)) for i in range(5)]
    for frame in frames:
        publisher.publish_stats(frame)
        publisher.publish_events([stored(1)])

    stats = [recv_topic(sub, DEFAULT_STATS_TOPIC) for _ in frames]

    assert [seq for seq, _ in stats] == list(range(last_probe + 1, last_probe + 1 + len(frames)))
    assert [decode_stats_frame(payload) for _, payload in stats] == frames
    wait_until(lambda: publisher.events_published == len(frames), "every frame sent")


def test_a_publisher_kept_alive_sends_stats_while_the_engine_sends_none(ctx: zmq.Context) -> None:
    """Stats frames rode the engine's steps: an idle engine sent none, and the sidecar's lag
    alert could not tell it from a dead one."""
    made: list[float] = []
    with EventPublisher("tcp://127.0.0.1:*", heartbeat_s=0.2) as publisher:

        def beat() -> None:
            made.append(float(len(made)))
            publisher.publish_stats(a_frame(ts=made[-1]))

        sub, last_probe = subscribe(ctx, publisher)
        publisher.keep_alive(beat)
        beats = [recv_topic(sub, DEFAULT_STATS_TOPIC) for _ in range(3)]
    assert [seq for seq, _ in beats] == [last_probe + 1, last_probe + 2, last_probe + 3]
    assert [decode_stats_frame(payload).ts for _, payload in beats] == made[:3]


def test_a_heartbeat_that_cannot_make_its_frame_is_logged_and_the_publisher_goes_on(
    ctx: zmq.Context, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The publishers' limiter is the module's: a heartbeat failure another test logged within
    # its interval would hold this test's line back. A fresh one starts this test clean.
    monkeypatch.setattr(publisher_module, "_log", LogLimiter(publisher_module.logger))

    def broken() -> None:
        raise RuntimeError("the manager is gone")

    with EventPublisher("tcp://127.0.0.1:*", heartbeat_s=0.1) as publisher:
        sub, _ = subscribe(ctx, publisher)
        publisher.keep_alive(broken)
        wait_until(lambda: "could not make a stats frame" in caplog.text, "the failure logged")
        publish_kv(publisher, 2)
        assert decode_batch(recv_topic(sub, KV_TOPIC)[1]).events


def test_a_worker_with_a_publisher_keeps_it_alive_with_its_own_stats(ctx: zmq.Context) -> None:
    manager = CPUOffloadingManager(16, 64, "arc", enable_events=True)
    with EventPublisher("tcp://127.0.0.1:*", heartbeat_s=0.2) as publisher:
        sub, _ = subscribe(ctx, publisher)
        WorkerTelemetry(manager, engine_id="idle-engine", publisher=publisher)
        while (frame := decode_stats_frame(recv_topic(sub, DEFAULT_STATS_TOPIC)[1])).ts == 1.0:
            pass  # a probe of subscribe's, still on its way
    assert (frame.engine_id, frame.config.policy, frame.config.capacity_blocks) == (
        "idle-engine",
        "arc",
        64,
    )


@pytest.mark.parametrize("start", [0, 3, 9])
def test_replay_sends_buffered_batches_from_the_requested_sequence(
    ctx: zmq.Context, publisher: EventPublisher, start: int
) -> None:
    sent = publish_kv(publisher, 10)

    *batches, end = replay(ctx, publisher, start.to_bytes(8, "big"))

    assert [seq_of(seq) for _, _, seq, _ in batches] == list(range(start, 10))
    assert all(delimiter == b"" and topic == KV_TOPIC for delimiter, topic, _, _ in batches)
    for (_, _, _, payload), events in zip(batches, sent[start:], strict=True):
        assert_batch_matches(payload, events)
    assert end == [b"", b"", END_OF_REPLAY_SEQ, b""]
    assert publisher.replay_requests == 1


def test_replay_keeps_only_the_last_buffer_steps_batches(ctx: zmq.Context) -> None:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=4) as pub:
        publish_kv(pub, 10)
        *batches, _ = replay(ctx, pub, (0).to_bytes(8, "big"))
    assert [seq_of(seq) for _, _, seq, _ in batches] == [6, 7, 8, 9]


def payload_size(events: list[OffloadingEvent]) -> int:
    """Bytes of the batch the publisher sends for these events (its time stamp is fixed-size)."""
    return len(encode_batch(KVEventBatch(ts=0.0, events=to_kv_events(events))))


@pytest.mark.parametrize(("budget_batches", "kept"), [(3, [7, 8, 9]), (0, [9])])
def test_replay_keeps_only_the_newest_batches_that_fit_buffer_bytes(
    ctx: zmq.Context, budget_batches: int, kept: list[int]
) -> None:
    """Ten batches of equal size; a budget of three keeps three, one smaller than any keeps one."""
    batch = publish_kv_batches(10)
    size = payload_size(batch[0])
    assert {payload_size(events) for events in batch} == {size}
    budget = max(1, budget_batches * size)
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_bytes=budget) as pub:
        publish_kv(pub, 10)
        *batches, _ = replay(ctx, pub, (0).to_bytes(8, "big"))
    assert [seq_of(seq) for _, _, seq, _ in batches] == kept


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("buffer_steps", 0),
        ("buffer_bytes", 0),
        ("max_queue_size", -1),
        ("flush_interval", 0),
        ("flush_interval", 11),
        ("heartbeat_s", 0),
        ("heartbeat_s", math.inf),
        ("peer_timeout_s", 0.05),
        ("peer_timeout_s", math.nan),
    ],
)
def test_settings_out_of_range_are_refused_by_name(setting: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{setting} must be"):
        EventPublisher("tcp://127.0.0.1:*", **{setting: value})


@pytest.mark.parametrize("start", [10, 2**63])
def test_replay_beyond_the_newest_sends_only_the_end_marker(
    ctx: zmq.Context, publisher: EventPublisher, start: int
) -> None:
    publish_kv(publisher, 10)
    req = ctx.socket(zmq.REQ)  # a single answer suits REQ, vLLM's documented client
    req.connect(publisher.replay_endpoint)
    req.send(start.to_bytes(8, "big"))
    assert recv(req) == [b"", END_OF_REPLAY_SEQ, b""]
    req.close(linger=0)


@pytest.mark.parametrize("request_bytes", [b"", b"abc", b"123456789"])
def test_malformed_replay_request_gets_the_end_marker_and_is_counted(
    ctx: zmq.Context, publisher: EventPublisher, request_bytes: bytes
) -> None:
    assert replay(ctx, publisher, request_bytes) == [[b"", b"", END_OF_REPLAY_SEQ, b""]]
    assert (publisher.replay_requests, publisher.malformed_replay_requests) == (1, 1)

    publish_kv(publisher, 1)  # the thread survived and still serves
    assert len(replay(ctx, publisher, (0).to_bytes(8, "big"))) == 2


def test_replay_requests_are_exported_by_outcome(
    ctx: zmq.Context, publisher: EventPublisher
) -> None:
    publish_kv(publisher, 2)
    replay(ctx, publisher, (0).to_bytes(8, "big"))
    replay(ctx, publisher, (1).to_bytes(8, "big"))
    replay(ctx, publisher, b"abc")
    exported = {
        sample.labels["outcome"]: sample.value
        for sample in publisher_snapshot(publisher).counters
        if sample.name == "kvscope_publisher_replay_requests_total"
    }
    assert exported == {"ok": 2, "malformed": 1, "refused": 0}
    assert publisher.replay_requests == 3


def test_publishes_during_another_flush_queue_up_then_drop_the_oldest_counted() -> None:
    """While another thread holds the socket (its flush), callers never wait.

    The publisher's lock is held here to stand for the background thread in
    the middle of a flush: publishes then only queue, and past the bound the
    oldest is dropped and counted. The first publish after the lock is free
    flushes what is left, as one batch. The real thread's interval is 10 s, so
    it never takes the lock in between, even on a loaded machine.
    """
    with EventPublisher("tcp://127.0.0.1:*", max_queue_size=4, flush_interval=10) as pub:
        with pub._sending:
            for i in range(10):
                pub.publish_events([stored(i)])
            assert (pub.dropped, pub.batches_published) == (6, 0)
        pub.publish_events([stored(10)])  # the queue is still full: 6 is dropped
        assert (pub.dropped, pub.batches_published, pub.events_published) == (7, 1, 4)


def test_a_subscriber_that_stops_reading_causes_counted_drops_not_a_blocked_caller(
    ctx: zmq.Context,
) -> None:
    """ZMQ queues are tiny here, the subscriber reads nothing after connecting.

    Every publish flushes itself (a queue bound of 2 flushes at 1) as a batch
    of its own: the thread's interval is 10 s, so it never flushes from under
    the caller, which would merge publishes. Each batch is ~33 KB, so the
    kernel's socket buffers fill within a few hundred frames; then every send
    is refused at once and counted. Refused batches keep their sequence
    numbers and stay replayable.
    """
    calls = 600
    with EventPublisher(
        "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", max_queue_size=2, hwm=4, flush_interval=10
    ) as pub:
        sub, _ = subscribe(ctx, pub)
        for i in range(calls):
            hashes = [i.to_bytes(4, "big") + k.to_bytes(28, "big") for k in range(1000)]
            pub.publish_events([stored(*hashes)])
        assert pub.dropped > 0
        assert pub.batches_published + pub.dropped == calls
        answers = replay(ctx, pub, (calls - 1).to_bytes(8, "big"))
        assert [seq_of(a[2]) for a in answers] == [calls - 1, -1]
    sub.close(linger=0)


def test_close_is_idempotent_and_refuses_later_publishes() -> None:
    pub = EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    pub.publish_events([stored(1)])
    pub.close()
    pub.close()
    assert pub.batches_published == 1
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish_events([stored(2)])


def test_close_from_several_threads_returns_in_each_once_the_endpoints_are_free() -> None:
    """A second close() returned at once while the first was still stopping the thread, its
    endpoints still bound, and the two could close the wake pipe's descriptors twice.

    The ports are held for the whole test (tests/support/ports.py): freed by close(), a
    wildcard port could be taken by any other process before a probe bound it. A probe
    shares a held port as ZMQ does (SO_REUSEADDR), which a port still listened on refuses.
    """
    with held_tcp_ports(2) as base:
        pub = EventPublisher(f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}")
        pub.publish_events([stored(n) for n in range(50_000)])  # the last flush takes a while
        start, probing = threading.Barrier(4), threading.Lock()
        free: list[bool] = []
        errors: list[BaseException] = []

        def close_then_probe() -> None:
            start.wait()
            try:
                pub.close()
                with probing:  # one thread's probe at a time: each binds the ports, then lets go
                    for port in (base, base + 1):
                        with socket.socket() as probe:
                            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                            probe.bind(("127.0.0.1", port))
                    free.append(True)
            except BaseException as exc:  # reported below, whichever thread raised it
                errors.append(exc)

        threads = [threading.Thread(target=close_then_probe) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == [] and free == [True] * 4


def test_topics_must_differ() -> None:
    with pytest.raises(ValueError, match="must differ"):
        EventPublisher("tcp://127.0.0.1:*", kv_topic=b"t", stats_topic=b"t")


def test_stats_frame_ignores_unknown_fields() -> None:
    wire = msgspec.msgpack.decode(encode_stats_frame(a_frame()))
    wire["added_in_a_later_minor_release"] = {"anything": [1, 2]}
    assert decode_stats_frame(msgspec.msgpack.encode(wire)) == a_frame()


def test_stats_frame_of_another_major_version_is_refused_clearly() -> None:
    wire = msgspec.msgpack.decode(encode_stats_frame(a_frame()))
    wire["version"] = 2
    with pytest.raises(UnsupportedStatsVersion, match="version 2"):
        decode_stats_frame(msgspec.msgpack.encode(wire))


def test_histogram_counts_must_be_cumulative_up_to_inf() -> None:
    with pytest.raises(ValueError, match="must not decrease"):
        HistogramSnapshot(name="h", buckets=[1.0, math.inf], counts=[2, 1], sum=1.0, count=1)
    with pytest.raises(ValueError, match=r"\+inf"):
        HistogramSnapshot(name="h", buckets=[1.0, 2.0], counts=[1, 1], sum=1.0, count=1)


def test_a_worker_without_a_publisher_drains_its_events_and_counts_nothing_sent() -> None:
    manager = CPUOffloadingManager(16, 4, "lru", enable_events=True)
    telemetry = WorkerTelemetry(manager, engine_id="e0")
    assert isinstance(telemetry.publisher, NullPublisher)
    manager.prepare_store([1, 2])
    manager.complete_store([1, 2])
    telemetry.publish_events()
    telemetry.publish_stats()
    assert manager.take_events() == []
    published = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for sample in telemetry.snapshot().counters
        if sample.name.startswith("kvscope_publisher_")
    }
    assert published and set(published.values()) == {0.0}


SILENT_PEER_TIMEOUT_S = 2.4
"""A peer timeout for the silent-peer tests: a PING every 0.4 s, long beside a thread's
scheduling delays."""


@pytest.mark.parametrize("socket_name", ["endpoint", "replay_endpoint"])
def test_a_peer_that_answers_no_ping_is_pinged_six_times_a_timeout_then_cut(
    socket_name: str,
) -> None:
    """Both sockets ping by the rule the sidecar's sockets follow (PINGS_PER_TIMEOUT): the
    publisher pinged every third of the timeout while the sidecar pinged every sixth.

    The timeout runs from the first unanswered PING and each PING is timed from
    the one before, so PINGs the I/O thread sends late may fall past the cut on
    a loaded machine: more than half must come (the old rule gave half).
    """
    with EventPublisher(
        "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", peer_timeout_s=SILENT_PEER_TIMEOUT_S
    ) as pub:
        host, port = getattr(pub, socket_name).removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as peer:
            handshake(peer, b"SUB" if socket_name == "endpoint" else b"DEALER")
            pings = pings_until_closed(peer)
    assert PINGS_PER_TIMEOUT // 2 < pings <= PINGS_PER_TIMEOUT
