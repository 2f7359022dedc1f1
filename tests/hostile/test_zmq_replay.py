"""Replay sockets that dawdle, fall silent or lie never stall ingest (issue 15, item 2).

A replay used to run inside the ingest thread until its end marker: a replay
socket that answered one batch every half second held every other publisher
for as long as it kept answering. Here each test holds a replay open (an
answerer that drips, stays silent or misbehaves) and shows a healthy
publisher advancing meanwhile, then how the replay ended and what it counted.
Real sockets on loopback; waits poll a condition, nothing asserts on time.
"""

from __future__ import annotations

import threading

import pytest

from app.ingest.ingestor import UNREADABLE_AHEAD_KEPT
from app.ingest.replay import HELD_FRAME_OVERHEAD
from app.settings import IngestConfig, PublisherEndpoints
from app.state.sidecar import SidecarState
from offload.base import OffloadingEvent
from tests.support.http_app import served_views
from tests.support.polling import wait_until
from tests.support.zmq_peers import (
    RawPublisher,
    dropped_while_held,
    gated_by,
    ingesting,
    kv_payload,
    wait_connected,
)

pytestmark = pytest.mark.timeout(120)


def stored(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, "CPU", False)


def blocks(ingestor, publisher: str) -> set:
    with ingestor.state.lock:
        page, _ = ingestor.state.index.page(publisher=publisher, limit=1000)
    return {entry.block_hash for entry in page}


def dripping(raw: RawPublisher, identity: bytes, start: int) -> None:
    """One batch every 0.5 s from ``start`` on, never the end marker, until closed."""
    seq = start
    while not raw.stopping:
        raw.answer(identity, seq, kv_payload(stored(1000 + seq)))
        seq += 1
        threading.Event().wait(0.5)


def silent(raw: RawPublisher, identity: bytes, start: int) -> None:
    """Never answers."""


def a_gap_of(raw: RawPublisher, size: int) -> None:
    """Batch 0, then ``size`` lost ones, then one more: a gap of ``size`` to replay."""
    raw.send(0, kv_payload(stored(1)))
    for seq in range(1, size + 1):
        raw.send(seq, kv_payload(stored(1000 + seq)), lose=True)
    raw.send(size + 1, kv_payload(stored(2)))


@pytest.mark.parametrize("answerer", [dripping, silent])
def test_a_replay_that_never_ends_does_not_hold_up_another_publisher(answerer) -> None:
    slow, healthy = RawPublisher(answerer=answerer), RawPublisher()
    config = IngestConfig(replay_timeout_s=60.0, replay_deadline_s=60.0)
    try:
        with ingesting(slow.endpoints, healthy.endpoints, config=config) as ingestor:
            stuck = wait_connected(slow, ingestor)
            flowing = wait_connected(healthy, ingestor)
            a_gap_of(slow, 1000)
            wait_until(lambda: slow.replay_requests == 1, "the slow replay is asked")
            for seq in range(100):
                healthy.send(seq, kv_payload(stored(seq)))
            wait_until(lambda: flowing.last_seq == 99, "the healthy publisher advances")
            assert blocks(ingestor, healthy.endpoints.endpoint) == set(range(100))
            assert sum(stuck.replays.values()) == 0, "the slow replay is still open"
            assert stuck.last_seq is not None and stuck.last_seq < 1001
    finally:
        slow.close()
        healthy.close()


def test_a_replay_that_outlives_its_deadline_ends_counted_and_the_held_frames_follow() -> None:
    slow = RawPublisher(answerer=dripping)
    config = IngestConfig(replay_timeout_s=60.0, replay_deadline_s=1.5)
    try:
        with ingesting(slow.endpoints, config=config) as ingestor:
            state = wait_connected(slow, ingestor)
            a_gap_of(slow, 1000)
            slow.send(1002, kv_payload(stored(3)))  # held while the replay runs
            wait_until(lambda: state.replays["deadline"] == 1, "the replay hits its deadline")
            wait_until(lambda: state.last_seq == 1002, "the held frame is applied after it")
            assert state.replayed >= 1 and state.replayed < 1000
            assert state.missed == 1000 - state.replayed
            assert {1, 2, 3} <= blocks(ingestor, slow.endpoints.endpoint)
    finally:
        slow.close()


