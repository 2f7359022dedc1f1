"""Listen mode over real ZMQ sockets: many publishers connect to one bound socket.

The sidecar is built from its settings as `kvscope serve --listen` builds it;
publishers are the test-controlled peer of tests/support/zmq_peers.py, its PUB
socket connected to the sidecar's listen socket, and for connect mode beside
listen mode kvscope's own EventPublisher. Waits poll a condition for up to 15 s
(tests/support/polling.py); nothing asserts on time.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from ipaddress import ip_network
from pathlib import Path

import msgspec
import pytest
import zmq
from pydantic import ValidationError
from zmq.utils.monitor import parse_monitor_message

from app.ingest import Ingestor, ListenError, listen_gate
from app.ingest.listen_gate import (
    ADMITTED,
    HOST_REFUSED,
    NOT_ALLOWED,
    REFUSED,
    SETTLED_S,
    YOUNG_PER_PLACE,
    ListenGate,
    address_host,
    allowed,
    descriptor_host,
    ipc_peer,
)
from app.settings import SidecarSettings
from app.state.listener import ListenerState
from app.state.locations import LOCATIONS_PER_HOST, MAX_GROUPS, MAX_LOCATIONS
from app.state.publisher import PublisherState
from app.state.sidecar import SidecarState
from offload.base import OffloadingEvent
from offload.wire.framing import DEFAULT_STATS_TOPIC, encode_seq
from offload.wire.kv_events import BlockStored, KVEventBatch, encode_batch
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import StatsFrame, WorkerConfig, encode_stats_frame
from tests.support.ipv6 import needs_ipv6_loopback
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, free_tcp_endpoint, kv_payload
from tests.support.zmtp_peer import GREETING, handshake, ready_command

pytestmark = pytest.mark.timeout(120)

LISTEN = "tcp://127.0.0.1:*"


def stored(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, "CPU", False)


def removed(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, "CPU", True)


def stats_payload(engine_id: str, rank: int) -> bytes:
    config = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)
    return encode_stats_frame(StatsFrame(ts=1.0, engine_id=engine_id, rank=rank, config=config))


def listening(listen: str = LISTEN, **settings: object) -> Ingestor:
    """A started ingestor built from settings, listening (by default on a free loopback port)."""
    state = SidecarState.from_settings(SidecarSettings(listen=[listen], **settings))
    ingestor = Ingestor(state)
    ingestor.start()
    return ingestor


def bound(ingestor: Ingestor) -> str:
    assert ingestor.state.listener is not None
    return ingestor.state.listener.bound[0]


def listener_of(ingestor: Ingestor) -> ListenerState:
    listener = ingestor.state.listener
    assert listener is not None
    return listener


def port_of(ingestor: Ingestor) -> str:
    """The listen socket's bound port (for an endpoint of another address or source)."""
    return bound(ingestor).rsplit(":", 1)[1]


def heard(ingestor: Ingestor, raw: RawPublisher, engine_id: str, rank: int) -> PublisherState:
    """Probe with stats frames until the sidecar has the stream (engine_id, rank).

    A stats frame names the stream of its engine id and rank, so a peer whose
    topic is its engine id is one publisher whatever it sends.
    """
    name = f"{engine_id}@{rank}"

    def arrived() -> bool:
        raw.pub.send_multipart([DEFAULT_STATS_TOPIC, encode_seq(0), stats_payload(engine_id, rank)])
        state = ingestor.state.publishers.get(name)
        return state is not None and state.stats_frames > 0

    wait_until(arrived, f"the sidecar hears {name} on its listen socket")
    return ingestor.state.publishers[name]


def two_heard(ingestor: Ingestor, peers: list[RawPublisher]) -> tuple[RawPublisher, RawPublisher]:
    """Two peers of the listen socket, "a" and "b", connected and heard."""
    first, second = RawPublisher(bound(ingestor), b"a"), RawPublisher(bound(ingestor), b"b")
    peers += [first, second]
    heard(ingestor, first, "a", 0)
    heard(ingestor, second, "b", 0)
    return first, second


def blocks_of(ingestor: Ingestor, publisher: str) -> set[int]:
    """The hashes (of 0..199) that ``publisher`` holds, on any medium."""
    with ingestor.state.lock:
        entries = [ingestor.state.index.get(h) for h in range(200)]
    return {h for h, e in enumerate(entries) if e is not None and publisher in e.publishers}


def test_two_publishers_on_one_socket_keep_their_sequences_apart(
    peers: list[RawPublisher],
) -> None:
    ingestor = listening()
    try:
        a = RawPublisher(connect=bound(ingestor), topic=b"engine-a")
        b = RawPublisher(connect=bound(ingestor), topic=b"engine-b")
        peers += [a, b]
        heard(ingestor, a, "engine-a", 0)
        heard(ingestor, b, "engine-b", 0)
        a.send(0, kv_payload(stored(1, 2), rank=0))
        b.send(0, kv_payload(stored(50), rank=0))
        a.send(1, kv_payload(stored(3), rank=0))
        b.send(1, kv_payload(stored(51, 52), rank=0))
        a.send(2, kv_payload(removed(1), rank=0))
        b.send(2, kv_payload(removed(52), rank=0))
        wait_until(lambda: blocks_of(ingestor, "engine-a@0") == {2, 3}, "engine-a's blocks")
        wait_until(lambda: blocks_of(ingestor, "engine-b@0") == {50, 51}, "engine-b's blocks")
        for name in ("engine-a@0", "engine-b@0"):
            state = ingestor.state.publishers[name]
            assert state.source.mode == "listen"
            assert (state.last_seq, state.batches_applied) == (2, 3), name
            assert (state.gaps, state.missed, state.restarts, state.malformed) == (0, 0, 0, 0)
        listener = ingestor.state.listener
        assert listener is not None and (listener.malformed, listener.refused) == (0, 0)
    finally:
        ingestor.close()


