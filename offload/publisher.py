"""Publish KV events (vLLM's wire format) and stats frames over ZMQ, never blocking.

The caller is vLLM's scheduler thread, whose every millisecond is a token's
latency, so ``publish_*`` does no encoding and no I/O: it appends to a bounded
in-memory queue and returns. One background thread owns both sockets and does
all the work: encoding, sequence numbering, sending, and answering replay
requests.

Wire format (vLLM's, so vLLM's consumers read ours unchanged):

- PUB socket, one multipart message per batch:
  ``[topic, seq (8-byte big-endian), msgpack payload]``. KV event batches go on
  ``kv_topic`` with sequence numbers 0, 1, 2, ... with no gaps; stats frames go
  on ``stats_topic`` with a sequence counter of their own.
- ROUTER replay socket (optional): a DEALER client sends an empty delimiter
  frame and then the first sequence number it wants as 8 bytes, big-endian
  (a REQ socket sends the same, but its state machine lets it read only the
  first answer, so it suits only replays of one frame). The ROUTER sees
  ``[identity, b"", seq]`` and answers, per buffered KV batch from that
  sequence on, ``[identity, b"", kv_topic, seq, payload]``, then the end marker
  ``[identity, b"", b"", seq -1 (8 bytes, signed), b""]``. A client therefore
  receives ``[topic, seq, payload]`` frames (after an empty delimiter frame
  with DEALER) until the sequence reads -1. A request that is not exactly one
  8-byte frame gets the end marker alone.

Where frames can be lost, and how that shows:

- The queue is bounded: when a burst outruns the thread, the *oldest* queued
  frame is dropped and counted in ``dropped``. Sequence numbers are assigned
  when a batch is sent, so a queue drop leaves no gap; ``dropped`` (export it
  in the stats frames) is the signal.
- ZMQ itself drops for a subscriber whose high-water mark is reached; a send
  the socket refuses (``zmq.Again``) is counted in ``dropped`` too. Such a KV
  batch still has its sequence number and stays in the replay buffer, so a
  subscriber sees the gap and can replay it.

Topics are prefix-matched by ZMQ subscribers: a subscriber of the default KV
topic ``b""`` (vLLM's default) receives the stats topic as well. Consumers
that decode everything as ``KVEventBatch`` should subscribe to a non-empty
``kv_topic`` that is not a prefix of ``stats_topic``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from contextlib import suppress
from itertools import islice
from types import TracebackType
from typing import Self

import zmq

from offload.events import OffloadingEvent
from offload.kv_events import DEFAULT_KV_TOPIC, KVEventBatch, encode_batch, to_kv_events
from offload.stats_frame import DEFAULT_STATS_TOPIC, StatsFrame, encode_stats_frame

logger = logging.getLogger(__name__)

END_OF_REPLAY_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends every replay answer."""

_CLOSE_LINGER_MS = 200
"""How long close() lets ZMQ flush already-sent frames to connected peers."""

_KVItem = tuple[float, list[OffloadingEvent]]
"""A queued KV publish: the wall-clock time of the call and the manager's events."""


def _seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def _replay_start(frames: list[bytes]) -> int | None:
    """The requested first sequence of a ROUTER-received request, or None if malformed."""
    if len(frames) == 3 and frames[1] == b"" and len(frames[2]) == 8:
        return int.from_bytes(frames[2], "big")
    return None


