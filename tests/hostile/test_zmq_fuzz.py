"""Fuzzing a live sidecar over real sockets: it stays up, counts, stays true and bounded.

Two publishers feed one ingest thread on loopback. Publisher A is honest but
its stream is laced with garbage (frames of the wrong shape or topic, stats
frames of any content, events naming bad or too many media) and loses
frames, which its replay socket answers. Publisher B loses frames too, and
its replay socket answers whatever hypothesis makes up (junk frames, repeated
or out-of-order sequence numbers, no end marker). After each example the
sidecar must still be running, its index must equal A's truth (every loss
recovered by replay, no garbage applied), its counters must make sense, and
its structures must be within their bounds. Examples are few and small, so
the whole run takes seconds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.ingest import Ingestor
from app.settings import IngestConfig
from app.state.event_log import EventLog
from offload.base import OffloadingEvent
from offload.wire.kv_events import BlockRemoved, BlockStored, KVEventBatch, encode_batch
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, ingesting, kv_payload, wait_connected

pytestmark = pytest.mark.timeout(300)

KV = b"kv"
STATS = b"kvscope.stats"
MAX_MEDIA = 4
MEDIA = ["CPU", "GPU", "m1", "m2", "m3", "m4", "bad medium", "x" * 40]
B_HASHES = range(10_000, 10_050)


class Live:
    """The system under test and the truth of publisher A, kept across examples."""

    def __init__(self, ingestor: Ingestor, a: RawPublisher, b: RawPublisher) -> None:
        self.ingestor, self.a, self.b = ingestor, a, b
        self.a_seq = self.b_seq = 0
        self.truth: dict[int, Counter[str]] = {}
        """Each block's copies per medium: a pool may cache one hash in several blocks, and
        each copy is removed on its own."""
        self.media: list[str] = ["CPU"]  # what the index has seen, in order (B's is CPU)
        self.junk: list[list[bytes]] = []

    def takes(self, medium: str) -> bool:
        """Whether the index applies an event on ``medium`` (the model of its checks)."""
        if medium not in MEDIA[:6]:
            return False  # malformed: a space, or too long
        if medium not in self.media:
            if self._full(medium):  # the media that hold no copy are released
                self.media = [m for m in self.media if any(c[m] for c in self.truth.values())]
            if self._full(medium):
                return False
            self.media.append(medium)
        return True

    def _full(self, medium: str) -> bool:
        """Whether ``MAX_MEDIA`` has no place for a new ``medium``: one is held for the GPU
        until it is named."""
        held_for_gpu = medium != "GPU" and "GPU" not in self.media
        return len(self.media) + held_for_gpu >= MAX_MEDIA


def junk_answer(raw: RawPublisher, identity: bytes, start: int) -> None:
    """Whatever the current example made up, as a replay answer."""
    for frames in LIVE.junk:
        raw.router.send_multipart([identity, *frames])


LIVE: Live


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    global LIVE
    a, b = RawPublisher(topic=KV), RawPublisher(topic=KV, answerer=junk_answer)
    config = IngestConfig(kv_topic=KV, replay_timeout_s=0.3, replay_deadline_s=2.0)
    log = EventLog(200, max_bytes=2**20, max_batch_events=20)
    with ingesting(
        a.endpoints, b.endpoints, config=config, max_blocks=5000, max_media=MAX_MEDIA,
        event_log=log,
    ) as ingestor:  # fmt: skip
        wait_connected(a, ingestor)
        wait_connected(b, ingestor)
        LIVE = Live(ingestor, a, b)
        a.send(0, kv_payload(OffloadingEvent([10_000], 16, "CPU", False)))  # CPU is seen first
        LIVE.truth[10_000] = Counter(["CPU"])
        LIVE.a_seq = 1
        yield LIVE
    a.close()
    b.close()


event = st.tuples(st.booleans(), st.lists(st.integers(0, 300), max_size=6), st.sampled_from(MEDIA))
a_batch = st.tuples(st.just("a"), st.lists(event, max_size=4), st.booleans())
b_batch = st.tuples(st.just("b"), st.lists(st.sampled_from(B_HASHES), max_size=4), st.booleans())
garbage = st.tuples(
    st.just("garbage"),
    st.sampled_from([KV, b"kvx", b"k", STATS, b"zz"]),
    st.binary(max_size=12),
    st.binary(max_size=64),
    st.integers(1, 5),
)
stats = st.tuples(
    st.just("stats"),
    st.dictionaries(
        st.sampled_from(["version", "ts", "engine_id", "rank", "config", "counters", "x"]),
        st.one_of(
            st.integers(-5, 5), st.floats(), st.text(max_size=5), st.just([]), st.just({}),
            st.just([{"name": "x_total", "labels": {}, "value": math.nan}]),
        ),
    ),
)  # fmt: skip
junk_frame = st.lists(st.binary(max_size=16), max_size=5) | st.tuples(
    st.just(b""), st.just(KV), st.integers(0, 40).map(lambda s: s.to_bytes(8, "big")),
    st.sampled_from([b"\xc1", kv_payload(OffloadingEvent([10_001], 16, "CPU", False))]),
).map(list)  # fmt: skip


def send_a_batch(live: Live, events: list, lose: bool) -> None:
    wire = []
    for is_store, hashes, medium in events:
        if not hashes:
            continue
        if is_store:
            wire.append(BlockStored(hashes, None, [], 16, None, medium, None))
        else:
            wire.append(BlockRemoved(hashes, medium))
        if not live.takes(medium):
            continue
        if is_store and live.truth.get(hashes[-1], Counter())[medium]:
            continue  # from the root, ending at a block held: vLLM's report of a hit
        for block in hashes:
            held = live.truth.setdefault(block, Counter())
            if is_store:
                held[medium] += 1
            elif held[medium]:
                held[medium] -= 1
    live.a.send(live.a_seq, encode_batch(KVEventBatch(ts=1.0, events=wire)), lose=lose)
    live.a_seq += 1


def send(live: Live, op: tuple) -> None:
    kind = op[0]
    if kind == "a":
        send_a_batch(live, op[1], op[2])
    elif kind == "b":
        events = [OffloadingEvent(op[1], 16, "CPU", False)] if op[1] else []
        live.b.send(live.b_seq, kv_payload(*events), lose=op[2])
        live.b_seq += 1
    elif kind == "garbage":
        _, topic, seq, payload, frames = op
        if topic == KV and len(seq) == 8:
            seq = seq[:7]  # a KV frame with a good number would be a batch, not garbage
        live.a.pub.send_multipart([topic, seq, b"\xc1" + payload, b"", b""][:frames])
    else:
        live.a.pub.send_multipart([STATS, b"\0" * 8, msgspec.msgpack.encode(op[1])])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(st.one_of(a_batch, a_batch, b_batch, garbage, stats), min_size=5, max_size=25),
    junk=st.lists(junk_frame, max_size=6),
)
def test_hostile_streams_leave_the_sidecar_up_true_and_bounded(
    live: Live, ops: list, junk: list
) -> None:
    live.junk = junk
    for op in ops:
        send(live, op)
    final = live.a_seq
    send_a_batch(live, [], lose=False)  # an honest frame that shows any gap left
    ingestor = live.ingestor
    a = ingestor.state.publishers[live.a.endpoints.endpoint]
    b = ingestor.state.publishers[live.b.endpoints.endpoint]
    wait_until(lambda: a.last_seq == final, "publisher A's stream is applied up to date")

    assert ingestor._thread.is_alive()
    index = ingestor.state.index
    with ingestor.state.lock:
        for block in range(301):
            entry = index.get(block)
            held = sorted(+live.truth.get(block, Counter()))
            assert (entry.media if entry else ()) == tuple(held), block
        assert len(index) <= index.max_blocks
        assert len(index.blocks_by_medium()) <= MAX_MEDIA
    assert (a.missed, a.restarts) == (0, 0)
    assert b.missed >= 0 and b.replayed <= b.batches_applied
    log = ingestor.state.event_log
    assert log.bytes <= log.max_bytes and len(log.since(0, 10_000)) <= log.capacity
    for replay in ingestor._replaying.values():
        assert replay.held_bytes <= ingestor.config.replay_hold_bytes