def test_each_rank_is_its_own_stream_and_a_gap_is_replayed_from_its_own_socket(
    peers: list[RawPublisher],
) -> None:
    """vLLM's data-parallel ranks share a topic (here vLLM's default, empty) and differ in rank."""
    # The publishers' replay sockets first, as the sidecar is told of them; their PUB sockets
    # connect once the sidecar has bound its listen socket, on a port of its own choosing.
    rank0, rank1 = RawPublisher(bind=False), RawPublisher(bind=False)
    peers += [rank0, rank1]
    ingestor = listening(
        listen_replay=[
            f"@0={rank0.endpoints.replay_endpoint}",
            f"@1={rank1.endpoints.replay_endpoint}",
        ],
    )
    try:
        for rank in (rank0, rank1):
            rank.pub.connect(bound(ingestor))
        heard(ingestor, rank0, "", 0)
        heard(ingestor, rank1, "", 1)
        rank0.send(0, kv_payload(stored(1), rank=0))
        rank1.send(0, kv_payload(stored(100), rank=1))
        rank0.send(1, kv_payload(stored(2), rank=0), lose=True)
        rank1.send(1, kv_payload(stored(101), rank=1))
        rank1.send(2, kv_payload(stored(102), rank=1), lose=True)
        rank0.send(2, kv_payload(stored(3), rank=0))
        rank1.send(3, kv_payload(stored(103), rank=1))
        wait_until(lambda: blocks_of(ingestor, "@0") == {1, 2, 3}, "rank 0's gap filled")
        wait_until(lambda: blocks_of(ingestor, "@1") == {100, 101, 102, 103}, "rank 1's filled")
        zero, one = ingestor.state.publishers["@0"], ingestor.state.publishers["@1"]
        assert (zero.gaps, zero.missed, zero.replayed, zero.last_seq) == (1, 0, 1, 2)
        assert (one.gaps, one.missed, one.replayed, one.last_seq) == (1, 0, 1, 3)
        assert (rank0.replay_requests, rank1.replay_requests) == (1, 1)
    finally:
        ingestor.close()


def test_a_restarted_publisher_resets_its_own_stream_only(peers: list[RawPublisher]) -> None:
    ingestor = listening()
    try:
        first = RawPublisher(connect=bound(ingestor), topic=b"first")
        other = RawPublisher(connect=bound(ingestor), topic=b"other")
        peers += [first, other]
        heard(ingestor, first, "first", 0)
        heard(ingestor, other, "other", 0)
        first.send(0, kv_payload(stored(1, 2), rank=0))
        first.send(1, kv_payload(stored(3), rank=0))
        other.send(0, kv_payload(stored(50), rank=0))
        wait_until(lambda: blocks_of(ingestor, "first@0") == {1, 2, 3}, "first applied")
        wait_until(lambda: blocks_of(ingestor, "other@0") == {50}, "other applied")
        first.send(0, kv_payload(stored(4), rank=0))  # the sequence starts over
        wait_until(lambda: blocks_of(ingestor, "first@0") == {4}, "first's view rebuilt")
        assert blocks_of(ingestor, "other@0") == {50}
        assert ingestor.state.publishers["first@0"].restarts == 1
        assert ingestor.state.publishers["other@0"].restarts == 0
    finally:
        ingestor.close()


def test_malformed_frames_and_streams_past_the_cap_are_counted_never_applied(
    peers: list[RawPublisher],
) -> None:
    ingestor = listening(listen_max_publishers=1)
    listener = listener_of(ingestor)
    try:
        raw = RawPublisher(connect=bound(ingestor), topic=b"x")
        peers.append(raw)
        state = heard(ingestor, raw, "x", 0)
        garbage = [
            [b"only one frame"],
            [b"x", b"short", kv_payload(stored(9), rank=0)],  # a sequence frame of 5 bytes
            [b"x", encode_seq(0), b"\xc1 not msgpack"],
            [DEFAULT_STATS_TOPIC, encode_seq(0), b"\xc1 not a stats frame"],
            [b"t" * 200, encode_seq(0), kv_payload(stored(9), rank=0)],  # too long to name
        ]
        for frames in garbage:
            raw.pub.send_multipart(frames)
        wait_until(lambda: listener.malformed == len(garbage), "garbage counted on the listener")
        raw.pub.send_multipart([b"y", encode_seq(0), kv_payload(stored(8), rank=0)])
        wait_until(lambda: listener.refused == 1, "a second stream is past the cap")
        good = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
                "token_ids": [], "block_size": 16, "lora_id": None, "medium": "CPU"}  # fmt: skip
        one_bad_event = msgspec.msgpack.encode([1.0, [good, {"type": "NoSuchEvent"}], 0])
        raw.pub.send_multipart([b"x", encode_seq(0), one_bad_event])
        raw.send(1, kv_payload(stored(5), rank=0))
        wait_until(lambda: blocks_of(ingestor, "x@0") == {5, 7}, "later frames still applied")
        assert state.malformed == 1  # the bad event, inside a batch that named its stream
        assert (state.last_seq, state.gaps, state.restarts) == (1, 0, 0)
        assert set(ingestor.state.publishers) == {"x@0"}
        with ingestor.state.lock:
            assert len(ingestor.state.index) == 2  # nothing from the garbage or the refused
    finally:
        ingestor.close()


def test_connect_and_listen_mode_in_one_sidecar(peers: list[RawPublisher]) -> None:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as worker:
        ingestor = listening(connect=[worker.endpoint], replay=[worker.replay_endpoint])
        try:
            raw = RawPublisher(connect=bound(ingestor), topic=b"vllm-gpu")
            peers.append(raw)
            heard(ingestor, raw, "vllm-gpu", 0)
            connected = ingestor.state.publishers[worker.endpoint]

            def worker_heard() -> bool:
                worker.publish_stats(StatsFrame(
                    ts=1.0, engine_id="cpu", rank=0,
                    config=WorkerConfig(policy="lru", capacity_blocks=8, block_size=16),
                ))  # fmt: skip
                return connected.stats_frames > 0

            wait_until(worker_heard, "the sidecar hears the connect-mode worker")
            worker.publish_events([stored(1, 2)])
            raw.send(0, kv_payload(OffloadingEvent([1, 3], 16, "GPU", False), rank=0))
            wait_until(lambda: blocks_of(ingestor, worker.endpoint) == {1, 2}, "CPU tier")
            wait_until(lambda: blocks_of(ingestor, "vllm-gpu@0") == {1, 3}, "GPU cache")
            with ingestor.state.lock:
                assert ingestor.state.index.blocks_by_medium() == {"CPU": 2, "GPU": 2}
            assert connected.source.mode == "connect"
            assert ingestor.state.publishers["vllm-gpu@0"].source.mode == "listen"
        finally:
            ingestor.close()


