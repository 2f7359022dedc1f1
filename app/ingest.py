"""Receiving publishers' frames: kvscope workers and vLLM's own KV-event publisher.

The sidecar meets a publisher one of two ways, and one sidecar may do both.
Connect mode: a SUB socket per publisher, connected to the PUB socket the
publisher binds, so the socket says who sent a frame. Listen mode: one SUB
socket bound to the ``listen`` endpoints, which any number of publishers
connect to; a frame goes to the publisher of its stream (topic and rank,
app/streams.py), added on its first frame.

One thread owns every socket (ZMQ sockets are not thread-safe) and applies
what arrives to the sidecar's state, publisher by publisher, in sequence
order: gaps are filled from the publisher's replay socket, a sequence that
goes back resets that publisher's view, malformed frames are counted and
skipped. A stats frame updates the publisher's totals and rates right when it
arrives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from typing import Final, NamedTuple

import msgspec
import zmq

from app.decode import DecodedBatch, decode_kv_payload
from app.settings import PublisherEndpoints
from app.state.listener import ListenerState
from app.state.publisher import PublisherState
from app.state.sidecar import SidecarState
from app.state.worker_stats import WorkerStats, block_bytes_by_medium
from offload.wire.framing import (
    DEFAULT_KV_TOPIC,
    DEFAULT_STATS_TOPIC,
    END_OF_REPLAY_SEQ,
    MalformedFrame,
    decode_seq,
    replay_request,
)
from offload.wire.stats_frame import StatsFrame, decode_stats_frame

logger = logging.getLogger(__name__)

POLL_MS: Final = 100
"""How often the thread looks at its stop flag when no frame arrives."""

MAX_LISTEN_MESSAGE_BYTES: Final = 64 * 2**20
"""Largest frame the listen socket takes (a publisher's whole replay buffer, by default).

Anyone who reaches the socket may connect; a peer that sends more is
disconnected by ZMQ instead of having its frame buffered."""


MAX_SEQ_JUMP: Final = 2**32
"""The largest forward jump of a publisher's sequence still read as lost batches.

Four billion batches is weeks of any engine's output; a larger jump is a
publisher that started a new sequence (or a forged frame), so it resets that
publisher's view like a sequence that goes back, instead of counting
billions of batches missed."""


class ListenError(Exception):
    """A ``listen`` endpoint could not be bound (taken, or no such address here)."""


class _Batch(NamedTuple):
    """A KV message, decoded: its topic, sequence number and batch."""

    topic: bytes
    seq: int
    batch: DecodedBatch


class Ingestor:
    """Receives from every publisher and keeps the sidecar's state current."""

    def __init__(
        self,
        state: SidecarState,
        *,
        kv_topic: bytes = DEFAULT_KV_TOPIC,
        stats_topic: bytes = DEFAULT_STATS_TOPIC,
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.state = state
        self._kv_topic = kv_topic
        self._stats_topic = stats_topic
        self._replay_timeout_ms = int(replay_timeout_s * 1000)
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sockets: dict[zmq.Socket, PublisherState] = {}
        for publisher in state.publishers.values():
            if isinstance(publisher.source, PublisherEndpoints):
                sock = self._ctx.socket(zmq.SUB)
                for topic in {kv_topic, stats_topic}:
                    sock.setsockopt(zmq.SUBSCRIBE, topic)
                sock.connect(publisher.source.endpoint)
                self._sockets[sock] = publisher
        self._listen = None if state.listener is None else self._bind(state.listener)
        self._thread = threading.Thread(target=self._run, name="kvscope-ingest", daemon=True)

    def _bind(self, listener: ListenerState) -> zmq.Socket:
        """The listen socket, bound to every endpoint; ``ListenError`` naming the one that fails."""
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: each engine publishes on its own
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_LISTEN_MESSAGE_BYTES)
        bound = []
        for endpoint in listener.endpoints:
            sock.setsockopt(zmq.IPV6, "[" in endpoint)
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                self._ctx.destroy(linger=0)
                raise ListenError(f"cannot bind {endpoint!r}: {zmq.strerror(exc.errno)}") from None
            bound.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        listener.bound = tuple(bound)
        return sock

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and close the sockets; idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._ctx.destroy(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in self._sockets:
            poller.register(sock, zmq.POLLIN)
        if self._listen is not None:
            poller.register(self._listen, zmq.POLLIN)
        listener = self.state.listener
        while not self._stop.is_set():
            for sock, _ in poller.poll(POLL_MS):
                frames = sock.recv_multipart()
                publisher = self._sockets.get(sock)
                if publisher is not None:
                    self._on_connected(publisher, frames)
                elif listener is not None:  # the listen socket exists only with a listener
                    self._on_listened(listener, frames)

    def _on_connected(self, state: PublisherState, frames: list[bytes]) -> None:
        _heard(state)
        try:
            self._deliver(state, self._decode(frames))
        except Exception as exc:  # a publisher's bad frame must not stop the others
            _skipped(state, exc)

    def _on_listened(self, listener: ListenerState, frames: list[bytes]) -> None:
        """A frame from the listen socket, to the publisher its stream names."""
        listener.frames += 1
        try:
            message = self._decode(frames)
            state = self.state.listened_publisher(*_stream(message))
        except Exception as exc:  # malformed before it named a stream: the listener's count
            _skipped(listener, exc)
            return
        if state is None:
            listener.refused += 1
            return
        _heard(state)
        try:
            self._deliver(state, message)
        except Exception as exc:  # a publisher's bad frame must not stop the others
            _skipped(state, exc)

    def _decode(self, frames: list[bytes]) -> _Batch | StatsFrame:
        if len(frames) != 3:
            raise MalformedFrame(f"expected [topic, seq, payload], got {len(frames)} frames")
        topic, seq_bytes, payload = frames
        if topic == self._stats_topic and topic != self._kv_topic:
            return decode_stats_frame(payload)
        return _Batch(topic, decode_seq(seq_bytes), decode_kv_payload(payload))

    def _deliver(self, state: PublisherState, message: _Batch | StatsFrame) -> None:
        if isinstance(message, StatsFrame):
            self._on_stats(state, message)
            return
        _, seq, batch = message
        last = state.last_seq
        if last is not None and not last < seq <= last + MAX_SEQ_JUMP:
            self._restart(state)
        expected = 0 if state.last_seq is None else state.last_seq + 1
        if seq > expected:
            self._fill(state, expected, seq)
        self._apply(state, seq, batch)

    def _on_stats(self, state: PublisherState, frame: StatsFrame) -> None:
        """Totals and rates since the publisher's previous frame; its block sizes to the index."""
        state.worker = WorkerStats.between(state.stats, frame)
        state.stats = frame
        block_bytes = block_bytes_by_medium(frame)
        if block_bytes:
            with self.state.lock:
                for medium, size in block_bytes.items():
                    self.state.index.set_block_bytes(state.name, medium, size)
        state.stats_frames += 1

    def _restart(self, state: PublisherState) -> None:
        """The publisher's sequence went back: forget what it told us before."""
        state.restarts += 1
        state.last_seq = None
        with self.state.lock:
            self.state.index.reset_publisher(state.name)

    def _fill(self, state: PublisherState, first: int, upto: int) -> None:
        """Apply batches first..upto-1 from the replay socket, in order; count what it lacks."""
        is_gap = state.last_seq is not None
        state.gaps += is_gap
        recovered = 0
        wanted = first
        with closing(self._replay(state, first)) as answers:
            for seq, batch in answers:
                if wanted <= seq < upto:
                    self._apply(state, seq, batch)
                    recovered += 1
                    wanted = seq + 1
                if seq >= upto - 1:  # answers come oldest first: the rest is newer still
                    break
        if is_gap:
            state.missed += (upto - first) - recovered

    def _replay(self, state: PublisherState, start: int) -> Iterator[tuple[int, DecodedBatch]]:
        """The batches the publisher's replay socket holds from ``start`` on, as they arrive.

        One at a time, so a replay holds one batch in memory however long it is.
        """
        if state.source.replay_endpoint is None:
            return
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(state.source.replay_endpoint)
        try:
            dealer.send_multipart(replay_request(start))
            while dealer.poll(self._replay_timeout_ms):
                frames = dealer.recv_multipart()
                if len(frames) != 4:
                    raise MalformedFrame(f"replay answer of {len(frames)} frames")
                _, _, seq_bytes, payload = frames
                if seq_bytes == END_OF_REPLAY_SEQ:
                    break
                answer = decode_seq(seq_bytes), decode_kv_payload(payload)
                state.replayed += 1
                yield answer
        except (MalformedFrame, msgspec.DecodeError):
            state.malformed += 1
            logger.warning("bad replay answer from %s", state.name)
        finally:
            dealer.close()

    def _apply(self, state: PublisherState, seq: int, batch: DecodedBatch) -> None:
        with self.state.lock:
            self.state.index.apply(state.name, batch, time.time())
        state.last_seq = seq
        state.batches_applied += 1
        state.malformed += batch.malformed
        self.state.event_log.record(state.name, seq, batch)


def _stream(message: _Batch | StatsFrame) -> tuple[bytes, int | None]:
    """The listen-mode stream a message belongs to (app/streams.py).

    A KV batch: its topic and the rank it carries. A stats frame, whose topic is
    the same for every publisher: its engine id and rank.
    """
    if isinstance(message, StatsFrame):
        return message.engine_id.encode(), message.rank
    return message.topic, message.batch.rank


def _heard(state: PublisherState) -> None:
    state.frames += 1
    state.last_frame_at = time.time()


def _skipped(counts: PublisherState | ListenerState, exc: Exception) -> None:
    """Count a frame skipped; log it only when the fault is the sidecar's own.

    A ``ValueError`` (``MalformedFrame``, msgspec's decode errors) is the
    sender's bytes, which came from the network and are not printed; anything
    else is a bug here, logged with its traceback.
    """
    counts.malformed += 1
    if isinstance(exc, ValueError):
        logger.debug("skipped a malformed frame from %s (%s)", counts.name, type(exc).__name__)
    else:
        logger.error("dropped a frame from %s", counts.name, exc_info=exc)