class EventPublisher:
    """A ZMQ PUB (+ optional ROUTER replay) publisher with a background thread.

    Endpoints are bound, never connected. A wildcard port (``tcp://127.0.0.1:*``)
    binds a free port; ``endpoint`` and ``replay_endpoint`` report what was bound.

    Counters (plain ints, read from any thread): ``batches_published`` and
    ``stats_published`` (frames handed to the PUB socket), ``dropped`` (frames
    that never reached it), ``replay_requests`` (every request received) and
    ``malformed_replay_requests`` (those answered with the end marker alone).
    """

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        *,
        kv_topic: bytes = DEFAULT_KV_TOPIC,
        stats_topic: bytes = DEFAULT_STATS_TOPIC,
        buffer_steps: int = 10_000,
        max_queue_size: int = 10_000,
        hwm: int = 100_000,
        data_parallel_rank: int | None = None,
    ) -> None:
        if kv_topic == stats_topic:
            raise ValueError(f"kv_topic and stats_topic must differ, both are {kv_topic!r}")
        for name, value in (("buffer_steps", buffer_steps), ("max_queue_size", max_queue_size)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.batches_published = 0
        self.stats_published = 0
        self.dropped = 0
        self.replay_requests = 0
        self.malformed_replay_requests = 0

        self._kv_topic = kv_topic
        self._stats_topic = stats_topic
        self._rank = data_parallel_rank
        self._kv_seq = 0
        self._stats_seq = 0
        self._history: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._pending: deque[_KVItem | StatsFrame] = deque()
        self._max_pending = max_queue_size
        self._lock = threading.Lock()
        self._closed = False

        self._ctx = zmq.Context(io_threads=1)
        try:
            self._pub, self._endpoint = self._bind(zmq.PUB, endpoint, hwm)
            self._replay, self._replay_endpoint = (
                # A full replay plus its end marker must fit under the ROUTER's HWM, which
                # ZMQ only frees in steps of half of it: hence twice the buffer.
                self._bind(zmq.ROUTER, replay_endpoint, 2 * (buffer_steps + 1))
                if replay_endpoint is not None
                else (None, None)
            )
        except zmq.ZMQError:
            self._ctx.destroy(linger=0)
            raise
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="kvscope-publisher", daemon=True)
        self._thread.start()

    def _bind(self, kind: int, endpoint: str, hwm: int) -> tuple[zmq.Socket, str]:
        """A bound socket and the endpoint it actually bound (wildcards resolved).

        Sockets are made here so that bind errors reach the constructor's
        caller; from the thread's start on, only the thread touches them.
        """
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.LINGER, _CLOSE_LINGER_MS)
        sock.bind(endpoint)
        return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def endpoint(self) -> str:
        """The PUB endpoint as bound, e.g. ``tcp://127.0.0.1:41231``."""
        return self._endpoint

    @property
    def replay_endpoint(self) -> str | None:
        """The ROUTER replay endpoint as bound, or None without replay."""
        return self._replay_endpoint

    # --- caller side: never blocks on I/O --------------------------------------

    def publish_events(self, events: list[OffloadingEvent]) -> None:
        """Queue the manager's events as one KV event batch (none if empty).

        The list is handed over: the caller must not mutate it afterwards.
        """
        if events:
            self._enqueue((time.time(), events))

    def publish_stats(self, frame: StatsFrame) -> None:
        """Queue a stats frame for its own topic."""
        self._enqueue(frame)

    def _enqueue(self, item: _KVItem | StatsFrame) -> None:
        """Append under a short lock, dropping (and counting) the oldest when full.

        The lock makes the drop count exact: between a length check and an
        append the thread may pop, and a bare ``deque(maxlen=...)`` drops
        without telling. The wake-up write happens only when the queue turns
        non-empty, so a burst costs one syscall, not one per frame.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("publisher is closed")
            if not self._pending:
                self._wake()
            elif len(self._pending) == self._max_pending:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(item)

    def _wake(self) -> None:
        """Make the thread's poll return; called with the lock held so that
        close() cannot close the pipe between a check and the write."""
        with suppress(BlockingIOError):  # a full pipe: wake-ups are already pending
            os.write(self._wake_w, b"\0")

    def close(self) -> None:
        """Send what is queued, stop the thread and release the sockets. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake()
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._ctx.term()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- background thread: sole user of the sockets ---------------------------

    def _run(self) -> None:
        """Sleep in poll until a wake-up or a replay request; no timeout, no spinning."""
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._wake_r in ready:
                    self._drain_wakeups()
                if self._replay is not None and self._replay in ready:
                    try:
                        self._serve_replay()
                    except Exception:  # replay is best effort; publishing must go on
                        logger.exception("kvscope publisher could not answer a replay request")
                if self._send_pending():
                    return
        except Exception:
            logger.exception("kvscope publisher thread stopped; frames will be dropped")
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _drain_wakeups(self) -> None:
        with suppress(BlockingIOError):  # a spurious wake-up: nothing to read
            os.read(self._wake_r, 65536)

    def _send_pending(self) -> bool:
        """Send queued frames until the queue is empty; True once close() was called."""
        while True:
            with self._lock:
                if not self._pending:
                    return self._closed
                item = self._pending.popleft()
            try:
                self._send(item)
            except Exception:
                logger.exception("kvscope publisher could not send a frame; dropped")
                self._count_drop()

    def _send(self, item: _KVItem | StatsFrame) -> None:
        if isinstance(item, StatsFrame):
            self._send_stats(item)
        else:
            self._send_batch(*item)

    def _send_stats(self, frame: StatsFrame) -> None:
        payload = encode_stats_frame(frame)
        seq, self._stats_seq = self._stats_seq, self._stats_seq + 1
        if self._publish(self._stats_topic, seq, payload):
            self.stats_published += 1

    def _send_batch(self, ts: float, events: list[OffloadingEvent]) -> None:
        """Number, buffer for replay, then send: a refused send stays replayable."""
        batch = KVEventBatch(ts=ts, events=to_kv_events(events), data_parallel_rank=self._rank)
        payload = encode_batch(batch)
        seq, self._kv_seq = self._kv_seq, self._kv_seq + 1
        self._history.append((seq, payload))
        if self._publish(self._kv_topic, seq, payload):
            self.batches_published += 1

    def _publish(self, topic: bytes, seq: int, payload: bytes) -> bool:
        """Hand one frame to the PUB socket without waiting; False (counted) if refused."""
        try:
            self._pub.send_multipart((topic, _seq_bytes(seq), payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            self._count_drop()
            return False
        return True

    def _count_drop(self) -> None:
        with self._lock:
            self.dropped += 1

    def _serve_replay(self) -> None:
        """Answer one replay request: buffered KV batches from its sequence on, then the end."""
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        self.replay_requests += 1
        identity = frames[0]
        start = _replay_start(frames)
        if start is None:
            self.malformed_replay_requests += 1
            logger.warning("malformed replay request (%d frames); sent the end marker", len(frames))
        else:
            for seq, payload in self._history_from(start):
                self._replay_send((identity, b"", self._kv_topic, _seq_bytes(seq), payload))
        self._replay_send((identity, b"", b"", END_OF_REPLAY_SEQ, b""))

    def _replay_send(self, frames: tuple[bytes, ...]) -> None:
        # A ROUTER drops (never blocks) for a gone or saturated peer.
        assert self._replay is not None
        self._replay.send_multipart(frames, flags=zmq.NOBLOCK)

    def _history_from(self, start: int) -> Iterable[tuple[int, bytes]]:
        """Buffered batches with sequence >= start; the buffer's sequences are contiguous."""
        skip = start - self._history[0][0] if self._history else 0
        if skip >= len(self._history):
            return ()
        return islice(self._history, max(0, skip), None)