def test_an_endpoint_that_cannot_be_bound_is_an_error_naming_it() -> None:
    taken = listening()
    try:
        settings = SidecarSettings(listen=[bound(taken)])
        with pytest.raises(ListenError, match=f"cannot bind '{bound(taken)}': Address already"):
            Ingestor(SidecarState.from_settings(settings))
    finally:
        taken.close()


def test_an_endpoint_that_cannot_be_bound_is_named_in_one_short_line() -> None:
    """The endpoint is the operator's, and may be long: it was shown whole. The shape check
    takes a host name of at most 253 characters; to bind one, ZMQ wants an interface's
    name or a host name of this host, and the settings refuse the one it binds nothing
    for, as the sidecar starts, before any socket is bound."""
    endpoint = f"tcp://{'h' * 63}.{'.'.join(['h' * 61] * 3)}:5557"
    with pytest.raises(ValidationError) as refused:
        SidecarSettings(listen=[endpoint])
    [error] = refused.value.errors()
    assert error["loc"] == ("listen",)
    assert error["msg"].startswith("Value error, 'tcp://hhh")
    assert "..." in error["msg"] and "\n" not in error["msg"]  # cut in the middle
    assert error["msg"].index(" cannot be bound on this host: ") < 220


def test_a_declared_stream_waits_unseen_until_it_sends() -> None:
    replay = free_tcp_endpoint()
    ingestor = listening(listen_replay=[f"vllm-gpu@0={replay}"])
    try:
        declared = ingestor.state.publishers["vllm-gpu@0"]
        assert declared.source.replay_endpoint == replay
        assert not declared.seen
    finally:
        ingestor.close()


def test_a_peer_past_max_connections_is_refused_until_a_place_is_free_then_admitted(
    peers: list[RawPublisher],
) -> None:
    """ZMQ lets any number of peers connect, each with a receive queue of its own: the
    sidecar's memory grew with the connections anyone who reached the endpoint opened."""
    ingestor = listening(listen_max_connections=2)
    listener = listener_of(ingestor)
    try:
        first, second = two_heard(ingestor, peers)
        waiting = RawPublisher(bound(ingestor), b"c")
        peers.append(waiting)
        wait_until(lambda: listener.refused_connections >= 1, "the third peer is refused")
        # Not admitted: nothing it sends arrives, while the two others' frames do.
        for seq in range(3):
            waiting.send(seq, kv_payload(stored(100 + seq), rank=0))
        second.send(0, kv_payload(stored(1), rank=0))
        wait_until(lambda: blocks_of(ingestor, "b@0") == {1}, "the second peer's batch")
        assert "c@0" not in ingestor.state.publishers and listener.connections == 2
        peers.remove(first)
        first.close()
        heard(ingestor, waiting, "c", 0)  # it connects again and takes the place left
        assert listener.connections == 2
    finally:
        ingestor.close()


def test_a_burst_of_connections_admits_max_connections_and_the_rest_keep_trying(
    peers: list[RawPublisher],
) -> None:
    """Counting every accepted socket once refused a whole burst (each pending handshake
    saw the others), and a refusal ZMQ takes as final kept them out for good."""
    ingestor = listening(listen_max_connections=2)
    listener = listener_of(ingestor)
    try:
        peers += [RawPublisher(bound(ingestor), b"p%d" % n) for n in range(8)]
        wait_until(
            lambda: listener.connections == 2 and listener.refused_connections >= 6,
            "two admitted, the six others refused",
        )
    finally:
        ingestor.close()


def test_one_host_holds_at_most_its_share_of_places_and_another_host_still_gets_in(
    peers: list[RawPublisher],
) -> None:
    """One host that completed handshake after handshake took every place, and the other
    hosts' engines were refused until it let go. The loopback network routes all of 127/8,
    so a peer connecting from 127.0.0.2 is another host."""
    ingestor = listening(listen_max_connections=8, listen_max_connections_per_host=2)
    listener = listener_of(ingestor)
    port = port_of(ingestor)
    try:
        first, second = two_heard(ingestor, peers)
        # Settled: the gate now knows these two by their descriptors, not their admissions.
        time.sleep(SETTLED_S + 0.5)
        third = RawPublisher(bound(ingestor), b"c")
        peers.append(third)
        wait_until(lambda: listener.refused_host_connections >= 1, "the host's third is refused")
        other = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port}", b"other")
        peers.append(other)
        heard(ingestor, other, "other", 0)
        for seq in range(3):
            third.send(seq, kv_payload(stored(100 + seq), rank=0))
        second.send(0, kv_payload(stored(1), rank=0))
        wait_until(lambda: blocks_of(ingestor, "b@0") == {1}, "the second peer's batch")
        assert "c@0" not in ingestor.state.publishers
        assert (listener.connections, listener.refused_connections) == (3, 0)
        peers.remove(first)
        first.close()
        heard(ingestor, third, "c", 0)  # it connects again and takes its host's place
    finally:
        ingestor.close()


def on_media(first: int, *media: str | None) -> bytes:
    """A batch of rank 0 storing one block (``first``, ``first + 1``, ...) on each medium;
    None names none, as vLLM's GPU events do."""
    events = [
        BlockStored([first + n], None, [], 16, None, medium, None) for n, medium in enumerate(media)
    ]
    return encode_batch(KVEventBatch(ts=1.0, events=list(events), data_parallel_rank=0))


def applied(state: PublisherState, seq: int) -> None:
    wait_until(lambda: state.last_seq == seq, f"batch {seq} of {state.name} applied")