def test_a_silent_replay_socket_times_out_counted_as_missed() -> None:
    raw = RawPublisher(answerer=silent)
    try:
        with ingesting(raw.endpoints, config=IngestConfig(replay_timeout_s=0.5)) as ingestor:
            state = wait_connected(raw, ingestor)
            a_gap_of(raw, 3)
            wait_until(lambda: state.last_seq == 4, "the frame after the gap is applied")
            assert (state.gaps, state.missed, state.replayed) == (1, 3, 0)
            assert state.replays["timeout"] == 1
    finally:
        raw.close()


def repeating(raw: RawPublisher, identity: bytes, start: int) -> None:
    """Answers batch ``start`` three times over, then ends."""
    for _ in range(3):
        raw.answer(identity, start, kv_payload(stored(500)))
    raw.end(identity)


def test_an_answer_that_repeats_a_sequence_number_ends_the_replay_as_malformed() -> None:
    raw = RawPublisher(answerer=repeating)
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            a_gap_of(raw, 5)
            wait_until(lambda: state.last_seq == 6, "the frame after the gap is applied")
            assert state.replays["malformed"] == 1
            assert (state.replayed, state.missed) == (1, 4)
            assert state.missed >= 0 and state.malformed == 1
    finally:
        raw.close()


def with_megabyte_topics(raw: RawPublisher, identity: bytes, start: int) -> None:
    """Every batch asked for, each under a topic of 1 MiB, then the end marker."""
    for seq in range(start, start + 10):
        payload = kv_payload(stored(1000 + seq))
        raw.router.send_multipart([identity, b"", b"t" * 2**20, seq.to_bytes(8, "big"), payload])
    raw.end(identity)


def test_every_frame_of_an_answer_counts_against_the_replay_byte_bound() -> None:
    """Only payloads counted: answers under topics of a megabyte each passed the bound."""
    raw = RawPublisher(answerer=with_megabyte_topics)
    config = IngestConfig(replay_max_bytes=4 * 2**20)
    try:
        with ingesting(raw.endpoints, config=config) as ingestor:
            state = wait_connected(raw, ingestor)
            a_gap_of(raw, 10)
            wait_until(lambda: state.last_seq == 11, "the frame after the gap is applied")
            assert state.replays["oversize"] == 1  # "complete", all 10 applied, before
            assert (state.replayed, state.missed) == (3, 7)
    finally:
        raw.close()


def test_replayed_counts_the_batches_applied_not_those_received() -> None:
    """The publisher no longer holds the gap: its answer starts past it, and nothing is applied."""
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(stored(1)))
            wait_until(lambda: state.last_seq == 0, "batch 0 applied")
            with raw._lock:
                raw.buffer.clear()  # batches 1 and 2 fell out of the publisher's buffer
            raw.send(3, kv_payload(stored(4)))
            wait_until(lambda: state.last_seq == 3, "batch 3 applied")
            assert (state.gaps, state.replayed, state.missed) == (1, 0, 2)
            assert state.replays["complete"] == 1
    finally:
        raw.close()


def test_a_malformed_payload_is_counted_once_and_uses_up_its_number() -> None:
    """It was counted malformed, then again as a gap and a missed batch (its replay failed too)."""
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(stored(1)))
            raw.send(1, b"\xc1 not a batch")
            raw.send(2, kv_payload(stored(3)))
            wait_until(lambda: state.last_seq == 2, "batch 2 applied")
            assert (state.malformed, state.gaps, state.missed, state.replayed) == (1, 0, 0, 0)
            assert raw.replay_requests == 0
            assert blocks(ingestor, raw.endpoints.endpoint) == {1, 3}
    finally:
        raw.close()


def test_a_malformed_payload_ahead_of_a_gap_is_counted_once_when_the_replay_brings_it() -> None:
    """Live, after a lost batch, it was counted; the replay of that gap brought the same
    bytes again, and they were counted a second time."""
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(stored(1)))
            raw.send(1, kv_payload(stored(2)), lose=True)
            raw.send(2, b"\xc1 not a batch")  # not the next number: counted, nothing else
            wait_until(lambda: state.malformed == 1, "the live copy counted")
            raw.send(3, kv_payload(stored(4)))  # shows the gap: 1 and 2 are replayed
            wait_until(lambda: state.last_seq == 3, "batch 3 applied")
            assert (state.malformed, state.gaps, state.missed, state.replayed) == (1, 1, 0, 2)
            assert state.replays["complete"] == 1
            assert blocks(ingestor, raw.endpoints.endpoint) == {1, 2, 4}
    finally:
        raw.close()


