"""A peer that sends faster than the sidecar reads meets a bound in bytes, and its losses count.

ZMQ's receive queues count messages (1,000 per peer by default), each up to
``max_message_bytes``: a peer flooding the listen socket grew the sidecar by
500 MiB, unseen. Each receiving socket now queues ``receive_buffer_bytes``
worth of its largest messages per peer; past that ZMQ stops reading the
connection, the kernel's socket buffers fill, and the peer's PUB socket must
drop. Here the ingest thread is held (the test holds the state's lock) while
a real peer on loopback floods it: a send that ZMQ cannot take within
``FULL_AFTER_MS`` means the whole way to the sidecar is full. What got that
far is bounded by the receive buffer and the kernel's buffers; the frame the
peer could not send is a gap the sidecar counts as missed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from app.ingest import Ingestor
from app.settings import KiB, MiB, SidecarSettings
from app.state.publisher import PublisherState
from app.state.sidecar import SidecarState
from offload.wire.framing import DEFAULT_STATS_TOPIC, encode_seq
from tests.support.polling import wait_until
from tests.support.zmq_peers import stats_probe

pytestmark = pytest.mark.timeout(120)

TOPIC = "e0"
"""The peer's KV topic and engine id: in listen mode its stream is ``e0@0`` whatever it sends."""

FRAME_BYTES = 512 * KiB
FLOOD = 300
"""Frames the peer tries to send (150 MiB): far more than the way to the sidecar may hold."""

FULL_AFTER_MS = 5000
"""A send ZMQ has not taken by then finds the peer's queue, the kernel's and the sidecar's full."""

BOUNDS = {"max_message_bytes": MiB, "receive_buffer_bytes": 2 * MiB}


def batch(seq: int) -> bytes:
    """A valid KV batch of about ``FRAME_BYTES``, cheap to apply: one block, whose token ids
    (never decoded) take the room."""
    event = {
        "type": "BlockStored",
        "block_hashes": [seq],
        "parent_block_hash": None,
        "token_ids": [0] * FRAME_BYTES,
        "block_size": 16,
    }
    return msgspec.msgpack.encode([1.0, [event], 0])


def kernel_buffer_bytes() -> int:
    """The most a loopback TCP connection's two socket buffers may hold (Linux's caps)."""
    ipv4 = Path("/proc/sys/net/ipv4")
    return sum(int((ipv4 / name).read_text().split()[2]) for name in ("tcp_rmem", "tcp_wmem"))


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def flooding_peer(ctx: zmq.Context) -> zmq.Socket:
    """A PUB socket that queues one message and then waits (never drops unseen) for room."""
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 1)
    pub.setsockopt(zmq.XPUB_NODROP, 1)
    pub.setsockopt(zmq.SNDTIMEO, FULL_AFTER_MS)
    return pub


def sidecar(ctx: zmq.Context, mode: str) -> tuple[Ingestor, zmq.Socket, str]:
    """A started ingestor in ``mode``, the peer connected to it, and the peer's publisher name."""
    peer = flooding_peer(ctx)
    if mode == "connect":
        peer.bind("tcp://127.0.0.1:*")
        endpoint = peer.getsockopt_string(zmq.LAST_ENDPOINT)
        settings = SidecarSettings(connect=[endpoint], kv_topic=TOPIC, **BOUNDS)
        name = endpoint
    else:
        settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], kv_topic=TOPIC, **BOUNDS)
        name = f"{TOPIC}@0"
    ingestor = Ingestor(SidecarState.from_settings(settings))
    ingestor.start()
    if mode == "listen":
        assert ingestor.state.listener is not None
        peer.connect(ingestor.state.listener.bound[0])
    return ingestor, peer, name


def heard(ingestor: Ingestor, peer: zmq.Socket, name: str) -> PublisherState:
    """Probe with stats frames until the sidecar has the peer (ZMQ's slow joiner)."""

    def arrived() -> bool:
        peer.send_multipart([DEFAULT_STATS_TOPIC, encode_seq(0), stats_probe(TOPIC, 0)])
        state = ingestor.state.publishers.get(name)
        return state is not None and state.stats_frames > 0

    wait_until(arrived, "the sidecar hears the peer")
    return ingestor.state.publishers[name]


def send(peer: zmq.Socket, seq: int) -> bool:
    """Send KV batch ``seq``; False if ZMQ could not take it (the peer drops it)."""
    try:
        peer.send_multipart([TOPIC.encode(), encode_seq(seq), batch(seq)])
    except zmq.Again:
        return False
    return True


@pytest.mark.parametrize("mode", ["connect", "listen"])
def test_a_flood_waits_beyond_the_receive_buffer_and_what_it_loses_is_counted(
    ctx: zmq.Context, mode: str
) -> None:
    ingestor, peer, name = sidecar(ctx, mode)
    try:
        state = heard(ingestor, peer, name)
        assert send(peer, 0)
        wait_until(lambda: state.last_seq == 0, "batch 0 applied")
        with ingestor.state.lock:  # the ingest thread stops at the next batch it applies
            taken = next((seq for seq in range(1, FLOOD) if not send(peer, seq)), FLOOD) - 1
        lost = taken + 1
        reach = BOUNDS["receive_buffer_bytes"] + kernel_buffer_bytes() + 4 * MiB
        assert taken * FRAME_BYTES <= reach, f"the sidecar's way took {taken} frames"
        peer.setsockopt(zmq.SNDTIMEO, -1)
        assert send(peer, lost + 1)
        wait_until(lambda: state.last_seq == lost + 1, "the batch after the lost one applied")
        assert (state.gaps, state.missed, state.batches_applied) == (1, 1, taken + 2)
    finally:
        ingestor.close()
