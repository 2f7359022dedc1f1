"""A publisher speaking vLLM's KV-event protocol on real sockets, under a test's control.

kvscope's own EventPublisher never loses a frame or restarts its sequence on
purpose; the sidecar must cope with publishers that do, so tests use this
minimal peer (PUB + ROUTER replay, vLLM's framing) to produce such streams.
Like vLLM's publisher, it binds its PUB socket or connects it to a listening
sidecar.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import zmq

from app.ingest import Ingestor
from app.ingest.replay import HELD_FRAME_OVERHEAD
from app.settings import IngestConfig, PublisherEndpoints
from app.state.block_index import BlockIndex
from app.state.event_log import EventLog
from app.state.publisher import PublisherState
from app.state.sidecar import SidecarState
from offload.base import OffloadingEvent
from offload.wire.endpoints import binds_ipv6
from offload.wire.framing import END_OF_REPLAY_SEQ
from offload.wire.kv_events import KVEventBatch, encode_batch, to_kv_events
from offload.wire.stats_frame import StatsFrame, WorkerConfig, encode_stats_frame
from tests.support.polling import wait_until

Answerer = Callable[["RawPublisher", bytes, int], None]
"""How a replay request is answered: (publisher, the asker's identity, first sequence wanted).
It sends on ``publisher.router`` from the publisher's replay thread, as slowly as it likes."""


def honest_answer(raw: RawPublisher, identity: bytes, start: int) -> None:
    """Every buffered batch from ``start`` on, then the end marker, as vLLM answers."""
    with raw._lock:
        answers = [(s, p) for s, p in raw.buffer if s >= start]
    for seq, payload in answers:
        raw.answer(identity, seq, payload)
    raw.end(identity)


def gated_by(gate: threading.Event) -> Answerer:
    """An honest answerer that waits for ``gate`` first: the replay stays open until then."""

    def gated(raw: RawPublisher, identity: bytes, start: int) -> None:
        gate.wait(30)
        honest_answer(raw, identity, start)

    return gated


class RawPublisher:
    """vLLM's protocol on real sockets, under the test's control: it can lose frames.

    ``connect``: a listening sidecar's endpoint to connect the PUB socket to;
    without it the PUB socket binds a free port, or with ``bind=False`` is left for the
    test to connect (``pub.connect``): for a peer whose replay socket the sidecar must be
    told of before it binds the listen socket the peer connects to. ``topic`` is the KV
    topic. ``answerer`` answers replay requests (default: honestly, ``honest_answer``)
    on the replay socket, which binds ``replay`` (an IPv6 address in brackets with ZMQ's
    IPv6 option).
    """

    def __init__(
        self,
        connect: str | None = None,
        topic: bytes = b"",
        answerer: Answerer = honest_answer,
        *,
        bind: bool = True,
        replay: str = "tcp://127.0.0.1:*",
    ) -> None:
        self.ctx = zmq.Context()
        self.topic = topic
        self.answerer = answerer
        self.pub = self.ctx.socket(zmq.PUB)
        if connect is not None:
            self.pub.connect(connect)
        elif bind:
            self.pub.bind("tcp://127.0.0.1:*")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.ipv6 = binds_ipv6(replay)
        self.router.bind(replay)
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def endpoints(self) -> PublisherEndpoints:
        return PublisherEndpoints(
            self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
            self.router.getsockopt_string(zmq.LAST_ENDPOINT),
        )

    def send(self, seq: int, payload: bytes, *, lose: bool = False) -> None:
        with self._lock:
            self.buffer.append((seq, payload))
        if not lose:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def answer(self, identity: bytes, seq: int, payload: bytes) -> None:
        """One batch of a replay answer (for an answerer)."""
        self.router.send_multipart([identity, b"", self.topic, seq.to_bytes(8, "big"), payload])

    def end(self, identity: bytes) -> None:
        """The end marker of a replay answer (for an answerer)."""
        self.router.send_multipart([identity, b"", b"", END_OF_REPLAY_SEQ, b""])

    @property
    def stopping(self) -> bool:
        """True once ``close`` began: a slow answerer should stop."""
        return self._stop.is_set()

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            identity, _, start = self.router.recv_multipart()
            with self._lock:
                self.replay_requests += 1
            self.answerer(self, identity, int.from_bytes(start, "big"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.ctx.destroy(linger=0)


def kv_payload(*events: OffloadingEvent, rank: int | None = None) -> bytes:
    batch = KVEventBatch(ts=1.0, events=to_kv_events(list(events)), data_parallel_rank=rank)
    return encode_batch(batch)


def free_tcp_endpoint() -> str:
    """``tcp://127.0.0.1:PORT`` for a port free right now, for an endpoint the sidecar is
    told of and nothing binds (a declared replay socket that no test asks).

    Never for one that something binds later: the port can be taken in between.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


# --- the sidecar's side: an ingest thread following such peers ------------------------


@contextmanager
def ingesting(
    *publishers: PublisherEndpoints,
    config: IngestConfig | None = None,
    max_blocks: int = 1000,
    max_media: int = 16,
    event_log: EventLog | None = None,
) -> Iterator[Ingestor]:
    """A running ingest thread over ``publishers`` (connect mode), closed on exit."""
    state = SidecarState(
        BlockIndex(max_blocks, max_media),
        EventLog(1000) if event_log is None else event_log,
        publishers,
        ingest=config,
    )
    ingestor = Ingestor(state)
    ingestor.start()
    try:
        yield ingestor
    finally:
        ingestor.close()


def stats_probe(engine_id: str = "e0", rank: int = 0) -> bytes:
    """A small valid stats frame's payload."""
    config = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)
    return encode_stats_frame(StatsFrame(ts=1.0, engine_id=engine_id, rank=rank, config=config))


def wait_connected(
    raw: RawPublisher, ingestor: Ingestor, stats_topic: bytes = b"kvscope.stats"
) -> PublisherState:
    """Probe with stats frames until the sidecar receives ``raw`` (ZMQ's slow joiner)."""
    state = ingestor.state.publishers[raw.endpoints.endpoint]
    before = state.stats_frames

    def seen() -> bool:
        raw.pub.send_multipart([stats_topic, b"\0" * 8, stats_probe()])
        return state.stats_frames > before

    wait_until(seen, "the sidecar receives the raw publisher")
    return state


@dataclass(frozen=True)
class HeldDrops:
    """An ingestor whose replay of lost frame 1 (shown by 2) waits on ``gate``: it holds 3 to 7
    behind it and has dropped 8 to 28 past its hold bound (``payloads``: a one-block batch
    per number, 0 to 29; 29 not sent)."""

    gate: threading.Event
    raw: RawPublisher
    ingestor: Ingestor
    state: PublisherState
    payloads: dict[int, bytes]


@contextmanager
def dropped_while_held() -> Iterator[HeldDrops]:
    """``HeldDrops``, its gate set and its publisher closed after."""
    gate = threading.Event()
    raw = RawPublisher(answerer=gated_by(gate))
    payloads = {seq: kv_payload(OffloadingEvent([seq], 16, "CPU", False)) for seq in range(30)}
    config = IngestConfig(replay_hold_bytes=5 * (len(payloads[5]) + HELD_FRAME_OVERHEAD))
    try:
        with ingesting(raw.endpoints, config=config) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, payloads[0])
            raw.send(1, payloads[1], lose=True)
            for seq in range(2, 29):  # 2 shows the gap; 3 to 7 are held, 8 to 28 dropped
                raw.send(seq, payloads[seq])
            wait_until(lambda: state.held_dropped == 21, "the frames past the bound dropped")
            yield HeldDrops(gate, raw, ingestor, state, payloads)
    finally:
        gate.set()
        raw.close()