def test_one_hosts_streams_name_at_most_its_share_of_media_and_another_hosts_gpu_gets_in(
    peers: list[RawPublisher],
) -> None:
    """Each stream is a publisher, naming at most 4 media: one peer opening four streams
    named all 16, and every other engine's media, its GPU's included, were refused. A
    host's streams name ``listen_max_media_per_host`` (4) together: past them their events
    are refused, counted by reason, and what they hold stays; another host's engine (a peer
    from 127.0.0.2, another host on the loopback network) stores on the GPU and the CPU."""
    ingestor = listening()
    index = ingestor.state.index
    port = port_of(ingestor)
    try:
        for n in range(4):
            raw = RawPublisher(bound(ingestor), f"h{n}".encode())
            peers.append(raw)
            state = heard(ingestor, raw, f"h{n}", 0)
            assert state.host == "127.0.0.1"
            raw.send(0, on_media(100 * n, *(f"m{4 * n + m}" for m in range(4))))
            applied(state, 0)
        with ingestor.state.lock:
            assert index.blocks_by_medium() == {f"m{m}": 1 for m in range(4)}
            assert index.locations.refused_media == {"publisher": 0, "host": 12, "max_media": 0}
        honest = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port}", b"vllm")
        peers.append(honest)
        state = heard(ingestor, honest, "vllm", 0)
        assert state.host == "127.0.0.2"
        honest.send(0, on_media(1, None, "CPU"))
        applied(state, 0)
        assert blocks_of(ingestor, "vllm@0") == {1, 2}
        with ingestor.state.lock:
            assert index.blocks_by_medium() == {f"m{m}": 1 for m in range(4)} | {
                "GPU": 1,
                "CPU": 1,
            }
            assert index.locations.refused_media == {"publisher": 0, "host": 12, "max_media": 0}
    finally:
        ingestor.close()


@pytest.mark.parametrize("share", [LOCATIONS_PER_HOST, 64])
def test_one_hosts_streams_hold_at_most_its_share_of_locations(
    peers: list[RawPublisher], share: int
) -> None:
    """Within its 4 media, one peer's sixteen streams, each holding a block in every KV
    cache group, held all 1,024 locations, and another host's GPU store had none. A host's
    streams hold ``listen_max_locations_per_host`` together (by default
    ``LOCATIONS_PER_HOST``); past them events are refused, counted."""
    ingestor = listening(listen_max_locations_per_host=share)
    index = ingestor.state.index
    every_location = [
        BlockStored([n], None, [], 16, None, f"m{m}", None, group_idx=g)
        for n, (m, g) in enumerate((m, g) for m in range(4) for g in range(MAX_GROUPS))
    ]
    payload = encode_batch(KVEventBatch(ts=1.0, events=every_location, data_parallel_rank=0))
    streams = MAX_LOCATIONS // len(every_location)
    try:
        for n in range(streams):
            raw = RawPublisher(bound(ingestor), f"h{n}".encode())
            peers.append(raw)
            state = heard(ingestor, raw, f"h{n}", 0)
            raw.send(0, payload)
            applied(state, 0)
        refused = (MAX_LOCATIONS - share) // len(every_location) * len(every_location)
        with ingestor.state.lock:
            assert len(index.locations.names) == share
            assert index.locations.refused_location_events == refused
        honest = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port_of(ingestor)}", b"vllm")
        peers.append(honest)
        state = heard(ingestor, honest, "vllm", 0)
        honest.send(0, on_media(150, None))
        applied(state, 0)
        assert blocks_of(ingestor, "vllm@0") == {150}
        with ingestor.state.lock:
            assert index.locations.refused_location_events == refused
    finally:
        ingestor.close()


def test_the_gpu_keeps_a_place_when_other_hosts_name_every_other_medium(
    peers: list[RawPublisher],
) -> None:
    """Hosts each within their share can still name ``max_media`` media between them: one
    place is the GPU's until it is named, so an engine's GPU stores get in, and media past
    the rest are refused, counted under ``max_media``."""
    ingestor = listening(max_media=3, listen_max_media_per_host=1)
    index = ingestor.state.index
    port = port_of(ingestor)
    try:
        for n in range(3):
            raw = RawPublisher(f"tcp://127.0.0.{2 + n}:0;127.0.0.1:{port}", f"h{n}".encode())
            peers.append(raw)
            state = heard(ingestor, raw, f"h{n}", 0)
            raw.send(0, on_media(100 * n, f"m{n}"))
            applied(state, 0)
        with ingestor.state.lock:
            assert index.blocks_by_medium() == {"m0": 1, "m1": 1}
            assert index.locations.refused_media == {"publisher": 0, "host": 0, "max_media": 1}
        engine = RawPublisher(bound(ingestor), b"vllm")
        peers.append(engine)
        state = heard(ingestor, engine, "vllm", 0)
        engine.send(0, on_media(1, None))
        applied(state, 0)
        assert blocks_of(ingestor, "vllm@0") == {1}
    finally:
        ingestor.close()


def moved(ingestor: Ingestor, raw: RawPublisher, name: str, host: str) -> PublisherState:
    """Probe with stats frames until the sidecar has heard stream ``name`` from ``host``."""
    engine_id, rank = name.split("@")
    state = ingestor.state.publishers[name]

    def arrived() -> bool:
        raw.pub.send_multipart(
            [DEFAULT_STATS_TOPIC, encode_seq(0), stats_payload(engine_id, int(rank))]
        )
        return state.host == host

    wait_until(arrived, f"the sidecar hears {name} from {host}")
    return state


