"""The ingest thread: every socket, every frame, applied to the sidecar's state in order.

One thread owns every socket (ZMQ sockets are not thread-safe): the connect
mode SUB sockets, the listen socket and the DEALER of each replay in progress
(app/ingest/replay.py), all in one poller, one message per ready socket per
turn, so no publisher's traffic, and no replay socket, holds up the others.
Frames are applied publisher by publisher, in sequence order: a gap is filled
from the publisher's replay socket while its later frames wait, a sequence
that goes back resets that publisher's view, malformed frames are counted and
skipped. A stats frame updates the publisher's totals and rates right when it
arrives; a sample frame feeds the publisher's hit-ratio curve (app/state/insight.py),
whose shadow tiers run on the shadow thread (app/ingest/shadow_thread.py), which this
thread starts and stops.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Final, NamedTuple

import zmq

from app.decode import DecodedBatch, decode_kv_payload, decode_stats_payload
from app.ingest.families import FamilyCheck
from app.ingest.listen_gate import ListenGate, message_host
from app.ingest.replay import Answer, KVFrame, Replay
from app.ingest.shadow_thread import ShadowThread
from app.ingest.sockets import receiving_socket
from app.settings import IngestConfig, PublisherEndpoints, SettingError
from app.state.listener import ListenerState
from app.state.publisher import PublisherState, ReplayOutcome
from app.state.sidecar import SidecarState
from app.state.worker_stats import WorkerStats, block_bytes_by_medium
from offload.shown import shown, shown_repr
from offload.wire.endpoints import Family, binds_ipv6, connects_ipv6, family_mismatch
from offload.wire.framing import MalformedFrame, decode_seq
from offload.wire.log_limit import LogLimiter
from offload.wire.sample_frame import SampleFrame, decode_sample_frame
from offload.wire.stats_frame import StatsFrame

logger = logging.getLogger("app.ingest")
_log = LogLimiter(logger)

POLL_MS: Final = 100
"""How often the thread looks at its stop flag and its replays' clocks when nothing arrives."""

HISTORY_EVERY_S: Final = 1.0
"""How often the thread samples the aggregates into the history (its finest resolution)."""

YOUNG_GC_EVERY_S: Final = 0.01
"""How often the thread collects the youngest generation itself.

CPython collects it once allocations outnumber deallocations by a threshold,
but the event log frees an old event for each new one it keeps, so that count
hardly moves while tens of thousands of new objects pile up; the collection
that finally comes then walks them all and holds every request for tens of
milliseconds. Collected this often, it never holds more than a few
milliseconds of ingest."""

MIDDLE_GC_EVERY: Final = 10
"""Every this many young collections, the thread collects the middle generation too (as
CPython would after ten), so that the objects young collections promote never pile up there
either."""

MAX_SEQ_JUMP: Final = 2**32
"""The largest forward jump of a publisher's sequence still read as lost batches.

Four billion batches is weeks of any engine's output; a larger jump is a
publisher that started a new sequence (or a forged frame), so it resets that
publisher's view like a sequence that goes back, instead of counting
billions of batches missed."""


UNREADABLE_AHEAD_KEPT: Final = 64
"""The most numbers a publisher's ``unreadable_ahead`` keeps (the oldest forgotten first):
a peer's flood of them costs a few kilobytes, and a number forgotten is counted twice at
worst."""


class ListenError(SettingError):
    """A ``listen`` endpoint could not be bound (taken, or no such address here)."""

    setting = "listen"


class _Sample(NamedTuple):
    """A sample message, decoded: its sequence number (its own counter) and frame."""

    seq: int
    frame: SampleFrame


class _Batch(NamedTuple):
    """A KV message, decoded: its topic, sequence number and batch (None: its payload is no
    batch)."""

    topic: bytes
    seq: int
    batch: DecodedBatch | None


def _unreadable(malformed: int = 1) -> DecodedBatch:
    """What a KV payload that decodes to no batch stands for: its sequence number, used up.

    TCP does not corrupt bytes and the publisher's replay buffer holds the same
    ones, so asking for that batch again could only fail again: counting it
    once as malformed, and moving on, is all there is to do. ``malformed`` is 0 for a
    replay's copy of bytes counted when they came live (``PublisherState.unreadable_ahead``).
    """
    return DecodedBatch(0.0, None, [], malformed=malformed)