@pytest.mark.parametrize("replay", [False, True], ids=["no replay socket", "a silent one"])
def test_a_malformed_payload_in_a_gap_left_unfilled_is_not_counted_missed_too(replay) -> None:
    """Live, after a lost batch, it was counted malformed; the gap then went unfilled (no
    replay socket, or one that never answered), and every number of it was counted missed,
    its own too: one frame in two counts."""
    raw = RawPublisher(answerer=silent)
    endpoints = raw.endpoints if replay else PublisherEndpoints(raw.endpoints.endpoint)
    config = IngestConfig(replay_timeout_s=0.5)
    try:
        with ingesting(endpoints, config=config) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(stored(1)))
            raw.send(1, kv_payload(stored(2)), lose=True)
            raw.send(2, b"\xc1 not a batch")  # not the next number: counted, nothing else
            wait_until(lambda: state.malformed == 1, "the live copy counted")
            raw.send(3, kv_payload(stored(4)))  # shows the gap: 1 and 2 go unfilled
            wait_until(lambda: state.last_seq == 3, "batch 3 applied")
            assert (state.malformed, state.gaps, state.missed, state.replayed) == (1, 1, 1, 0)
            assert state.replays["timeout"] == raw.replay_requests == int(replay)
            assert not state.unreadable_ahead  # its number is passed
    finally:
        raw.close()


def test_a_malformed_payload_of_a_restarted_sequence_is_counted_whatever_the_old_one_sent() -> None:
    """The numbers counted ahead of their turn are the old sequence's: a replay of the new
    one bringing no batch under the same number is counted."""
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(stored(1)))
            raw.send(5, b"\xc1 not a batch")  # ahead: counted
            wait_until(lambda: state.malformed == 1, "the old sequence's payload counted")
            with raw._lock:
                raw.buffer.clear()  # the restarted process has an empty replay buffer
            raw.send(0, kv_payload(stored(2)))  # the sequence starts over
            for seq in range(1, 5):
                raw.send(seq, kv_payload(stored(10 + seq)), lose=True)
            raw.send(5, b"\xc1 not a batch", lose=True)
            raw.send(6, kv_payload(stored(3)))  # shows the gap: 1 to 5 are replayed
            wait_until(lambda: state.last_seq == 6, "batch 6 applied")
            assert (state.malformed, state.restarts, state.gaps, state.missed) == (2, 1, 1, 0)
    finally:
        raw.close()


def test_the_numbers_counted_ahead_stay_bounded_whatever_a_peer_floods() -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            for seq in range(1, 3 * UNREADABLE_AHEAD_KEPT + 1):
                raw.send(seq, b"\xc1 not a batch")
            wait_until(lambda: state.malformed == 3 * UNREADABLE_AHEAD_KEPT, "every one counted")
            assert list(state.unreadable_ahead) == list(
                range(2 * UNREADABLE_AHEAD_KEPT + 1, 3 * UNREADABLE_AHEAD_KEPT + 1)
            )
    finally:
        raw.close()


def test_a_payload_that_is_no_batch_never_restarts_the_publisher_nor_shows_a_gap() -> None:
    """Only a batch may move a publisher's sequence anywhere but one on: an unreadable payload
    numbered 0 once wiped the publisher's blocks as a restart, and one numbered far ahead
    counted a thousand batches missed, then made the next real batch look like a restart."""
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            for seq in range(3):
                raw.send(seq, kv_payload(stored(seq + 1)))
            wait_until(lambda: state.last_seq == 2, "batches 0-2 applied")
            raw.send(0, b"\xc1 not a batch")
            raw.send(1002, b"\xc1 not a batch")
            raw.send(3, kv_payload(stored(4)))
            wait_until(lambda: state.last_seq == 3, "batch 3 applied")
            assert (state.malformed, state.restarts, state.gaps, state.missed) == (2, 0, 0, 0)
            assert raw.replay_requests == 0
            assert blocks(ingestor, raw.endpoints.endpoint) == {1, 2, 3, 4}
    finally:
        raw.close()


NESTED = b"\x93\xcb" + bytes(8) + b"\x91" * 5000 + b"\xc0\xc0"
"""``[0.0, [[[...]]], nil]``: a few kilobytes nested past the interpreter's recursion limit."""


def nested_answer(raw: RawPublisher, identity: bytes, start: int) -> None:
    raw.answer(identity, start, NESTED)
    raw.end(identity)