def test_an_engine_back_from_a_new_address_keeps_its_name_and_moves_to_that_hosts_share(
    peers: list[RawPublisher],
) -> None:
    """A stream's host was its first frame's for good: a pod rescheduled with a new IP
    address stayed in its old address's share, and whoever came to that address later
    found it taken. Its label, counts and blocks stay; its share moves with it."""
    ingestor = listening(listen_max_media_per_host=2)
    index, listener = ingestor.state.index, listener_of(ingestor)
    port = port_of(ingestor)
    try:
        first = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port}", b"vllm")
        peers.append(first)
        state = heard(ingestor, first, "vllm", 0)
        first.send(0, on_media(1, None, "CPU"))
        applied(state, 0)
        first.close()
        peers.remove(first)
        again = RawPublisher(f"tcp://127.0.0.3:0;127.0.0.1:{port}", b"vllm")
        peers.append(again)
        assert moved(ingestor, again, "vllm@0", "127.0.0.3") is state
        again.send(1, on_media(3, None))
        applied(state, 1)
        assert blocks_of(ingestor, "vllm@0") == {1, 2, 3}
        assert list(ingestor.state.publishers) == ["vllm@0"]
        assert (listener.stream_moves, listener.stream_move_resets) == (1, 0)
        newcomer = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port}", b"next")
        beside = RawPublisher(f"tcp://127.0.0.3:0;127.0.0.1:{port}", b"beside")
        peers += [newcomer, beside]
        for raw, name, media in ((newcomer, "next", ("m0", "m1")), (beside, "beside", ("m2",))):
            stream = heard(ingestor, raw, name, 0)
            raw.send(0, on_media(10, *media))  # .2's share is free, .3's the engine's
            applied(stream, 0)
        assert blocks_of(ingestor, "next@0") == {10, 11}
        assert blocks_of(ingestor, "beside@0") == set()
        with ingestor.state.lock:
            assert index.locations.refused_media == {"publisher": 0, "host": 1, "max_media": 0}
    finally:
        ingestor.close()


def test_a_peer_sending_first_under_an_engines_name_does_not_hold_the_engine_to_its_share(
    peers: list[RawPublisher],
) -> None:
    """The peer whose frame a stream heard first held it to that peer's share for good:
    a peer that named the engine's stream first, then filled its own share, had the
    engine's GPU and CPU stores refused. Each frame is held to its sender's share."""
    ingestor = listening(listen_max_media_per_host=2)
    index, listener = ingestor.state.index, listener_of(ingestor)
    port = port_of(ingestor)
    try:
        squatter = RawPublisher(bound(ingestor), b"vllm")
        filler = RawPublisher(bound(ingestor), b"filler")
        peers += [squatter, filler]
        squatted = heard(ingestor, squatter, "vllm", 0)
        assert squatted.host == "127.0.0.1"
        squatter.send(0, on_media(0))  # after the probes still in flight: applied, none are
        applied(squatted, 0)
        filler.send(0, on_media(100, "m0", "m1"))
        applied(heard(ingestor, filler, "filler", 0), 0)
        engine = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port}", b"vllm")
        peers.append(engine)
        state = moved(ingestor, engine, "vllm@0", "127.0.0.2")
        engine.send(1, on_media(1, None, "CPU"))
        applied(state, 1)
        assert blocks_of(ingestor, "vllm@0") == {1, 2}
        with ingestor.state.lock:
            assert sum(index.locations.refused_media.values()) == 0
        assert listener.stream_move_resets == 0
    finally:
        ingestor.close()


def test_a_stream_moved_to_a_host_whose_share_has_no_room_for_it_is_forgotten(
    peers: list[RawPublisher],
) -> None:
    """Moved whole, a stream could take past a host's share: a peer of two addresses
    filled one's share, moved it to the other and filled the first again. What the new
    host's share cannot take is forgotten, counted."""
    ingestor = listening(listen_max_media_per_host=1)
    index, listener = ingestor.state.index, listener_of(ingestor)
    port = port_of(ingestor)
    try:
        here = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port}", b"s")
        there = RawPublisher(f"tcp://127.0.0.3:0;127.0.0.1:{port}", b"t")
        peers += [here, there]
        state = heard(ingestor, here, "s", 0)
        here.send(0, on_media(1, "m0"))
        applied(state, 0)
        there.send(0, on_media(10, "m1"))
        applied(heard(ingestor, there, "t", 0), 0)
        moving = RawPublisher(f"tcp://127.0.0.3:0;127.0.0.1:{port}", b"s")
        peers.append(moving)
        moved(ingestor, moving, "s@0", "127.0.0.3")
        assert blocks_of(ingestor, "s@0") == set()
        assert blocks_of(ingestor, "t@0") == {10}
        assert (listener.stream_moves, listener.stream_move_resets) == (1, 1)
        with ingestor.state.lock:
            assert index.blocks_by_medium() == {"m1": 1}
    finally:
        ingestor.close()


def test_an_ipc_peers_streams_are_held_to_max_media_only(
    peers: list[RawPublisher], tmp_path: Path
) -> None:
    """An ipc:// peer has no IP address: the socket file's permissions say who connects
    there, as for the connection limits, so its streams have no host's share."""
    ingestor = listening(f"ipc://{tmp_path}/kv.sock", listen_max_media_per_host=1)
    try:
        for n in range(2):
            raw = RawPublisher(bound(ingestor), f"local{n}".encode())
            peers.append(raw)
            state = heard(ingestor, raw, f"local{n}", 0)
            assert state.host is None
            raw.send(0, on_media(10 * n, f"m{2 * n}", f"m{2 * n + 1}"))
            applied(state, 0)
        index = ingestor.state.index
        with ingestor.state.lock:
            assert index.blocks_by_medium() == {f"m{m}": 1 for m in range(4)}
            assert sum(index.locations.refused_media.values()) == 0
    finally:
        ingestor.close()


def test_connections_that_never_finish_a_handshake_take_no_place(
    peers: list[RawPublisher],
) -> None:
    """A port scan or an idle TCP socket once counted against the limit and locked the
    engines out."""
    ingestor = listening(listen_max_connections=1)
    host, port = bound(ingestor).removeprefix("tcp://").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(3)]
    try:
        engine = RawPublisher(bound(ingestor), b"engine")
        peers.append(engine)
        heard(ingestor, engine, "engine", 0)
        assert ingestor.state.listener is not None
        assert ingestor.state.listener.refused_connections == 0
    finally:
        for sock in idle:
            sock.close()
        ingestor.close()


