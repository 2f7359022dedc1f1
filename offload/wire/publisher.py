"""Publish KV events (vLLM's wire format) and stats frames over ZMQ, never blocking.

The caller is vLLM's scheduler thread, where every millisecond is a token's
latency, so ``publish_*`` only queues; the call that notices a flush is due
(every ``flush_interval``) sends everything queued as one batch, and a
background thread picks up what quiet callers left and answers replay
requests. docs/PROTOCOL.md describes the wire exchange and how drops are
counted; docs/ARCHITECTURE.md why the caller, not a thread, encodes.

Memory is bounded in bytes, not only in messages, because ZMQ's high-water
marks count messages: payloads go to ZMQ without a copy (``copy=False``),
so a subscriber's queue and every replay answer share the replay buffer's
bytes instead of copying them, and ZMQ tells (``MessageTracker``) when it is
done with each one. What ZMQ still holds is then known in bytes and capped
(``ZmqHeld``): ``queue_bytes`` for the PUB socket, ``replay_budget_bytes``
for all replay answers together, ``replay_max_bytes`` for one.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from itertools import islice

import zmq
import zmq.utils.garbage  # registers pyzmq's exit hook now: see EventPublisher.__init__

from offload.base import Closeable, OffloadingEvent
from offload.wire.batch_bounds import bounded_batches
from offload.wire.endpoints import binds_ipv6
from offload.wire.framing import (
    DEFAULT_KV_TOPIC,
    DEFAULT_SAMPLE_TOPIC,
    DEFAULT_STATS_TOPIC,
    END_OF_REPLAY_SEQ,
    encode_seq,
    parse_replay_request,
)
from offload.wire.heartbeat import set_heartbeat
from offload.wire.kv_events import KVEventBatch, encode_batch, to_kv_events
from offload.wire.log_limit import LogLimiter
from offload.wire.sample_frame import SendableSampleFrame, encode_sample_frame
from offload.wire.stats_frame import StatsFrame, encode_stats_frame
from offload.wire.zmq_held import PayloadKey, ZmqHeld

logger = logging.getLogger(__name__)
_log = LogLimiter(logger)

_CLOSE_LINGER_MS = 200
"""How long close() lets ZMQ flush already-sent frames to connected peers."""

PEER_TIMEOUT_S = 15.0
"""How long a connected peer may leave ZMTP's keep-alive unanswered before it is cut.

