"""The worker's publisher bounds what ZMQ holds in bytes (issue 15, item 4).

Each replay request used to copy the whole replay buffer into ZMQ's queue for
its peer (ten peers that never read, asking once: 106 MB -> 743 MB), and a
subscriber that stopped reading grew the worker by ~140 MB in 20 s with
nothing counted, the high-water marks counting messages, not bytes. Peers
here are real ZMQ sockets on loopback that never read; memory is read from
the process (its resident set) and from the publisher's own count.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import zmq
import zmq.utils.monitor

from offload.base import OffloadingEvent
from offload.wire.framing import DEFAULT_KV_TOPIC, replay_request
from offload.wire.publisher import EventPublisher
from offload.worker_telemetry import publisher_snapshot
from tests.support.polling import wait_until

pytestmark = pytest.mark.timeout(120)

MiB = 2**20
BATCH_HASHES = 100_000  # about 0.5 MB of msgpack per batch


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def fill(publisher: EventPublisher, batches: int) -> None:
    for number in range(batches):
        hashes = list(range(number * BATCH_HASHES, (number + 1) * BATCH_HASHES))
        publisher.publish_events([OffloadingEvent(hashes, 16, "CPU", False)])
        wait_until(lambda n=number: publisher.batches_published + publisher.dropped > n, "sent")


def deaf_peer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A DEALER that asks for a replay and never reads the answer."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.RCVBUF, 4096)
    dealer.connect(endpoint)
    return dealer


def test_replay_answers_share_the_buffer_instead_of_copying_it(ctx: zmq.Context) -> None:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        fill(publisher, 32)  # ~16 MB buffered
        before = rss()
        peers = [deaf_peer(ctx, publisher.replay_endpoint) for _ in range(10)]
        for peer in peers:
            peer.send_multipart(replay_request(0))
        wait_until(lambda: publisher.replays_served == 10, "every request answered")
        grown = rss() - before
        assert grown < 40 * MiB, f"resident set grew by {grown / MiB:.0f} MiB"  # 160+ copying
        assert publisher.held_bytes <= publisher._replay_budget_bytes


def test_a_replay_request_larger_than_any_request_is_never_taken_in(ctx: zmq.Context) -> None:
    """A peer's 200 MiB "request" was reassembled and copied into the worker (three of them:
    +400 MiB) before it was found malformed; now ZMQ drops the peer at the first bytes past
    the largest frame a request has. The peer sees its connection closed."""
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        hostile = ctx.socket(zmq.DEALER)
        monitor = hostile.get_monitor_socket()
        hostile.connect(publisher.replay_endpoint)
        hostile.send_multipart([b"", b"x" * MiB])
        wait_until(lambda: disconnected(monitor), "the publisher drops the peer")
        honest = deaf_peer(ctx, publisher.replay_endpoint)
        honest.send_multipart(replay_request(0))
        wait_until(lambda: publisher.replays_served == 1, "an honest request is answered")
        assert (publisher.replay_requests, publisher.malformed_replay_requests) == (1, 0)
        hostile.disable_monitor()
        monitor.close(0)
        hostile.close(0)


def disconnected(monitor: zmq.Socket) -> bool:
    """Whether the monitored socket's next event, if one comes soon, is its peer hanging up."""
    return (
        monitor.poll(100) > 0
        and zmq.utils.monitor.recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    )