def test_an_idle_connection_closing_frees_no_place_an_engine_holds(
    peers: list[RawPublisher],
) -> None:
    """Answers were once paired with the oldest unanswered connection: an idle socket took
    an engine's admission, and when ZMQ closed it the engine's place looked free, so the
    limit could be passed again and again."""
    ingestor = listening(listen_max_connections=1)
    listener = listener_of(ingestor)
    host, port = bound(ingestor).removeprefix("tcp://").rsplit(":", 1)
    idle = socket.create_connection((host, int(port)))
    idle.settimeout(30)
    try:
        engine = RawPublisher(bound(ingestor), b"engine")
        peers.append(engine)
        heard(ingestor, engine, "engine", 0)
        while idle.recv(4096):  # ZMQ's greeting, then its close at the handshake timeout
            pass
        other = RawPublisher(bound(ingestor), b"other")
        peers.append(other)
        wait_until(lambda: listener.refused_connections >= 1, "the second engine is refused")
        assert "other@0" not in ingestor.state.publishers and listener.connections == 1
    finally:
        idle.close()
        ingestor.close()


def test_connections_past_the_gates_wait_list_are_counted_as_admitted_until_they_close(
    monkeypatch: pytest.MonkeyPatch, peers: list[RawPublisher]
) -> None:
    """The gate kept every connection accepted in the last SETTLED_S, so a peer opening
    connections as fast as TCP allows grew it without bound. Past its cap the oldest is
    counted as admitted (fail closed: dropped uncounted, an admitted one would have left a
    place open past the limit), and holds its place until it closes."""
    # Handshakes that do not time out while the test runs: the idle connections stay open
    # and young until closed here, however slowly the test runs.
    monkeypatch.setattr(listen_gate, "HANDSHAKE_IVL_MS", 600_000)
    monkeypatch.setattr(listen_gate, "SETTLED_S", 601.0)
    ingestor = listening(listen_max_connections=1)
    listener = listener_of(ingestor)
    host, port = bound(ingestor).removeprefix("tcp://").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(YOUNG_PER_PLACE + 1)]
    try:
        wait_until(  # the shed one holds the only place
            lambda: (listener.shed_connections, listener.connections) == (1, 1),
            "one past the cap sheds the oldest, counted as admitted",
        )
        refused = RawPublisher(bound(ingestor), b"refused")
        peers.append(refused)
        wait_until(  # its own connection, one past the cap again, shed the next oldest
            lambda: (listener.refused_connections, listener.shed_connections) == (1, 2),
            "a peer finds no place free",
        )
        wait_until(lambda: listener.connections == 2, "both shed connections hold a place")
        for sock in idle:
            sock.close()
        wait_until(lambda: listener.connections == 0, "the shed connection's close frees it")
        engine = RawPublisher(bound(ingestor), b"engine")
        peers.append(engine)
        heard(ingestor, engine, "engine", 0)
        assert (listener.shed_connections, listener.connections) == (2, 1)
    finally:
        for sock in idle:
            sock.close()
        ingestor.close()


def test_a_peer_outside_the_allowed_networks_is_refused_for_good_and_takes_no_place(
    peers: list[RawPublisher],
) -> None:
    """Any host that reached the endpoint could hold every place with handshakes that
    complete: with listen_allow only the engines' networks are admitted. The loopback
    network routes all of 127/8, so a peer connecting from 127.0.0.2 is another host."""
    ingestor = listening(listen_max_connections=1, listen_allow=["127.0.0.1/32", "fd00::/8"])
    listener = listener_of(ingestor)
    try:
        port = port_of(ingestor)
        stranger = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port}", b"stranger")
        peers.append(stranger)
        wait_until(lambda: listener.refused_addresses == 1, "the stranger is refused")
        for seq in range(3):
            stranger.send(seq, kv_payload(stored(100 + seq), rank=0))
        engine = RawPublisher(bound(ingestor), b"engine")
        peers.append(engine)
        heard(ingestor, engine, "engine", 0)  # the one place was the engine's to take
        assert "stranger@0" not in ingestor.state.publishers
        assert (listener.refused_addresses, listener.refused_connections) == (1, 0)
    finally:
        ingestor.close()


def test_listen_allow_governs_network_peers_and_lets_an_ipc_peer_in(
    peers: list[RawPublisher], tmp_path: Path
) -> None:
    """A peer of an ipc:// endpoint reaches the gate with no address: the socket file's
    permissions decide who connects there. Matched as an address it was refused for
    good, so listen_allow beside an ipc:// endpoint locked every local engine out."""
    ipc = f"ipc://{tmp_path}/kv.sock"
    state = SidecarState.from_settings(
        SidecarSettings(listen=[LISTEN, ipc], listen_allow=["127.0.0.1"])
    )
    ingestor = Ingestor(state)
    ingestor.start()
    listener = listener_of(ingestor)
    try:
        local = RawPublisher(ipc, b"local")
        peers.append(local)
        heard(ingestor, local, "local", 0)
        stranger = RawPublisher(f"tcp://127.0.0.2:0;127.0.0.1:{port_of(ingestor)}", b"stranger")
        peers.append(stranger)
        wait_until(lambda: listener.refused_addresses == 1, "the tcp stranger is refused")
        assert listener.refused_connections == 0
    finally:
        ingestor.close()


@pytest.mark.parametrize(
    ("address", "networks", "expected"),
    [
        (b"10.1.2.3", ["10.0.0.0/8"], True),
        (b"10.1.2.3", ["192.168.0.0/16", "10.1.2.3"], True),
        (b"11.0.0.1", ["10.0.0.0/8"], False),
        (b"::ffff:10.1.2.3", ["10.0.0.0/8"], True),  # an IPv4 peer of a dual-stack socket
        (b"::ffff:203.0.113.9", ["::/0"], False),  # as on an IPv4 socket: no IPv6 network
        (b"fd00::5", ["fd00::/8"], True),
        (b"fd00::5", ["10.0.0.0/8"], False),
        (b"not an address", ["0.0.0.0/0"], False),
        (b"\xff\xfe", ["0.0.0.0/0"], False),
    ],
)
def test_an_address_is_allowed_by_network(address: bytes, networks: list[str], expected: bool):
    parsed = [ip_network(network) for network in networks]
    assert allowed(address, parsed) is expected


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (b"", True),
        (b"localhost", True),  # where the system does not tell a socket's peer credentials
        (b"localhost:1000:1000:4242", True),
        (b"127.0.0.1", False),
        (b"::1", False),
    ],
)
def test_an_ipc_peer_is_told_by_its_address(address: bytes, expected: bool) -> None:
    assert ipc_peer(address) is expected


