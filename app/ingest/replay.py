"""One gap being filled from a publisher's replay socket, on the ingest thread's schedule.

A replay used to be a loop inside the ingest thread: a replay socket that
answered slowly (one batch every half second, never the end marker) held
every other publisher for as long as it liked, and a silent one cost every
publisher two seconds per gap. Now a replay is a DEALER socket registered in
the ingest thread's poller beside the others: each answer is applied as it
arrives, between other publishers' frames; the publisher's own live KV frames
wait meanwhile in a queue bounded in bytes (``hold_bytes``; one arriving past
it is dropped and counted, and shows as a gap once the replay is over); and
the replay ends, counted by outcome (``ReplayOutcome``), at its end marker,
after ``timeout_s`` without an answer, at an overall ``deadline_s``, past
``max_bytes`` of answers, or at the first answer that breaks the protocol.
"""

from __future__ import annotations

import time
from collections import deque
from typing import NamedTuple

import zmq

from app.decode import DecodedBatch
from app.ingest.sockets import receiving_socket
from app.settings import IngestConfig
from app.state.publisher import PublisherState, ReplayOutcome
from offload.wire.framing import END_OF_REPLAY_SEQ, MalformedFrame, decode_seq, replay_request

HELD_FRAME_OVERHEAD = 160
"""Bytes a held frame takes beyond its topic and payload: its tuple, its sequence number, two
bytes objects' headers and its queue slot (108 to 141 B measured with tracemalloc on CPython
3.11, rounded up for the allocator's padding). Charged with each frame, so that frames with
empty payloads cannot fill memory at no cost against ``replay_hold_bytes``."""


class KVFrame(NamedTuple):
    """A KV message as received: its topic, sequence number and undecoded payload."""

    topic: bytes
    seq: int
    payload: bytes


class Answer(NamedTuple):
    """One batch of a replay's answer, undecoded."""

    seq: int
    payload: bytes


class Replay:
    """Batches ``first .. upto-1`` asked of ``state``'s replay socket; ``trigger`` is ``upto``.

    ``trigger`` is the frame that showed the gap, applied once the replay
    ends; None for a replay of frames dropped while held (nothing showed that
    gap but the drop itself). ``is_gap`` is False for a catch-up (a
    publisher's first frame above 0), whose missing batches are not counted
    as missed. ``ipv6``: whether the socket connects with ZMQ's IPv6 option
    (``connects_ipv6``, decided before, as it may wait on DNS). The ingest
    thread owns it.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        state: PublisherState,
        endpoint: str,
        ipv6: bool,
        config: IngestConfig,
        *,
        first: int,
        upto: int,
        trigger: tuple[int, DecodedBatch] | None,
        is_gap: bool,
    ) -> None:
        self.state = state
        self.first = first
        self.upto = upto
        self.trigger = trigger
        self.is_gap = is_gap
        self.wanted = first
        """The next sequence number the answer may bring; every accepted answer raises it."""
        self.applied = 0
        self.received_bytes = 0
        self.held: deque[KVFrame] = deque()
        self.held_bytes = 0
        self.dropped_last: int | None = None
        """The sequence number of the last live frame dropped for want of room, if any."""
        self._config = config
        now = time.monotonic()
        self._deadline = now + config.replay_deadline_s
        self._quiet_until = now + config.replay_timeout_s
        self.socket = receiving_socket(ctx, zmq.DEALER, config)
        try:  # a ZMQError when ZMQ refuses the endpoint: the caller cannot close what it lacks
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.ipv6 = ipv6
            self.socket.connect(endpoint)
            self.socket.send_multipart(replay_request(first), flags=zmq.NOBLOCK)
        except BaseException:
            self.close()
            raise

    @property
    def missing(self) -> int:
        """Batches of the range not applied (yet): what is missed if the replay ended now."""
        return (self.upto - self.first) - self.applied

    def hold(self, frame: KVFrame) -> bool:
        """Keep a live frame of the publisher for after the replay; False when over the bound.

        A frame costs its bytes and its overhead (``HELD_FRAME_OVERHEAD``), so the bound
        bounds memory, however small the frames.
        """
        size = len(frame.topic) + len(frame.payload) + HELD_FRAME_OVERHEAD
        if self.held_bytes + size > self._config.replay_hold_bytes:
            self.dropped_last = frame.seq
            return False
        self.held.append(frame)
        self.held_bytes += size
        return True

    def expired(self, now: float) -> ReplayOutcome | None:
        """ "deadline" or "timeout" once the replay has run out of time, else None."""
        if now >= self._deadline:
            return "deadline"
        if now >= self._quiet_until:
            return "timeout"
        return None

    def receive(self) -> Answer | ReplayOutcome | None:
        """The next answer, the outcome that ends the replay, or None when none is waiting.

        The outcome is "complete" at the end marker, "malformed" for an answer
        that breaks the protocol (or whose sequence number does not rise), and
        "oversize" once the answers pass ``replay_max_bytes``. An answer beyond
        the range is the publisher's newer batch: the range is done ("complete").
        """
        try:
            frames = self.socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        self._quiet_until = time.monotonic() + self._config.replay_timeout_s
        if len(frames) != 4 or frames[0] != b"":
            return "malformed"
        _, _, seq_frame, payload = frames
        if seq_frame == END_OF_REPLAY_SEQ:
            return "complete"
        try:
            seq = decode_seq(seq_frame)
        except MalformedFrame:
            return "malformed"
        self.received_bytes += sum(map(len, frames))  # a topic of megabytes is as costly
        if self.received_bytes > self._config.replay_max_bytes:
            return "oversize"
        if seq < self.wanted:
            return "malformed"
        if seq >= self.upto:
            return "complete"
        self.wanted = seq + 1
        return Answer(seq, payload)

    def close(self) -> None:
        self.socket.close(linger=0)