@pytest.mark.parametrize("topic", [b"", b"t" * 1000])
def test_a_subscription_longer_than_any_topic_is_never_taken_in(
    ctx: zmq.Context, topic: bytes
) -> None:
    """Anyone who could reach the PUB port made the worker take in a "subscription" of any
    size (50 MiB of memory for a 50 MiB frame); ZMQ now drops such a peer at the first
    bytes past the longest topic, and a subscriber to the longest topic is served."""
    with EventPublisher("tcp://127.0.0.1:*", kv_topic=topic) as publisher:
        hostile = ctx.socket(zmq.XSUB)
        monitor = hostile.get_monitor_socket()
        hostile.connect(publisher.endpoint)
        # Not a subscription (flag 2), which the hostile XSUB would keep in a trie a
        # million nodes deep, and overflow its own reaper thread's stack freeing it.
        hostile.send(b"\x02" + b"x" * MiB)
        wait_until(lambda: disconnected(monitor), "the publisher drops the peer")
        honest = ctx.socket(zmq.SUB)
        honest.setsockopt(zmq.SUBSCRIBE, topic)
        honest.connect(publisher.endpoint)

        def heard() -> bool:
            publisher.publish_events([OffloadingEvent([1], 16, "CPU", False)])
            return honest.poll(100) > 0 and honest.recv_multipart()[0] == topic

        wait_until(heard, "a subscriber to the longest topic hears its batches")
        hostile.disable_monitor()
        monitor.close(0)
        hostile.close(0)
        honest.close(0)


def test_a_peer_that_asks_again_without_reading_is_refused_and_counted(ctx: zmq.Context) -> None:
    with EventPublisher(
        "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", replay_budget_bytes=64 * MiB
    ) as publisher:
        fill(publisher, 16)
        peer = deaf_peer(ctx, publisher.replay_endpoint)
        for _ in range(20):
            peer.send_multipart(replay_request(0))
        wait_until(lambda: publisher.replay_requests == 20, "every request received")
        assert publisher.replays_served == 1
        assert publisher.refused_replay_requests == 19


def test_answers_are_cut_short_at_the_budget(ctx: zmq.Context) -> None:
    with EventPublisher(
        "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", replay_budget_bytes=4 * MiB
    ) as publisher:
        fill(publisher, 16)  # ~8 MB: twice the budget
        published = publisher.held_bytes  # what the PUB socket may still hold (queue_bytes)
        peers = [deaf_peer(ctx, publisher.replay_endpoint) for _ in range(3)]
        for peer in peers:
            peer.send_multipart(replay_request(0))
        wait_until(lambda: publisher.replay_requests == 3, "every request received")
        assert publisher.truncated_replays >= 1  # the answers share what they hold
        answers = publisher.held_bytes - published
        assert answers <= 4 * MiB + MiB  # the budget, and one batch at most


def test_an_answer_is_charged_each_message_it_holds_not_only_its_payloads(
    ctx: zmq.Context,
) -> None:
    """A message ZMQ holds costs about 1.7 KB beside its payload: charged for payloads alone,
    70 peers that never read held 10,000 small messages each (+968 MiB, nothing refused)."""
    with EventPublisher(
        "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", replay_budget_bytes=256 << 10
    ) as publisher:
        for number in range(200):  # 200 batches of about 40 bytes: 8 KB of payloads
            publisher.publish_events([OffloadingEvent([number], 16, "CPU", False)])
            wait_until(lambda n=number: publisher.batches_published > n, "sent")
        peer = deaf_peer(ctx, publisher.replay_endpoint)
        peer.send_multipart(replay_request(0))
        wait_until(lambda: publisher.replays_served == 1, "the request answered")
        # Counted as the answer is cut, after the request was counted as served.
        wait_until(lambda: publisher.truncated_replays > 0, "200 messages' overheads cut it")
        assert publisher.truncated_replays == 1
        exported = [
            sample.value
            for sample in publisher_snapshot(publisher).counters
            if sample.name == "kvscope_publisher_truncated_replays_total"
        ]
        assert exported == [1], "the worker's metrics carry it"


def test_a_subscriber_that_stops_reading_holds_queue_bytes_at_most_counted(
    ctx: zmq.Context,
) -> None:
    with EventPublisher(
        "tcp://127.0.0.1:*", queue_bytes=4 * MiB, buffer_bytes=2 * MiB
    ) as publisher:
        deaf = deaf_subscriber(ctx, publisher)
        before = rss()
        fill(publisher, 90)  # ~45 MB published at a peer that reads nothing
        grown = rss() - before
        assert publisher.dropped > 0
        assert publisher.held_bytes <= 4 * MiB + MiB
        assert grown < 24 * MiB, f"resident set grew by {grown / MiB:.0f} MiB"  # 45+ queued
        deaf.close(linger=0)