class Ingestor:
    """Receives from every publisher and keeps the sidecar's state current."""

    def __init__(self, state: SidecarState, config: IngestConfig | None = None) -> None:
        self.state = state
        self.config = config = state.ingest if config is None else config
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._poller = zmq.Poller()
        self._sockets: dict[zmq.Socket, PublisherState] = {}
        self._replays: dict[zmq.Socket, Replay] = {}
        self._replaying: dict[str, Replay] = {}  # publisher name -> its replay in progress
        # publisher name -> whether its replay socket connects with ZMQ's IPv6 option, by the
        # family its host resolved to as the settings were read: no name is looked up here
        self._replay_ipv6 = {
            publisher.name: connects_ipv6(source.replay_endpoint, source.replay_family)
            for publisher in state.publishers.values()
            if (source := publisher.source).replay_endpoint is not None
        }
        for publisher in state.publishers.values():
            source = publisher.source
            if isinstance(source, PublisherEndpoints):
                ipv6 = connects_ipv6(source.endpoint, source.family)
                self._sockets[self._subscriber(source.endpoint, ipv6)] = publisher
        self._families = FamilyCheck()
        # the replay endpoints whose name had no address as the settings were read, and has
        # had none since: looked up again whether their publisher is heard or not
        # (``_endpoints_to_recheck``)
        self._unresolved_replays = {
            endpoint
            for publisher in state.publishers.values()
            if (endpoint := publisher.source.replay_endpoint) is not None
            and endpoint.startswith("tcp://")
            and publisher.source.replay_family is None
        }
        # endpoints whose host, looked up again, resolved to the other family alone than their
        # source address (``_check_source``)
        self._mismatched: set[str] = set()
        # The listen socket, its gate and their monitor in a context of their own (see
        # app/ingest/listen_gate.py: a full monitor holds up its context's I/O thread).
        self._listen_ctx = zmq.Context()
        self._gate: ListenGate | None = None
        self._listen: zmq.Socket | None = None
        if state.listener is not None:
            self._listen, self._gate = self._bind(state.listener)
        self._next_sample = self._next_young_gc = time.monotonic()
        self._young_collections = 0
        self._thread = threading.Thread(target=self._run, name="kvscope-ingest", daemon=True)
        insight = state.insight
        self._shadows = ShadowThread(insight.queue, insight.config.cpu_share)

    def _subscriber(self, endpoint: str, ipv6: bool) -> zmq.Socket:
        """A SUB socket connected to ``endpoint``, with or without ZMQ's IPv6 option,
        subscribed to the KV, stats and sample topics."""
        config = self.config
        sock = receiving_socket(self._ctx, zmq.SUB, config)
        for topic in {config.kv_topic, config.stats_topic, config.sample_topic}:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.ipv6 = ipv6
        sock.connect(endpoint)
        return sock

    def _bind(self, listener: ListenerState) -> tuple[zmq.Socket, ListenGate]:
        """The listen socket and its gate, bound to every endpoint; ``ListenError`` naming
        the one that fails."""
        sock = receiving_socket(self._listen_ctx, zmq.SUB, self.config)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: each engine publishes on its own
        gate = ListenGate(self._listen_ctx, sock, listener)
        bound = []
        for endpoint in listener.endpoints:
            sock.ipv6 = binds_ipv6(endpoint)
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                self._destroy()
                raise ListenError(
                    f"cannot bind {shown_repr(endpoint)}: {zmq.strerror(exc.errno)}"
                ) from None
            bound.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        listener.bound = tuple(bound)
        return sock, gate

    def start(self) -> None:
        self._shadows.start()
        self._thread.start()

    def close(self) -> None:
        """Stop the threads and close the sockets; idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._shadows.close()
        self._families.close()
        self._destroy()

    def _destroy(self) -> None:
        self._listen_ctx.destroy(linger=0)
        self._ctx.destroy(linger=0)

    # --- the loop -------------------------------------------------------------------

    def _run(self) -> None:
        """The thread: the loop until ``close``; should anything else end it, word of that.

        The loop gets past every fault it can tell of (``_fault``); one that still gets
        out (a fault of a handler itself, the poller's own) stops every publisher's ingest
        for good, so it is logged and /healthz answers 503 from then on: an orchestrator
        restarts the sidecar.
        """
        try:
            self._loop()
        except BaseException as exc:  # whatever it is, the thread ends here: say so
            self.state.ingest_stopped = True
            logger.critical("the ingest thread stopped: no publisher is read", exc_info=exc)

    def _loop(self) -> None:
        poller = self._poller
        for sock in self._sockets:
            poller.register(sock, zmq.POLLIN)
        if self._listen is not None:
            poller.register(self._listen, zmq.POLLIN)
        for sock in () if self._gate is None else self._gate.sockets:
            poller.register(sock, zmq.POLLIN)
        housekeeping = (
            self._expire_replays,
            self._collect_young,
            self._sample_history,
            self._recheck_families,
        )
        while not self._stop.is_set():
            for sock, _ in poller.poll(POLL_MS):
                try:
                    self._on_ready(sock)
                except Exception as exc:  # a fault of the sidecar's: one message, not the thread
                    self._fault("bug:ingest", "dropped a message", exc)
            for step in housekeeping:
                try:
                    step()
                except Exception as exc:  # as a message's: one step of one turn, not the thread
                    # (a bug, a MemoryError)
                    self._fault(f"bug:ingest:{step.__name__}", f"skipped {step.__name__}", exc)

    def _collect_young(self) -> None:
        """Collect the youngest generation when it is due (``YOUNG_GC_EVERY_S``)."""
        if time.monotonic() < self._next_young_gc:
            return
        self._young_collections += 1
        gc.collect(1 if self._young_collections % MIDDLE_GC_EVERY == 0 else 0)
        self._next_young_gc = time.monotonic() + YOUNG_GC_EVERY_S

    def _sample_history(self) -> None:
        """Sample the aggregates into the history when it is due (``HISTORY_EVERY_S``).

        Here, on the one thread that writes the publishers' states: a sample sees each
        publisher between frames, never half updated. The next one is due before this one
        runs, so a sample that fails is not tried again every turn (each try holds the
        index's lock for a pass over its counts).
        """
        if time.monotonic() < self._next_sample:
            return
        self._next_sample = max(self._next_sample + HISTORY_EVERY_S, time.monotonic())
        self.state.sample_history(time.time())

    def _recheck_families(self) -> None:
        """Take what the latest look-up of unheard publishers' names found
        (app/ingest/families.py): a connect socket whose host now resolves to another family
        than it connects over is made again with the IPv6 option that family needs, and a
        replay endpoint's option likewise for the replays to come; each change counted. A
        connect from a source address keeps its family (``connects_ipv6``), and one whose
        host now resolves to the other family alone is reported (``_check_source``)."""
        found = self._families.poll(self._endpoints_to_recheck)
        if not found:
            return
        self._unresolved_replays.difference_update(found)
        for sock, state in list(self._sockets.items()):
            endpoint = state.source.endpoint
            if endpoint in found:
                self._check_source(state, endpoint, found[endpoint])
                ipv6 = connects_ipv6(endpoint, found[endpoint])
                if ipv6 != bool(sock.ipv6):
                    self._remake(sock, state, ipv6)
        for state in self.state.publishers.values():
            endpoint = state.source.replay_endpoint
            if endpoint in found:
                self._check_source(state, endpoint, found[endpoint])
                ipv6 = connects_ipv6(endpoint, found[endpoint])
                if ipv6 != self._replay_ipv6[state.name]:
                    self._replay_ipv6[state.name] = ipv6
                    self._family_changed(state, "its replays connect", ipv6)

    def _check_source(self, state: PublisherState, endpoint: str, family: Family) -> None:
        """Count and warn of a connect to ``endpoint`` whose host now resolves, by the
        answer ``family``, to the other family alone than its source address, which ZMQ
        cannot connect across (``family_mismatch``). The settings refuse such a connect as
        the sidecar starts, but a name that resolved to nothing then may resolve so later,
        and ZMQ would retry it in silence; its socket keeps the source's family, and
        connects should the name resolve to it again. Once per endpoint, until an answer
        lets it connect again."""
        problem = family_mismatch(endpoint, family)
        if problem is None:
            self._mismatched.discard(endpoint)
            return
        if endpoint in self._mismatched:
            return
        self._mismatched.add(endpoint)
        state.source_family_mismatches += 1
        _log.log(
            logging.WARNING,
            f"source:{endpoint}",
            f"{shown(endpoint)} cannot be connected to from its source address: {problem}; "
            "it is retried until the host resolves to the source's family again",
        )

    def _endpoints_to_recheck(self) -> list[str]:
        """The endpoints the sidecar connects to (live and replay) of the publishers unheard
        for ``CONNECTED_WITHIN_S``: one whose name resolved late may be connected over the
        wrong family. A publisher heard since its source was found of the other family
        connected: should its name turn again, that is reported anew.

        And, heard or not, each replay endpoint whose name has had no address yet: hearing a
        publisher proves its live socket's family, not its replay socket's. A listen-mode
        stream is heard on the sidecar's own socket, so an engine that published before its
        name resolved, and kept publishing, had each replay asked over IPv4 of a name that
        came to resolve to IPv6 alone. These are replay endpoints a check of publishers all
        unheard (as at start-up) looks up anyway: they add no look-up to the most a check
        makes."""
        now = time.time()
        unheard = [state for state in self.state.publishers.values() if not state.connected(now)]
        live = [s.source.endpoint for s in unheard if isinstance(s.source, PublisherEndpoints)]
        replays = {s.source.replay_endpoint for s in unheard if s.source.replay_endpoint}
        endpoints = [*live, *(replays | self._unresolved_replays)]
        self._mismatched.intersection_update(endpoints)
        return endpoints

    def _remake(self, sock: zmq.Socket, state: PublisherState, ipv6: bool) -> None:
        """Put a new SUB socket, connecting with ``ipv6``, in the place of ``sock``; the
        new one first, so that one that cannot be made leaves the old in place."""
        new = self._subscriber(state.source.endpoint, ipv6)
        self._poller.unregister(sock)
        del self._sockets[sock]
        sock.close(linger=0)
        self._sockets[new] = state
        self._poller.register(new, zmq.POLLIN)
        self._family_changed(state, "its socket connects", ipv6)

    @staticmethod
    def _family_changed(state: PublisherState, what: str, ipv6: bool) -> None:
        """Count and log a change ``_recheck_families`` made: ``what`` now connects over
        IPv6 (``ipv6``) or IPv4."""
        state.family_changes += 1
        _log.log(
            logging.INFO,
            f"family:{state.name}",
            f"the host of {shown(state.name)} resolves anew: {what} over IPv{6 if ipv6 else 4} now",
        )

    def _fault(self, key: str, message: str, exc: Exception) -> None:
        """A fault of the sidecar's own that ingest got past: counted (/metrics) and logged
        with its traceback, at most a line per ``key`` every few seconds (it may recur every
        turn, and a turn takes at most ``POLL_MS``)."""
        self.state.ingest_faults += 1
        _log.log(logging.ERROR, key, message, exc_info=exc)

    def _on_ready(self, sock: zmq.Socket) -> None:
        """Take one message from a ready socket (one per socket per turn: fair to all)."""
        replay = self._replays.get(sock)
        if replay is not None:
            self._on_answer(replay)
            return
        if self._gate is not None and sock in self._gate.sockets:
            self._gate.on_ready(sock)
            return
        if sock is self._listen and self.state.listener is not None:
            try:  # uncopied: a part tells the peer it came from
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            host = message_host(parts[0])
            self._on_listened(self.state.listener, [part.bytes for part in parts], host)
            return
        publisher = self._sockets.get(sock)
        if publisher is None:
            return  # a replay that ended earlier in this turn
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        self._on_connected(publisher, frames)

    def _on_connected(self, state: PublisherState, frames: list[bytes]) -> None:
        _heard(state)
        try:
            raw = self._parse(frames, listen=False)
        except Exception as exc:  # a publisher's bad frame must not stop the others
            self._skipped(state, exc)
            return
        self._receive(state, raw)

    def _on_listened(self, listener: ListenerState, frames: list[bytes], host: str | None) -> None:
        """A frame from the listen socket (sent from ``host``, None for an ipc:// peer), to
        the publisher its stream names."""
        listener.frames += 1
        try:
            raw = self._parse(frames, listen=True)
            message = (  # a payload that is no batch names no stream: the listener's to count
                _Batch(raw.topic, raw.seq, decode_kv_payload(raw.payload))
                if isinstance(raw, KVFrame)
                else raw
            )
            state = self.state.listened_publisher(*_stream(message), host)
        except Exception as exc:  # malformed before it named a stream: the listener's count
            self._skipped(listener, exc)
            return
        if state is None:
            listener.refused += 1
            return
        _heard(state)
        self._receive(state, raw, message)

    def _receive(
        self,
        state: PublisherState,
        raw: KVFrame | StatsFrame | _Sample,
        decoded: _Batch | StatsFrame | _Sample | None = None,
    ) -> None:
        """Hold a KV frame while its publisher's replay runs, or apply the message.

        ``decoded`` is the message when the caller has decoded it already.
        """
        try:
            if isinstance(raw, KVFrame) and self._held(state, raw):
                return
            self._deliver(state, self._decoded(raw) if decoded is None else decoded)
        except Exception as exc:  # a publisher's bad frame must not stop the others
            self._skipped(state, exc)

    def _skipped(self, counts: PublisherState | ListenerState, exc: Exception) -> None:
        """Count a frame skipped; log it, a line per kind of problem at most every few seconds.

        A ``ValueError`` (``MalformedFrame``, msgspec's decode errors, the stats
        checks) is the sender's bytes: the line names the publisher and the kind
        of error, never the exception's text, which may quote those bytes.
        Anything else is a bug here, a fault (``_fault``) logged with its traceback.
        """
        counts.malformed += 1
        kind = type(exc).__name__
        if isinstance(exc, ValueError):
            _log.log(
                logging.WARNING,
                f"malformed:{counts.name}:{kind}",
                f"skipped a malformed frame from {counts.name} ({kind})",
            )
        else:
            self._fault(f"bug:{counts.name}:{kind}", f"dropped a frame from {counts.name}", exc)

    # --- reading a message ----------------------------------------------------------

    def _parse(self, frames: list[bytes], *, listen: bool) -> KVFrame | StatsFrame | _Sample:
        """The message's kind and sequence number; a stats frame decoded and checked.

        In connect mode a KV message must carry the KV topic exactly: ZMQ
        subscribes by prefix, so the default empty topic lets every other
        topic through, and those frames are not KV batches. In listen mode the
        topic is the stream's name, whatever it is.
        """
        if len(frames) != 3:
            raise MalformedFrame(f"expected [topic, seq, payload], got {len(frames)} frames")
        topic, seq_frame, payload = frames
        config = self.config
        if topic == config.stats_topic and topic != config.kv_topic:
            return decode_stats_payload(payload)
        if topic == config.sample_topic and topic != config.kv_topic:
            return _Sample(decode_seq(seq_frame), decode_sample_frame(payload))
        if not listen and topic != config.kv_topic:
            raise MalformedFrame("a topic that is neither the KV nor the stats topic")
        return KVFrame(topic, decode_seq(seq_frame), payload)

    @staticmethod
    def _decoded(message: KVFrame | StatsFrame | _Sample) -> _Batch | StatsFrame | _Sample:
        """A KV message with its batch decoded, None for a payload that is no batch.

        (In listen mode such a payload names no stream and is the listener's to
        count; ``_on_listened`` decodes strictly.)
        """
        if not isinstance(message, KVFrame):
            return message
        try:
            batch = decode_kv_payload(message.payload)
        except ValueError:  # MalformedFrame, or msgspec's errors
            batch = None
        return _Batch(message.topic, message.seq, batch)

    def _held(self, state: PublisherState, frame: KVFrame) -> bool:
        """Keep a KV frame for after the publisher's replay in progress, if there is one."""
        replay = self._replaying.get(state.name)
        if replay is None:
            return False
        if not replay.hold(frame):
            state.held_dropped += 1
        return True

    # --- applying -------------------------------------------------------------------

    def _deliver(self, state: PublisherState, message: _Batch | StatsFrame | _Sample) -> None:
        if isinstance(message, StatsFrame):
            self._on_stats(state, message)
            return
        if isinstance(message, _Sample):
            self._on_sample(state, message)
            return
        _, seq, batch = message
        last = state.last_seq
        if batch is None:
            # A payload that is no batch: its number is used up where it is the next one;
            # any other number is not believed, since only a batch may restart the
            # publisher's view or show a gap (either would drop what is held). One ahead
            # may come again in a replay of the gap before it: counted now, not then.
            expected = 0 if last is None else last + 1
            if seq == expected:
                self._apply(state, seq, _unreadable())
                return
            state.malformed += 1
            if seq > expected:
                ahead = state.unreadable_ahead
                ahead[seq] = None
                if len(ahead) > UNREADABLE_AHEAD_KEPT:
                    del ahead[next(iter(ahead))]
            return
        if last is not None and not last < seq <= last + MAX_SEQ_JUMP:
            self._restart(state)
        expected = 0 if state.last_seq is None else state.last_seq + 1
        if seq > expected and self._fill(state, expected, seq, batch):
            return
        self._apply(state, seq, batch)

    def _on_stats(self, state: PublisherState, frame: StatsFrame) -> None:
        """Totals and rates since the publisher's previous frame; its block sizes to the index."""
        state.worker = WorkerStats.between(state.stats, frame)
        state.stats = frame
        block_bytes = block_bytes_by_medium(frame)
        if block_bytes:
            with self.state.lock:
                self.state.index.set_block_bytes(state.name, block_bytes)
        state.stats_frames += 1

    def _on_sample(self, state: PublisherState, message: _Sample) -> None:
        """A sample frame into the publisher's curve (made on its first one)."""
        if state.insight is None:
            state.insight = self.state.insight.new_publisher()
        state.insight.receive(message.seq, message.frame)

    def _restart(self, state: PublisherState) -> None:
        """The publisher's sequence went back: forget what it told us before."""
        state.restarts += 1
        state.last_seq = None
        state.unreadable_ahead.clear()  # numbers of the old sequence
        with self.state.lock:
            self.state.index.reset_publisher(state.name)

    def _fill(
        self, state: PublisherState, first: int, upto: int, batch: DecodedBatch | None
    ) -> bool:
        """Batches first..upto-1 are missing: start a replay of them, True if one started.

        Without a replay socket they are counted as missed at once (unless this
        is the publisher's first frame: a sidecar that started late misses
        nothing) and the caller applies ``batch`` (number ``upto``) now; so too
        when the replay socket cannot be made (no file descriptor left, an
        endpoint ZMQ cannot connect to): the replay is counted "unstarted" and
        logged, and ``batch``, no fault of its own, is applied all the same.
        ``batch`` is None when no frame showed the gap (frames dropped while
        held): a gap whose replay cannot start then is left for the next frame
        to show, and to count once.
        """
        is_gap = state.last_seq is not None
        replay = None
        endpoint = state.source.replay_endpoint
        if endpoint is not None:
            try:
                replay = Replay(
                    self._ctx, state, endpoint, self._replay_ipv6[state.name], self.config,
                    first=first, upto=upto, trigger=None if batch is None else (upto, batch),
                    is_gap=is_gap,
                )  # fmt: skip
            except zmq.ZMQError as exc:  # no bug, nor the frame's fault: ZMQ's reason says all
                state.replays["unstarted"] += 1
                _log.log(
                    logging.ERROR,
                    f"replay:unstarted:{state.name}",
                    f"started no replay from {state.name}: {exc}",
                )
                if batch is None:
                    return False
        state.gaps += is_gap
        if replay is None:
            missed = _passed_over(state, first, upto, upto - first)
            state.missed += missed if is_gap else 0
            return False
        self._replays[replay.socket] = replay
        self._replaying[state.name] = replay
        self._poller.register(replay.socket, zmq.POLLIN)
        return True

    def _on_answer(self, replay: Replay) -> None:
        """One message of a replay's answer: apply it, or end the replay."""
        state = replay.state
        answer = replay.receive()
        if answer is None:
            return
        if not isinstance(answer, Answer):
            self._end_replay(replay, answer)
            return
        try:
            batch = decode_kv_payload(answer.payload)
        except ValueError:  # counted already where its live copy came ahead of its turn
            batch = _unreadable(0 if answer.seq in state.unreadable_ahead else 1)
        state.unreadable_ahead.pop(answer.seq, None)  # used up: not among those it passes over
        self._apply(state, answer.seq, batch)
        replay.applied += 1
        state.replayed += 1
        if replay.wanted >= replay.upto:
            self._end_replay(replay, "complete")

    def _expire_replays(self) -> None:
        now = time.monotonic()
        for replay in list(self._replays.values()):
            outcome = replay.expired(now)
            if outcome is not None:
                self._end_replay(replay, outcome)

    def _end_replay(self, replay: Replay, outcome: ReplayOutcome) -> None:
        """Count how the replay went, apply the batch that showed the gap, then the held frames.

        A replay of frames dropped while held has no such batch: its end moves the
        sequence past its range instead, or the next frame would show what it lacked,
        counted missed already, as a gap again.

        A held frame may show another gap (one dropped while held, say): that
        starts the next replay, and the frames after it are held again, in order.
        Frames dropped after the last one held show no gap until a later frame
        arrives, which may be never: a replay of them starts at once.
        """
        state = replay.state
        self._poller.unregister(replay.socket)
        del self._replays[replay.socket]
        del self._replaying[state.name]
        replay.close()
        state.replays[outcome] += 1
        missed = _passed_over(state, replay.first, replay.upto, replay.missing)
        state.missed += missed if replay.is_gap else 0
        if outcome == "malformed":
            state.malformed += 1
        if outcome != "complete":
            _log.log(
                logging.WARNING,
                f"replay:{outcome}:{state.name}",
                f"a replay from {state.name} ended: {outcome}; the batches it lacked are missed",
            )
        if replay.trigger is not None:
            self._apply(state, *replay.trigger)
        else:
            state.last_seq = replay.upto - 1
        for frame in replay.held:
            try:
                if not self._held(state, frame):
                    message = self._decoded(frame)
                    assert isinstance(message, _Batch)
                    self._deliver(state, message)
            except Exception as exc:  # as for a live frame
                self._skipped(state, exc)
        if replay.dropped_last is not None:
            self._replay_dropped(state, replay.dropped_last)

    def _replay_dropped(self, state: PublisherState, dropped_last: int) -> None:
        """Fill the gap up to ``dropped_last``, a frame dropped while held, if nothing covers it."""
        active = self._replaying.get(state.name)
        if active is not None:  # a held frame started another replay: it holds what follows
            if active.dropped_last is None:
                active.dropped_last = dropped_last
            return
        last = state.last_seq
        if last is not None and last < dropped_last <= last + MAX_SEQ_JUMP:
            self._fill(state, last + 1, dropped_last + 1, None)

    def _apply(self, state: PublisherState, seq: int, batch: DecodedBatch) -> None:
        """Apply batch ``seq`` of the publisher: its number is used up before the index is
        touched.

        A fault of the sidecar's part-way through the batch (a bug, MemoryError) leaves
        the events before it applied: had it left the number unused, the next frame would
        show a gap whose replay applied the same batch again. The fault is counted and
        logged instead, and the batch goes on to the event log, which shows what the
        publisher sent.
        """
        state.last_seq = seq
        state.batches_applied += 1
        state.malformed += batch.malformed
        try:
            self.state.index.apply(state.name, batch, time.time(), self.state.lock)
        except Exception as exc:  # the sidecar's fault, not the publisher's: not malformed
            self._fault(
                f"bug:apply:{state.name}:{type(exc).__name__}",
                f"applied a batch from {state.name} in part",
                exc,
            )
        self.state.event_log.record(state.name, seq, batch)


def _passed_over(state: PublisherState, first: int, upto: int, unapplied: int) -> int:
    """How many of the ``unapplied`` numbers of ``first .. upto-1`` were missed, now that the
    publisher's sequence passes them unfilled: all but those whose live payload was no batch,
    counted malformed as it came (one frame, one count), which are forgotten here."""
    ahead = state.unreadable_ahead
    counted = [seq for seq in ahead if first <= seq < upto]
    for seq in counted:
        del ahead[seq]
    return unapplied - len(counted)


def _stream(message: _Batch | StatsFrame | _Sample) -> tuple[bytes, int | None]:
    """The listen-mode stream a message belongs to (app/streams.py).

    A KV batch: its topic and the rank it carries. A stats or sample frame, whose
    topic is the same for every publisher: its engine id and rank.
    """
    if isinstance(message, StatsFrame):
        return message.engine_id.encode(), message.rank
    if isinstance(message, _Sample):
        return message.frame.engine_id.encode(), message.frame.rank
    return message.topic, message.batch.rank


def _heard(state: PublisherState) -> None:
    state.frames += 1
    state.last_frame_at = time.time()