def test_payloads_nested_past_the_recursion_limit_are_malformed_and_ingest_goes_on() -> None:
    """Such a payload raised RecursionError, which no handler of malformed input caught: in a
    replay answer it stopped the ingest thread, and every publisher with it."""
    raw = RawPublisher(answerer=nested_answer)
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(stored(1)))
            raw.send(1, kv_payload(stored(2)), lose=True)
            raw.send(2, kv_payload(stored(3)))  # shows the gap: the answer is the nested one
            wait_until(lambda: state.last_seq == 2, "the frame after the gap applied")
            raw.send(3, NESTED)  # live, where it is the next number: uses it up
            raw.send(4, kv_payload(stored(5)))
            wait_until(lambda: state.last_seq == 4, "ingest goes on after both")
            assert state.replays["complete"] == 1
            assert state.malformed == 2 and state.restarts == 0
            assert blocks(ingestor, raw.endpoints.endpoint) == {1, 3, 5}
    finally:
        raw.close()


def test_live_frames_held_past_the_byte_bound_are_dropped_counted_and_replayed_later() -> None:
    gate = threading.Event()
    raw = RawPublisher(answerer=gated_by(gate))
    payloads = {seq: kv_payload(stored(*range(seq * 10, seq * 10 + 10))) for seq in range(60)}
    config = IngestConfig(replay_hold_bytes=5 * len(payloads[5]))
    try:
        with ingesting(raw.endpoints, config=config) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, payloads[0])
            raw.send(1, payloads[1], lose=True)
            for seq in range(2, 60):
                raw.send(seq, payloads[seq])
            wait_until(lambda: state.held_dropped > 0, "frames past the hold bound dropped")
            gate.set()
            wait_until(lambda: state.last_seq == 59, "everything applied in the end")
            expected = {h for seq in range(60) for h in range(seq * 10, seq * 10 + 10)}
            assert blocks(ingestor, raw.endpoints.endpoint) == expected
            assert state.missed == 0 and state.held_dropped > 0
            assert state.replays["complete"] == raw.replay_requests >= 2
            served = served_counts(ingestor.state, raw.endpoints.endpoint)
            assert served == (state.replays["complete"], state.held_dropped) * 2
    finally:
        gate.set()
        raw.close()


def test_frames_dropped_while_held_and_gone_from_the_buffer_are_missed_once() -> None:
    """The replay of frames dropped while held found them gone from the publisher's buffer:
    counted missed, its range was left open, and the next frame showed it again as a gap,
    whose replay counted them missed a second time."""
    with dropped_while_held() as held:
        state, raw = held.state, held.raw
        with raw._lock:  # 8 to 28 fell out of the publisher's buffer
            raw.buffer[:] = [(seq, payload) for seq, payload in raw.buffer if seq < 8]
        held.gate.set()
        wait_until(lambda: state.replays["complete"] == 2, "both replays answered")
        raw.send(29, held.payloads[29])
        wait_until(lambda: state.last_seq == 29, "the next frame applied")
        assert (state.gaps, state.missed, state.replayed) == (2, 21, 1)
        assert raw.replay_requests == 2


def test_held_frames_are_charged_their_memory_however_small_their_payloads() -> None:
    """Held frames were charged their payload alone: a peer that kept a replay open held
    1.3 million frames with empty payloads (+154 MiB) within a 64 MiB bound, none shed."""
    gate = threading.Event()
    raw = RawPublisher(answerer=gated_by(gate))
    config = IngestConfig(replay_hold_bytes=100 * HELD_FRAME_OVERHEAD)
    try:
        with ingesting(raw.endpoints, config=config) as ingestor:
            state = wait_connected(raw, ingestor)
            a_gap_of(raw, 1)
            wait_until(lambda: raw.replay_requests == 1, "the replay is asked, and held open")
            replay = ingestor._replaying[state.name]
            for seq in range(3, 303):
                raw.send(seq, b"")
            wait_until(
                lambda: len(replay.held) + state.held_dropped == 300, "every empty frame arrives"
            )
            assert len(replay.held) == 100 and state.held_dropped == 200
            gate.set()
            wait_until(lambda: state.last_seq == 302, "the dropped frames are replayed after")
            assert state.missed == 0
    finally:
        gate.set()
        raw.close()


def served_counts(state: SidecarState, endpoint: str) -> tuple[int, int, int, int]:
    """Completed replays and held drops as /metrics and /api/v1/stats show them."""
    metrics, publisher = served_views(state, endpoint)
    labels = (("publisher", endpoint),)
    complete = (("outcome", "complete"), *labels)
    return (
        int(metrics["kvscope_sidecar_replays_total", complete]),
        int(metrics["kvscope_sidecar_held_dropped_frames_total", labels]),
        publisher["replays"]["complete"],
        publisher["held_dropped"],
    )