A subscriber that stops reading fills its pipe, and with ``XPUB_NODROP`` every send is then
refused, for every subscriber, until that pipe drains: one deaf peer starved the healthy
ones for as long as it stayed connected. Such a peer stops answering the PINGs queued
behind the data it does not read, so ZMQ closes its connection, its held messages are
released and the others' frames flow again (a peer that reconnects and stays deaf is cut
again)."""

MIN_SUBSCRIPTION_TOPIC = 255
"""The longest topic prefix a subscriber may subscribe to, unless a topic is longer: the PUB
socket took frames of any size from anyone who connected (a 50 MiB "subscription" was 50
MiB of the worker's memory); ZMQ now drops a peer that sends a longer one before reading
it in."""

MAX_REPLAY_REQUEST_FRAME = 64
"""The largest frame the replay socket takes; a request's frames are 0 and 8 bytes."""

REPLAY_MESSAGE_OVERHEAD = 2048
"""Bytes one replay message costs while ZMQ holds it, beside the payload it shares: its five
frames in the ROUTER's pipe and the zero-copy frame and tracker pyzmq keeps for the payload
(1,751 B measured per held message, pyzmq 27 and libzmq 4.3.5). Charged against
``replay_budget_bytes`` for every message of an answer, since the shared payload alone let
peers that never read hold 10,000 messages each for free."""

PUB_MESSAGE_OVERHEAD = 2304
"""Bytes one PUB message costs while ZMQ holds it for a subscriber, beside its payload: its
three frames in the pipe, the zero-copy frame and tracker pyzmq keeps, and its entry in
``ZmqHeld`` (2,290 B measured per held message, pyzmq 27 and libzmq 4.3.5). Charged against
``queue_bytes`` for every message, since a flush's batch is often ~100 bytes: charged its
payload alone, a subscriber that never read held 100,000 of them (the high-water mark) and
grew the worker by 212 MiB within a 64 MiB bound, nothing dropped."""


HEARTBEAT_S = 5.0
"""Longest a live publisher with a stats source goes without a stats frame (``keep_alive``):
the sidecar's lag gauge then tells a quiet engine (a frame every few seconds) from a dead
or unreachable one (none for a minute)."""

_now = time.monotonic


class BindError(zmq.ZMQError):
    """ZMQ could not bind ``endpoint``: a publisher binds two, and a caller must say which."""

    def __init__(self, endpoint: str, cause: zmq.ZMQError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.endpoint = endpoint


class Publisher(Closeable):
    """Where a worker's KV events and stats frames go, and what became of them.

    The counters are plain ints, read from any thread: ``batches_published``
    and ``stats_published`` (frames handed on), ``dropped`` (frames that
    never were), ``replays_served`` (of which ``truncated_replays`` were cut
    short), ``malformed_replay_requests``, ``refused_replay_requests`` and
    ``unsendable_events`` (left out of their batch: msgpack cannot carry one of
    their hashes).
    """

    batches_published: int
    stats_published: int
    replays_served: int
    malformed_replay_requests: int
    refused_replay_requests: int
    truncated_replays: int
    unsendable_events: int

    @property
    @abstractmethod
    def dropped(self) -> int:
        """Frames that never reached a subscriber's socket."""

    @abstractmethod
    def publish_events(self, events: list[OffloadingEvent]) -> None:
        """Queue the manager's events for the next batch; never waits."""

    @abstractmethod
    def publish_stats(self, frame: StatsFrame) -> None:
        """Queue a stats frame; never waits."""

    @abstractmethod
    def publish_sample(self, frame: SendableSampleFrame) -> None:
        """Queue a sample frame (offload/wire/sample_frame.py); never waits."""

    def keep_alive(self, beat: Callable[[], None]) -> None:
        """Call ``beat`` (which publishes a stats frame) whenever no stats frame has gone out
        for a while (a publisher that sends nothing has nothing to keep alive)."""


class NullPublisher(Publisher):
    """No endpoint configured: events and frames are dropped unread, at no cost.

    Its counters stay 0: nothing was published, and nothing was lost that a
    consumer could have had.
    """

    batches_published = stats_published = replays_served = 0
    malformed_replay_requests = refused_replay_requests = unsendable_events = 0
    truncated_replays = 0

    @property
    def dropped(self) -> int:
        return 0

    def publish_events(self, events: list[OffloadingEvent]) -> None:
        pass

    def publish_stats(self, frame: StatsFrame) -> None:
        pass

    def publish_sample(self, frame: SendableSampleFrame) -> None:
        pass

    def close(self) -> None:
        pass


class EventPublisher(Publisher):
    """A ZMQ PUB (+ optional ROUTER replay) publisher that its callers flush.

    Endpoints are bound, never connected. A wildcard port (``tcp://127.0.0.1:*``)
    binds a free port; ``endpoint`` and ``replay_endpoint`` report what was bound.

    The replay buffer keeps the newest KV batches: at most ``buffer_steps`` of
    them (vLLM's setting and default) and at most ``buffer_bytes`` of payload,
    the newest batch always. The byte bound matters because a batch here is a
    flush interval of events, not one scheduler step, so ``buffer_steps`` of
    them could hold far more than a consumer needs.

    What ZMQ holds is bounded in bytes (see the module doc). A frame the PUB
    socket's queue has no room for (``queue_bytes`` held for a subscriber that
    stopped reading) is refused like one past the high-water mark, and
    counted in ``dropped``; a peer that leaves ZMTP's PINGs unanswered for
    ``peer_timeout_s`` is disconnected, which releases what ZMQ held for it.
    A replay request that finds ``replay_budget_bytes`` already held by
    answers, or comes from a peer whose previous answer ZMQ still holds (a
    peer that does not read), gets the end marker alone and is
    counted in ``refused_replay_requests``; an answer stops (its end marker
    follows) before ``replay_max_bytes`` of payload or the budget, counted in
    ``truncated_replays``, and the asker counts the rest as missed. Answers
    are charged each message's overhead (``REPLAY_MESSAGE_OVERHEAD``) as well
    as the payloads they share, so the budget bounds how many are held.

    Sample frames (the sampled access stream) go on ``sample_topic``, numbered
    by a counter of their own and never buffered for replay: a lost one is a
    gap its reader counts. They are encoded when queued, so their queue is
    bounded in bytes (``sample_queue_bytes``; past it the oldest is dropped,
    counted in ``samples_dropped`` and ``dropped``).

    Counters (plain ints, read from any thread): ``batches_published`` and
    ``stats_published`` (frames handed to the PUB socket), ``dropped`` (frames
    that never reached it), ``replays_served`` (replay requests answered with
    batches), ``malformed_replay_requests`` and ``refused_replay_requests``
    (those answered with the end marker alone); ``replay_requests`` is their
    sum; ``truncated_replays`` (served answers cut short). Each counter is
    raised once per frame or request, never raised and then corrected, so a
    reader on another thread sees every one of them only rise.
    """

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        *,
        kv_topic: bytes = DEFAULT_KV_TOPIC,
        stats_topic: bytes = DEFAULT_STATS_TOPIC,
        sample_topic: bytes = DEFAULT_SAMPLE_TOPIC,
        buffer_steps: int = 10_000,
        buffer_bytes: int = 64 * 2**20,
        max_queue_size: int = 10_000,
        hwm: int = 100_000,
        flush_interval: float = 0.01,
        data_parallel_rank: int | None = None,
        queue_bytes: int = 64 * 2**20,
        replay_max_bytes: int | None = None,
        replay_budget_bytes: int | None = None,
        sample_queue_bytes: int = 16 * 2**20,
        heartbeat_s: float = HEARTBEAT_S,
        peer_timeout_s: float = PEER_TIMEOUT_S,
    ) -> None:
        if kv_topic == stats_topic:
            raise ValueError(f"kv_topic and stats_topic must differ, both are {kv_topic!r}")
        if sample_topic in (kv_topic, stats_topic):
            raise ValueError(f"sample_topic must differ from the other topics: {sample_topic!r}")
        replay_max_bytes = buffer_bytes if replay_max_bytes is None else replay_max_bytes
        if replay_budget_bytes is None:
            replay_budget_bytes = 2 * (buffer_bytes + buffer_steps * REPLAY_MESSAGE_OVERHEAD)
        for name, value in (
            ("buffer_steps", buffer_steps),
            ("buffer_bytes", buffer_bytes),
            ("max_queue_size", max_queue_size),
            ("queue_bytes", queue_bytes),
            ("replay_max_bytes", replay_max_bytes),
            ("replay_budget_bytes", replay_budget_bytes),
            ("sample_queue_bytes", sample_queue_bytes),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if not 0 < flush_interval <= 10:
            raise ValueError(f"flush_interval must be in (0, 10] seconds, got {flush_interval}")
        if not 0 < heartbeat_s <= 3600:
            raise ValueError(f"heartbeat_s must be in (0, 3600] seconds, got {heartbeat_s}")
        if not 0.1 <= peer_timeout_s <= 3600:
            raise ValueError(f"peer_timeout_s must be in [0.1, 3600] seconds, got {peer_timeout_s}")
        self.batches_published = 0
        self.events_published = 0
        self.stats_published = 0
        self.samples_published = 0
        self.samples_dropped = 0
        self.replays_served = 0
        self.malformed_replay_requests = 0
        self.refused_replay_requests = 0
        self.truncated_replays = 0
        self.unsendable_events = 0
        # One writer each (the callers of publish_events, of publish_stats, the
        # holder of _sending), so the counts stay exact without another lock.
        self._dropped_kv = 0
        self._dropped_stats = 0
        self._refused = 0

        self._kv_topic = kv_topic
        self._stats_topic = stats_topic
        self._sample_topic = sample_topic
        self._rank = data_parallel_rank
        self._kv_seq = 0
        self._stats_seq = 0
        self._sample_seq = 0
        self._history: deque[tuple[int, bytes]] = deque()
        self._history_bytes = 0
        self._max_history = buffer_steps
        self._max_history_bytes = buffer_bytes
        self._pending_kv: deque[list[OffloadingEvent]] = deque()
        self._pending_stats: deque[StatsFrame] = deque()
        # Encoded payloads, so the queue is bounded in bytes; a lock of its own, taken
        # once per sample frame (a few per second), keeps the byte count exact.
        self._pending_samples: deque[bytes] = deque()
        self._pending_sample_bytes = 0
        self._sample_queue_bytes = sample_queue_bytes
        self._samples_lock = threading.Lock()
        self._max_pending = max_queue_size
        self._flush_at = max(1, max_queue_size // 2)
        self._interval = flush_interval
        self._next_flush = _now() + flush_interval
        self._heartbeat: Callable[[], None] | None = None
        self._heartbeat_s = heartbeat_s
        self._next_heartbeat = _now() + heartbeat_s
        # Held by whoever flushes: it owns the PUB socket, the sequence numbers
        # and the replay buffer. Callers only ever try it; the thread waits.
        self._sending = threading.Lock()
        self._closed = False
        self._closing = threading.Lock()
        """Held through ``close``: a second caller waits for the sockets to be released, and
        never closes the wake pipe's descriptors again (by then another file's, maybe)."""
        # What ZMQ holds of the payloads handed to it: the PUB socket's (under
        # _sending) and the replay answers' (on the background thread).
        self._pub_held = ZmqHeld(ordered=True)
        self._queue_bytes = queue_bytes
        self._replay_held = ZmqHeld()
        self._replay_max_bytes = replay_max_bytes
        self._replay_budget_bytes = replay_budget_bytes
        self._answering: dict[bytes, int] = {}  # peer identity -> its latest answer's key

        self._ctx = zmq.Context(io_threads=1)
        self._peer_timeout_s = peer_timeout_s
        try:
            # What a subscriber sends is a subscription: a topic prefix behind a flag byte
            # or ZMTP 3.1's SUBSCRIBE command (its name and the name's length: 10 bytes).
            longest = max(
                MIN_SUBSCRIPTION_TOPIC, len(kv_topic), len(stats_topic), len(sample_topic)
            )
            self._pub, self._endpoint = self._bind(zmq.PUB, endpoint, hwm, 16 + longest)
            self._pub.setsockopt(zmq.XPUB_NODROP, 1)
            self._replay, self._replay_endpoint = (
                # A full replay plus its end marker must fit under the ROUTER's HWM, which
                # ZMQ only frees in steps of half of it: hence twice the buffer.
                # A request's largest frame is its 8-byte sequence number: ZMQ drops a peer
                # that sends more before reassembling it in the worker's memory (but not one
                # that sends many small frames: ZMQ bounds frames, not their number).
                self._bind(
                    zmq.ROUTER, replay_endpoint, 2 * (buffer_steps + 1), MAX_REPLAY_REQUEST_FRAME
                )
                if replay_endpoint is not None
                else (None, None)
            )
        except zmq.ZMQError:
            self._ctx.destroy(linger=0)
            raise
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._thread = threading.Thread(target=self._run, name="kvscope-publisher", daemon=True)
        self._thread.start()
        # Closed at exit if still open (no shutdown hook ran): its thread kept sending
        # zero-copy frames while pyzmq stopped the garbage thread they need, and the
        # process aborted (SIGABRT, "terminate called without an active exception") in
        # half the runs. Exit hooks run last-registered first, and pyzmq registers its own
        # when zmq.utils.garbage is first imported (lazily, at the first zero-copy send,
        # so after this one): it is imported above, for this one to run first.
        atexit.register(self.close)

    def _bind(
        self, kind: int, endpoint: str, hwm: int, max_frame: int = -1
    ) -> tuple[zmq.Socket, str]:
        """A bound socket and the endpoint it actually bound (wildcards resolved);
        ``max_frame``: the largest frame it takes in (-1: any), set before binding, since
        ZMQ gives a listener's connections the options it had when it bound.

        Sockets are made here so that bind errors reach the constructor's caller, as a
        ``BindError`` naming the endpoint.
        """
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
        sock.setsockopt(zmq.LINGER, _CLOSE_LINGER_MS)
        set_heartbeat(sock, self._peer_timeout_s)
        sock.copy_threshold = 0  # payloads sent copy=False are never copied, so all are tracked
        sock.ipv6 = binds_ipv6(endpoint)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise BindError(endpoint, exc) from exc
        return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def endpoint(self) -> str:
        """The PUB endpoint as bound, e.g. ``tcp://127.0.0.1:41231``."""
        return self._endpoint

    @property
    def replay_endpoint(self) -> str | None:
        """The ROUTER replay endpoint as bound, or None without replay."""
        return self._replay_endpoint

    @property
    def replay_requests(self) -> int:
        """Every replay request received, well formed or not."""
        return self.replays_served + self.malformed_replay_requests + self.refused_replay_requests

    @property
    def held_bytes(self) -> int:
        """Bytes ZMQ holds now: payloads for subscribers and replay answers (each counted
        once), and their messages (``PUB_MESSAGE_OVERHEAD``, ``REPLAY_MESSAGE_OVERHEAD`` each)."""
        return self._pub_held.bytes + self._replay_held.bytes

    @property
    def dropped(self) -> int:
        """Publishes dropped from the full queues, plus frames the PUB socket refused."""
        return self._dropped_kv + self._dropped_stats + self.samples_dropped + self._refused

    # --- caller side: never waits ------------------------------------------------

    def publish_events(self, events: list[OffloadingEvent]) -> None:
        """Queue the manager's events for the next batch (nothing if empty).

        The list is handed over: the caller must not mutate it afterwards.
        """
        if events:
            self._dropped_kv += self._enqueue(self._pending_kv, events)

    def publish_stats(self, frame: StatsFrame) -> None:
        """Queue a stats frame for its own topic."""
        self._dropped_stats += self._enqueue(self._pending_stats, frame)

    def publish_sample(self, frame: SendableSampleFrame) -> None:
        """Encode and queue a sample frame for its own topic, the oldest dropped past the bound."""
        if self._closed:
            raise RuntimeError("publisher is closed")
        payload = encode_sample_frame(frame)
        with self._samples_lock:
            pending = self._pending_samples
            pending.append(payload)
            self._pending_sample_bytes += len(payload)
            while len(pending) > 1 and self._pending_sample_bytes > self._sample_queue_bytes:
                self._pending_sample_bytes -= len(pending.popleft())
                self.samples_dropped += 1
        if _now() >= self._next_flush:
            self._flush_unless_busy()

    def keep_alive(self, beat: Callable[[], None]) -> None:
        """Call ``beat`` from the publisher's thread whenever no stats frame has gone out for
        ``heartbeat_s``, then send what it published.

        Stats frames ride the engine's steps, so an idle engine sent none: the
        sidecar could not tell it from a dead one (its lag alert fired on every
        quiet deployment), and the last second of a burst stayed unreported until
        the next request. ``beat`` runs on that thread: it must read what it
        reports as a scrape does, and make and queue its frame in one step with
        the engine's own (``WorkerTelemetry.publish_stats``), so that the queue
        holds frames in the order they were made: the sidecar keeps the newest
        frame it receives, and an older one after it would set counters back.
        """
        self._heartbeat = beat

    def _take_samples(self) -> list[bytes]:
        with self._samples_lock:
            payloads = list(self._pending_samples)
            self._pending_samples.clear()
            self._pending_sample_bytes = 0
        return payloads

    def _enqueue(self, pending: deque, item: object) -> int:
        """Append (first dropping the oldest when full), flush when due; returns drops.

        deque appends and pops are atomic, so the queue needs no lock: if a
        flush empties it between the length check and the pop, nothing is
        dropped and nothing is counted.
        """
        if self._closed:
            raise RuntimeError("publisher is closed")
        drops = 0
        if len(pending) >= self._max_pending:
            with suppress(IndexError):
                pending.popleft()
                drops = 1
        pending.append(item)
        if _now() >= self._next_flush or len(pending) >= self._flush_at:
            self._flush_unless_busy()
        return drops

    def _flush_unless_busy(self) -> None:
        """Flush now, or leave it to whoever is flushing (never wait for them)."""
        if self._sending.acquire(blocking=False):
            try:
                self._flush()
            finally:
                self._sending.release()

    def close(self) -> None:
        """Send what is queued, stop the thread and release the sockets. Idempotent, and
        safe from several threads at once: each returns once the sockets are released.

        A publish racing with close() on another thread may be lost; publishes
        after close() raise.
        """
        with self._closing:
            if self._closed:
                return
            self._closed = True
            atexit.unregister(self.close)  # nor keep this publisher alive until exit
            os.write(self._wake_w, b"\0")
            self._thread.join()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._ctx.term()

    # --- background thread: quiet callers' leftovers and replays ----------------

    def _run(self) -> None:
        """Every interval, flush what no caller flushed; answer replay requests."""
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll(self._interval * 1000))
                closing = self._closed  # read before the flush: the last flush sees all
                if self._replay is not None and self._replay in ready:
                    try:
                        self._serve_replay()
                    except Exception as exc:  # replay is best effort; publishing must go on
                        _log.log(
                            logging.ERROR,
                            "replay-error",
                            "kvscope publisher could not answer a replay request",
                            exc_info=exc,
                        )
                if closing or _now() >= self._next_flush:
                    with self._sending:
                        self._flush()
                if closing:
                    return
                if self._heartbeat is not None and _now() >= self._next_heartbeat:
                    self._beat(self._heartbeat)
        except Exception:
            logger.exception("kvscope publisher thread stopped; later frames are dropped")
        finally:
            with self._sending:
                self._pub.close()
                if self._replay is not None:
                    self._replay.close()

    # --- flushing: under _sending, by a caller or the thread ---------------------

    def _flush(self) -> None:
        """Send every queued KV event, as one batch unless it names more than a batch may
        (``bounded_batches``), then the queued stats frames."""
        self._next_flush = _now() + self._interval
        pending_kv, pending_stats = self._pending_kv, self._pending_stats
        events: list[OffloadingEvent] = []
        while pending_kv:
            events += pending_kv.popleft()
        if events:
            ts = time.time()
            for batch in bounded_batches(events):
                self._guarded(self._send_batch, ts, batch)
        while pending_stats:
            self._guarded(self._send_stats, pending_stats.popleft())
        for payload in self._take_samples():
            self._guarded(self._send_sample, payload)

    def _beat(self, heartbeat: Callable[[], None]) -> None:
        """The heartbeat's frame queued, then sent with everything queued before it."""
        self._next_heartbeat = _now() + self._heartbeat_s  # failing or not, once a period
        try:
            heartbeat()
        except Exception as exc:
            if self._closed:
                return  # closed while it made its frame: nothing is sent after close
            _log.log(
                logging.ERROR, "heartbeat-error", "kvscope publisher could not make a stats frame",
                exc_info=exc,
            )  # fmt: skip
            return
        with self._sending:
            self._flush()

    def _guarded(self, send: Callable[..., None], *args: object) -> None:
        """Send, and never let a failure reach the caller (a scheduler step)."""
        try:
            send(*args)
        except Exception as exc:
            _log.log(
                logging.ERROR, "send-error", "kvscope publisher could not send a frame; dropped",
                exc_info=exc,
            )  # fmt: skip
            self._refused += 1

    def _send_stats(self, frame: StatsFrame) -> None:
        self._next_heartbeat = _now() + self._heartbeat_s
        payload = encode_stats_frame(frame)
        seq, self._stats_seq = self._stats_seq, self._stats_seq + 1
        if self._publish(self._stats_topic, seq, payload):
            self.stats_published += 1

    def _send_sample(self, payload: bytes) -> None:
        seq, self._sample_seq = self._sample_seq, self._sample_seq + 1
        if self._publish(self._sample_topic, seq, payload):
            self.samples_published += 1

    def _send_batch(self, ts: float, events: list[OffloadingEvent]) -> None:
        """Number, buffer for replay, then send: a refused send stays replayable."""
        try:
            payload = self._encoded(ts, events)
        except (OverflowError, TypeError, ValueError):
            # A hash msgpack cannot carry (an int past 64 bits, say) fails the whole batch:
            # the others go without the events that hold one, which are counted.
            events = [event for event in events if self._sendable(ts, event)]
            if not events:
                return
            payload = self._encoded(ts, events)
        seq, self._kv_seq = self._kv_seq, self._kv_seq + 1
        self._remember(seq, payload)
        if self._publish(self._kv_topic, seq, payload):
            self.batches_published += 1
            self.events_published += len(events)

    def _encoded(self, ts: float, events: list[OffloadingEvent]) -> bytes:
        return encode_batch(KVEventBatch(ts, to_kv_events(events), self._rank))

    def _sendable(self, ts: float, event: OffloadingEvent) -> bool:
        """Whether an event encodes on its own; counted in ``unsendable_events`` if not."""
        try:
            self._encoded(ts, [event])
        except (OverflowError, TypeError, ValueError):
            self.unsendable_events += 1
            return False
        return True

    def _remember(self, seq: int, payload: bytes) -> None:
        """Buffer a batch for replay, forgetting the oldest past either bound."""
        history = self._history
        history.append((seq, payload))
        self._history_bytes += len(payload)
        while len(history) > 1 and (
            len(history) > self._max_history or self._history_bytes > self._max_history_bytes
        ):
            self._history_bytes -= len(history.popleft()[1])

    def _publish(self, topic: bytes, seq: int, payload: bytes) -> bool:
        """Hand one frame to the PUB socket without waiting; False (counted) if refused.

        Refused past the high-water mark, or when ZMQ already holds
        ``queue_bytes`` of payloads and their messages' overhead
        (``PUB_MESSAGE_OVERHEAD`` each; a subscriber that stopped reading): the
        payload would wait in memory for it, as every later one would.
        """
        held = self._pub_held
        size = len(payload) + PUB_MESSAGE_OVERHEAD
        if not held.has_room(size, self._queue_bytes):
            self._refused += 1
            return False
        try:
            tracker = _send(self._pub, (topic, encode_seq(seq)), payload)
        except zmq.Again:
            self._refused += 1
            return False
        held.add(tracker, [(("pub", seq, topic), size)])
        return True

    def _serve_replay(self) -> None:
        """Answer one replay request: buffered KV batches from its sequence on, then the end.

        Refused (the end marker alone) when the answers ZMQ holds already take
        ``replay_budget_bytes``, or the peer's previous answer is still held
        (it is not reading); cut short before ``replay_max_bytes`` or the budget.
        """
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        identity = frames[0]
        start = parse_replay_request(frames)
        held = self._replay_held
        held.release_done()
        if start is None:
            self.malformed_replay_requests += 1
            _log.log(
                logging.WARNING,
                "malformed-replay-request",
                f"malformed replay request ({len(frames)} frames); sent the end marker",
            )
        elif held.holds(self._answering.get(identity)) or held.bytes >= self._replay_budget_bytes:
            self.refused_replay_requests += 1
            _log.log(
                logging.WARNING,
                "refused-replay-request",
                "refused a replay request: its peer's last answer or the replay budget is "
                "still held by ZMQ; sent the end marker",
            )
        else:
            self.replays_served += 1
            with self._sending:  # a snapshot: the sends below need no lock
                batches = list(self._history_from(start))
            self._answer(identity, batches)
        self._replay_send((identity, b"", b"", END_OF_REPLAY_SEQ, b""))

    def _answer(self, identity: bytes, batches: list[tuple[int, bytes]]) -> None:
        """Send the batches without copying them, within the per-answer and global byte caps.

        Each message costs its payload, unless another answer holds it already, and its
        overhead; the overheads are held as one more entry of the answer's, numbered by
        ``replays_served``, released with it.
        """
        assert self._replay is not None
        held = self._replay_held
        sent = added = 0
        tracker = None
        keys: list[tuple[PayloadKey, int]] = []
        for seq, payload in batches:
            key, size = ("kv", seq), len(payload)
            cost = held.cost(key, size) + REPLAY_MESSAGE_OVERHEAD
            if keys and (
                sent + size > self._replay_max_bytes
                or held.bytes + added + cost > self._replay_budget_bytes
            ):
                self.truncated_replays += 1
                break
            try:
                tracker = _send(
                    self._replay, (identity, b"", self._kv_topic, encode_seq(seq)), payload
                )
            except zmq.Again:  # the peer's queue is full: it is not reading
                break
            sent += size
            added += cost
            keys.append((key, size))
        if tracker is not None:
            messages = (("messages", self.replays_served), REPLAY_MESSAGE_OVERHEAD * len(keys))
            self._answering[identity] = held.add(tracker, [*keys, messages])
        self._forget_answered()

    def _forget_answered(self) -> None:
        """Drop the peers whose answers ZMQ no longer holds (identities come and go)."""
        held = self._replay_held
        for identity, answer in list(self._answering.items()):
            if not held.holds(answer):
                del self._answering[identity]

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


def _send(sock: zmq.Socket, head: tuple[bytes, ...], payload: bytes) -> zmq.MessageTracker:
    """Send ``head`` frames (copied: a few bytes) and ``payload`` (not copied, tracked).

    All or nothing: ZMQ checks the high-water mark on the first frame of a
    message only, so once it is taken the rest are too.
    """
    for frame in head:
        sock.send(frame, zmq.SNDMORE | zmq.NOBLOCK)
    return sock.send(payload, zmq.NOBLOCK, copy=False, track=True)