@pytest.mark.parametrize(
    ("address", "host"),
    [
        (b"10.1.2.3", "10.1.2.3"),
        (b"::ffff:10.1.2.3", "10.1.2.3"),  # an IPv4 peer of a dual-stack socket
        (b"fd00:0::5", "fd00::5"),
        (b"fe80::1%eth0", "fe80::1"),  # one host, whichever interface it came by
        (b"localhost:1000:1000:4242", None),  # an ipc:// peer
        (b"", None),
        (b"\xff\xfe", None),
    ],
)
def test_a_peers_host_is_its_canonical_ip_address(address: bytes, host: str | None) -> None:
    assert address_host(address) == host


def test_a_tcp_peer_reset_before_zmq_reads_its_address_never_asks_the_gate() -> None:
    """libzmq reads a TCP peer's address once, as it accepts the connection, and reads
    none where the peer reset it before that: the gate would count such a peer under no
    host. But a reset connection takes no write, and libzmq asks the ZAP handler only
    once its own greeting is written, and takes a message only after that: so no such
    peer reaches the gate, nor any frame of one the listen socket, and every peer and
    frame there has its IP address. The peer connects, greets and resets on a plain
    listening socket, which is then given to ZMQ (``ZMQ_USE_FD``) to accept it from."""
    listener = ListenerState((LISTEN,), 8, 8, 8)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.SUB)
        gate = ListenGate(ctx, sock, listener)
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            peer = socket.create_connection(("127.0.0.1", port))
            peer_port = peer.getsockname()[1]
            peer.sendall(GREETING + ready_command(b"PUB"))  # all it can say before an answer
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()  # a reset
            wait_until(lambda: not _tcp_connected(port, peer_port), "the reset arrives")
            sock.setsockopt(zmq.USE_FD, server.detach())
        sock.bind(f"tcp://127.0.0.1:{port}")
        gate._monitor.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        events = [parse_monitor_message(gate._monitor.recv_multipart())["event"] for _ in "ab"]
        assert events == [zmq.EVENT_ACCEPTED, zmq.EVENT_DISCONNECTED]
        assert (gate._zap.poll(0), sock.poll(0)) == (0, 0)
        with socket.create_connection(("127.0.0.1", port)) as stays:  # greets as the other did
            handshake(stays, b"PUB")
            gate._zap.rcvtimeo = 60_000
            assert gate._zap.recv_multipart()[5] == b"127.0.0.1"
    finally:
        ctx.destroy(linger=0)


def _tcp_connected(port: int, peer_port: int) -> bool:
    """Whether Linux's TCP table holds the connection of ``peer_port`` to ``port`` on the
    side of ``port`` (a connection reset there is dropped from it)."""
    wanted = (f"{port:04X}", f"{peer_port:04X}")
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return any((row[1].rpartition(":")[2], row[2].rpartition(":")[2]) == wanted for row in rows)


def test_a_descriptors_host_is_its_peers_and_reading_it_leaks_no_descriptor() -> None:
    """The gate reads a settled connection's host from ZMQ's descriptor: through a duplicate,
    which must be closed again, and never the descriptor itself."""
    opened = len(os.listdir("/proc/self/fd"))
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            for _ in range(50):
                assert descriptor_host(accepted.fileno()) == "127.0.0.1"
            accepted.getpeername()  # still open
        local, remote = socket.socketpair()  # AF_UNIX, as an ipc:// peer's: no host
        with local, remote:
            assert descriptor_host(local.fileno()) is None
        assert descriptor_host(local.fileno()) is None  # closed since
    assert len(os.listdir("/proc/self/fd")) == opened


def test_ipc_peers_are_held_to_the_total_limit_only() -> None:
    """An ipc:// peer has no IP address: the host limit does not apply to it, and peers
    whose address is no IP are not one host between them."""
    listener = ListenerState(("ipc:///x",), 8, 3, 1)
    ctx = zmq.Context()
    try:
        gate = ListenGate(ctx, ctx.socket(zmq.SUB), listener)
        answers = [gate._decide(b"localhost:1000:1000:%d" % pid) for pid in range(4)]
        assert answers == [ADMITTED] * 3 + [REFUSED]
        assert (listener.refused_connections, listener.refused_host_connections) == (1, 0)
    finally:
        ctx.destroy(linger=0)


def test_the_host_limit_counts_each_host_apart_and_after_the_total() -> None:
    listener = ListenerState(("tcp://127.0.0.1:*",), 8, 4, 2)
    ctx = zmq.Context()
    try:
        gate = ListenGate(ctx, ctx.socket(zmq.SUB), listener)
        hosts = [b"10.0.0.1", b"::ffff:10.0.0.1", b"10.0.0.1", b"10.0.0.2", b"10.0.0.2"]
        answers = [gate._decide(address) for address in hosts]
        assert answers == [ADMITTED, ADMITTED, HOST_REFUSED, ADMITTED, ADMITTED]
        assert gate._decide(b"10.0.0.3") == REFUSED, "the total is reached first"
        assert (listener.refused_host_connections, listener.refused_connections) == (1, 1)
    finally:
        ctx.destroy(linger=0)


class _Clock:
    """The gate's monotonic clock, moved by the test: what counts as settled is a matter of
    time, and the interleavings below need their times exact."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now


def test_a_connection_accepted_while_requests_are_answered_still_counts_for_its_host(
    peers: list[RawPublisher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate read the monitor once, then answered every waiting request: a connection
    accepted in between was admitted before its accept was read. Its admission was
    forgotten SETTLED_S after it, its connection counted only SETTLED_S after the read, and
    in between its host was given a place too many, kept as long as that peer stayed."""
    clock = _Clock()
    monkeypatch.setattr(listen_gate, "time", clock)
    listener = ListenerState((LISTEN,), 8, 8, 1)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.SUB)
        gate = ListenGate(ctx, sock, listener)
        sock.bind(LISTEN)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        gate.on_ready(gate._monitor)  # the ingest thread reads the monitor: nothing yet
        first = RawPublisher(endpoint, b"a")
        peers.append(first)
        wait_until(lambda: gate._zap.poll(0) != 0, "the first peer's handshake asks the gate")
        gate._answer()  # ... and then answers what came meanwhile
        clock.now += 1.0
        gate.on_ready(gate._monitor)  # the next turn
        clock.now += SETTLED_S - 0.5  # the admission is SETTLED_S old, the read is not
        second = RawPublisher(endpoint, b"b")
        peers.append(second)
        wait_until(lambda: gate._zap.poll(0) != 0, "the second peer's handshake asks the gate")
        gate.on_ready(gate._zap)
        assert (listener.refused_host_connections, listener.connections) == (1, 1)
    finally:
        ctx.destroy(linger=0)


