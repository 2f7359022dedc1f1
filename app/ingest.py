"""Subscribing to publishers: kvscope workers and vLLM's own KV-event publisher.

One thread owns every SUB socket (ZMQ sockets are not thread-safe) and applies
what arrives to the sidecar's state, publisher by publisher, in sequence order:
gaps are filled from the publisher's replay socket, a sequence that goes back
resets that publisher's view, malformed frames are counted and skipped. A stats
frame updates the publisher's totals and rates right when it arrives.
"""

from __future__ import annotations

import logging
import threading
import time

import msgspec
import zmq

from app.decode import DecodedBatch, decode_kv_payload
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

POLL_MS = 100
"""How often the thread looks at its stop flag when no frame arrives."""


class Ingestor:
    """Subscribes to every publisher and keeps the sidecar's state current."""

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
            sock = self._ctx.socket(zmq.SUB)
            for topic in {kv_topic, stats_topic}:
                sock.setsockopt(zmq.SUBSCRIBE, topic)
            sock.connect(publisher.endpoints.endpoint)
            self._sockets[sock] = publisher
        self._thread = threading.Thread(target=self._run, name="kvscope-ingest", daemon=True)

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
        while not self._stop.is_set():
            for sock, _ in poller.poll(POLL_MS):
                state = self._sockets[sock]
                try:
                    self._on_frame(state, sock.recv_multipart())
                except Exception:  # a publisher's bad frame must not stop the others
                    state.malformed += 1
                    logger.exception("dropped a frame from %s", state.endpoints.name)

    def _on_frame(self, state: PublisherState, frames: list[bytes]) -> None:
        state.frames += 1
        state.last_frame_at = time.time()
        if len(frames) != 3:
            raise MalformedFrame(f"expected [topic, seq, payload], got {len(frames)} frames")
        topic, seq_bytes, payload = frames
        if topic == self._stats_topic and topic != self._kv_topic:
            self._on_stats(state, decode_stats_frame(payload))
            return
        seq = decode_seq(seq_bytes)
        batch = decode_kv_payload(payload)
        if state.last_seq is not None and seq <= state.last_seq:
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
                    self.state.index.set_block_bytes(state.endpoints.name, medium, size)
        state.stats_frames += 1

    def _restart(self, state: PublisherState) -> None:
        """The publisher's sequence went back: forget what it told us before."""
        state.restarts += 1
        state.last_seq = None
        with self.state.lock:
            self.state.index.reset_publisher(state.endpoints.name)

    def _fill(self, state: PublisherState, first: int, upto: int) -> None:
        """Apply batches first..upto-1 from the replay socket; count what it lacks."""
        is_gap = state.last_seq is not None
        state.gaps += is_gap
        recovered = 0
        for seq, batch in self._replay(state, first):
            if first <= seq < upto:
                self._apply(state, seq, batch)
                recovered += 1
        if is_gap:
            state.missed += (upto - first) - recovered

    def _replay(self, state: PublisherState, start: int) -> list[tuple[int, DecodedBatch]]:
        """Ask the publisher's replay socket for every batch from ``start`` on."""
        if state.endpoints.replay_endpoint is None:
            return []
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(state.endpoints.replay_endpoint)
        answers: list[tuple[int, DecodedBatch]] = []
        try:
            dealer.send_multipart(replay_request(start))
            while dealer.poll(self._replay_timeout_ms):
                frames = dealer.recv_multipart()
                if len(frames) != 4:
                    raise MalformedFrame(f"replay answer of {len(frames)} frames")
                _, _, seq_bytes, payload = frames
                if seq_bytes == END_OF_REPLAY_SEQ:
                    break
                answers.append((decode_seq(seq_bytes), decode_kv_payload(payload)))
                state.replayed += 1
        except (MalformedFrame, msgspec.DecodeError):
            state.malformed += 1
            logger.warning("bad replay answer from %s", state.endpoints.name)
        finally:
            dealer.close()
        return answers

    def _apply(self, state: PublisherState, seq: int, batch: DecodedBatch) -> None:
        with self.state.lock:
            self.state.index.apply(state.endpoints.name, batch, time.time())
        state.last_seq = seq
        state.batches_applied += 1
        state.malformed += batch.malformed
        self.state.event_log.record(state.endpoints.name, seq, batch)