def deaf_subscriber(ctx: zmq.Context, publisher: EventPublisher) -> zmq.Socket:
    """A subscriber of everything that reads nothing, its queues as small as ZMQ allows,
    connected once this returns (keep it: collected, it would close)."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    wait_until(lambda: _subscribed(publisher), "the subscriber is connected")
    return sub


def _subscribed(publisher: EventPublisher) -> bool:
    """A probe batch the PUB socket cannot drop unheard: sent only once someone subscribes."""
    publisher.publish_events([OffloadingEvent([-1], 16, "CPU", False)])
    return publisher._pub_held.bytes > 0 or publisher.dropped > 0


def test_a_subscriber_that_stops_reading_is_charged_each_message_not_only_its_payload(
    ctx: zmq.Context,
) -> None:
    """A message the PUB socket holds costs about 2.3 KB beside its payload: charged for
    payloads alone, 100,000 small batches held for a subscriber that never read grew the
    worker by 212 MiB within a 64 MiB ``queue_bytes``, nothing dropped."""
    queue_bytes = 4 * MiB
    # max_queue_size=2: every publish flushes at once, one batch of ~100 bytes each.
    with EventPublisher(
        "tcp://127.0.0.1:*", queue_bytes=queue_bytes, max_queue_size=2, flush_interval=10
    ) as publisher:
        deaf = deaf_subscriber(ctx, publisher)
        before = rss()
        for number in range(30_000):  # 3 MB of payloads, 30,000 messages
            publisher.publish_events([OffloadingEvent([number], 16, "CPU", False)])
        grown = rss() - before
        assert publisher.dropped > 0
        assert publisher.held_bytes <= queue_bytes
        assert grown < 24 * MiB, f"resident set grew by {grown / MiB:.0f} MiB"  # ~70 uncharged
        deaf.close(linger=0)


def test_a_subscriber_that_stops_reading_is_cut_and_the_others_frames_flow_again(
    ctx: zmq.Context,
) -> None:
    """With every send refused while one pipe is full (``XPUB_NODROP``), a subscriber that
    stopped reading starved the one that reads for as long as it stayed connected: not one
    frame more reached it. Its unanswered PINGs now get it cut after ``peer_timeout_s``."""
    with EventPublisher(
        "tcp://127.0.0.1:*", queue_bytes=4 * MiB, buffer_bytes=2 * MiB, peer_timeout_s=1
    ) as publisher:
        reader = ctx.socket(zmq.SUB)
        reader.setsockopt(zmq.SUBSCRIBE, b"")
        reader.connect(publisher.endpoint)
        deaf = deaf_subscriber(ctx, publisher)
        received: list[int] = []

        def read() -> None:
            while reader.poll(0):
                topic, seq, _ = reader.recv_multipart()
                if topic == DEFAULT_KV_TOPIC:
                    received.append(int.from_bytes(seq, "big"))

        def publish_one() -> None:  # ~0.5 MB: past the 4 MiB bound in a few
            sent = publisher.batches_published + publisher.dropped
            publisher.publish_events([OffloadingEvent(list(range(BATCH_HASHES)), 16, "CPU", False)])
            wait_until(lambda: publisher.batches_published + publisher.dropped > sent, "sent")
            read()

        while publisher.dropped == 0:
            publish_one()
        stalled_at = publisher.batches_published + publisher.dropped

        def flowing() -> bool:
            publish_one()
            return any(seq >= stalled_at for seq in received)

        wait_until(flowing, "a batch sent after the stall reaches the reader")
        deaf.close(linger=0)
        reader.close(linger=0)