def test_the_host_limit_must_admit_someone() -> None:
    with pytest.raises(ValidationError, match="listen_max_connections_per_host"):
        SidecarSettings(listen=[LISTEN], listen_max_connections_per_host=0)


def test_a_hosts_share_of_locations_is_from_one_to_every_location_of_the_index() -> None:
    """The setting's bounds are the index's, which refuses others; its default is the
    index's own."""
    assert SidecarSettings.model_fields["listen_max_locations_per_host"].default == (
        LOCATIONS_PER_HOST
    )
    for wrong, words in ((0, "greater than or equal to 1"), (MAX_LOCATIONS + 1, "less than")):
        with pytest.raises(ValidationError, match=f"listen_max_locations_per_host\n.*{words}"):
            SidecarSettings(listen=[LISTEN], listen_max_locations_per_host=wrong)
    every = SidecarSettings(listen=[LISTEN], listen_max_locations_per_host=MAX_LOCATIONS)
    assert SidecarState.from_settings(every).index.locations.locations_per_host == MAX_LOCATIONS


@pytest.mark.parametrize("endpoints", [("tcp://127.0.0.1:*",), ("tcp://127.0.0.1:*", "ipc:///x")])
def test_a_peer_without_an_ip_address_passes_allow_only_where_ipc_is_served(
    endpoints: tuple[str, ...],
) -> None:
    """No TCP peer asks the gate without its IP address: libzmq has none only for a
    connection reset before it was accepted, which never asks (test_a_tcp_peer_reset_...).
    Were one to, a socket that serves no ipc:// endpoint would refuse it."""
    listener = ListenerState(endpoints, 8, 8, 8, allow=(ip_network("10.0.0.0/8"),))
    ctx = zmq.Context()
    try:
        gate = ListenGate(ctx, ctx.socket(zmq.SUB), listener)
        serves_ipc = len(endpoints) == 2
        for address in (b"", b"localhost"):
            assert gate._decide(address) == (ADMITTED if serves_ipc else NOT_ALLOWED)
    finally:
        ctx.destroy(linger=0)


def test_listen_allow_names_a_network_that_does_not_parse() -> None:
    with pytest.raises(ValidationError, match=r"'10\.0\.0\.0/33' is not an IP network"):
        SidecarSettings(listen=[LISTEN], listen_allow=["10.0.0.0/8", "10.0.0.0/33"])
    settings = SidecarSettings(listen=[LISTEN], listen_allow="10.0.0.0/8, 192.168.1.5")
    assert settings.listen_allow == ["10.0.0.0/8", "192.168.1.5/32"]


def test_listen_allow_refuses_a_scope_id_which_matching_would_ignore() -> None:
    """fe80::%eth0/64 contains fe80::1 from every interface: the scope id reads as a
    limit that is not there."""
    with pytest.raises(ValidationError, match=r"'fe80::%eth0/64' names a scope id"):
        SidecarSettings(listen=[LISTEN], listen_allow=["fe80::%eth0/64"])
    with pytest.raises(ValidationError, match=r"'fe80::1%eth0/64' names a scope id"):
        SidecarSettings(listen=[LISTEN], listen_allow=["fe80::1%eth0/64"])  # masked: lost


def test_listen_allow_refuses_an_abstract_ipc_socket_it_cannot_guard() -> None:
    """ipc://@name has no file, so no permissions: with allow beside it any local process
    of any user got in through a gate the settings said was closed."""
    with pytest.raises(ValidationError, match=r"cannot guard 'ipc://@kvscope'"):
        SidecarSettings(listen=[LISTEN, "ipc://@kvscope"], listen_allow=["10.0.0.0/8"])
    assert SidecarSettings(listen=["ipc://@kvscope"]).listen == ["ipc://@kvscope"]


def test_an_ipv4_mapped_network_is_allowed_as_its_ipv4_network() -> None:
    """::ffff:10.0.0.0/104 names 10/8; kept IPv6 it missed an IPv4 peer of an IPv4
    socket, whose address reaches the gate unmapped."""
    settings = SidecarSettings(listen=[LISTEN], listen_allow=["::ffff:10.0.0.0/104", "10.1.2.3/8"])
    assert settings.listen_allow == ["10.0.0.0/8", "10.0.0.0/8"]
    networks = [ip_network(network) for network in settings.listen_allow]
    assert allowed(b"10.9.9.9", networks)


@needs_ipv6_loopback
def test_a_dual_stack_listen_socket_matches_an_ipv4_peer_by_its_ipv4_address(
    peers: list[RawPublisher],
) -> None:
    """On a socket bound to [::] an IPv4 peer's address reaches the gate IPv4-mapped
    (::ffff:127.0.0.1): matched as such, it missed every IPv4 network named."""
    ingestor = listening("tcp://[::]:*", listen_allow=["127.0.0.1"])
    listener = listener_of(ingestor)
    try:
        port = port_of(ingestor)
        engine = RawPublisher(f"tcp://127.0.0.1:{port}", b"engine")
        peers.append(engine)
        heard(ingestor, engine, "engine", 0)
        ctx = zmq.Context()
        stranger = ctx.socket(zmq.PUB)
        stranger.setsockopt(zmq.IPV6, 1)
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.connect(f"tcp://[::1]:{port}")
        try:
            wait_until(lambda: listener.refused_addresses == 1, "the IPv6 peer is refused")
        finally:
            ctx.destroy()
        assert listener.refused_connections == 0
    finally:
        ingestor.close()
