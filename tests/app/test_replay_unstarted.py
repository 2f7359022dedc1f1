"""A replay whose socket cannot be made: counted ``unstarted``, and its gap counted once.

The socket is refused by the system, not by a peer: an endpoint that ZMQ cannot connect to
(the settings refuse it, but an embedder's ``PublisherEndpoints`` is not checked), or a
process with no file descriptor left. Before,
the failure got out of the replay's start: the batch that showed the gap, which is no
malformed frame, was counted malformed and dropped, the gap was never counted missed, a
socket whose ``connect`` failed was left open, and a replay of frames dropped while held
counted its gap twice. Real sockets on loopback; waits poll a condition, nothing asserts
on time.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq

from app.ingest.replay import Replay
from app.settings import IngestConfig, PublisherEndpoints
from app.state.publisher import PublisherState
from offload.base import OffloadingEvent
from tests.support.http_app import served_views
from tests.support.polling import wait_until
from tests.support.zmq_peers import (
    RawPublisher,
    dropped_while_held,
    free_tcp_endpoint,
    ingesting,
    kv_payload,
    wait_connected,
)

pytestmark = pytest.mark.timeout(120)

UNCONNECTABLE = "ipc:///tmp/" + "x" * 120
"""A replay endpoint that ZMQ refuses at connect (a path too long for a unix socket:
ENAMETOOLONG), given past the settings, which refuse it too."""


def stored(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, "CPU", False)


def unstarted_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "app.ingest" and "started no replay" in r.getMessage()
    ]


def test_a_replay_socket_that_cannot_be_made_leaves_the_gap_missed_and_the_batch_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="app.ingest")
    raw = RawPublisher()
    endpoints = PublisherEndpoints(raw.endpoints.endpoint, UNCONNECTABLE)
    try:
        with ingesting(endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            raw.send(0, kv_payload(stored(1)))
            for seq in (1, 2, 3):
                raw.send(seq, kv_payload(stored(10 + seq)), lose=True)
            raw.send(4, kv_payload(stored(2)))
            wait_until(lambda: state.gaps == 1, "the gap shows")
            raw.send(5, kv_payload(stored(3)))
            wait_until(lambda: state.last_seq == 5, "the frame after it applied")
            assert (state.gaps, state.missed, state.malformed, state.replayed) == (1, 3, 0, 0)
            assert state.replays == {**dict.fromkeys(state.replays, 0), "unstarted": 1}
            assert (state.batches_applied, ingestor.state.ingest_faults) == (3, 0)
            with ingestor.state.lock:
                index = ingestor.state.index
                held = {h for h in (1, 2, 3, 11, 12, 13) if index.get(h) is not None}
            assert held == {1, 2, 3}
            assert served(ingestor.state, endpoints.endpoint) == (1, 3, 0) * 2
    finally:
        raw.close()
    [line] = unstarted_lines(caplog)
    assert line.exc_info is None  # no bug of the sidecar's: its reason says all
    assert "File name too long" in line.getMessage()


def served(state, endpoint: str) -> tuple[int, int, int, int, int, int]:
    """Unstarted replays, missed batches and malformed frames as /metrics and /api/v1/stats
    show them."""
    metrics, publisher = served_views(state, endpoint)
    labels = (("publisher", endpoint),)
    unstarted = (("outcome", "unstarted"), *labels)
    return (
        int(metrics["kvscope_sidecar_replays_total", unstarted]),
        int(metrics["kvscope_sidecar_missed_batches_total", labels]),
        int(metrics["kvscope_sidecar_malformed_frames_total", labels]),
        publisher["replays"]["unstarted"],
        publisher["missed"],
        publisher["malformed"],
    )


class Recording(zmq.Context):
    """A real context that keeps every socket it makes, to see each one closed."""

    made: list[zmq.Socket]  # declared: pyzmq takes any other attribute for a context option

    def __init__(self) -> None:
        super().__init__()
        self.made = []

    def socket(self, socket_type: int, **kwargs: object) -> zmq.Socket:
        sock = super().socket(socket_type, **kwargs)
        self.made.append(sock)
        return sock


def test_a_replay_whose_connect_fails_closes_its_socket() -> None:
    """The socket was made, then left open when ``connect`` raised: a file descriptor held
    until the garbage collector found it, one per gap while the endpoint stayed refused."""
    ctx = Recording()
    state = PublisherState(PublisherEndpoints(free_tcp_endpoint(), UNCONNECTABLE))
    try:
        with pytest.raises(zmq.ZMQError) as refused:
            Replay(
                ctx,
                state,
                UNCONNECTABLE,
                False,
                IngestConfig(),
                first=1,
                upto=2,
                trigger=None,
                is_gap=True,
            )
        assert refused.value.errno == errno.ENAMETOOLONG
        assert len(ctx.made) == 1 and ctx.made[0].closed
    finally:
        ctx.destroy(linger=0)


@contextmanager
def no_descriptor_left() -> Iterator[None]:
    """This process can open no file descriptor until the block ends, even one closed
    meanwhile: the soft limit is lowered to 3, and 0, 1 and 2 are open (a new descriptor
    takes the lowest number free, which must be under the limit)."""
    for fd in (0, 1, 2):
        os.fstat(fd)  # open, or this raises
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_frames_dropped_while_held_whose_replay_cannot_start_are_one_gap_when_the_next_shows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The replay of frames dropped while a replay held later ones could not have a socket
    (no file descriptor left): the failure got out of the first replay's end, and that gap
    was counted there and again when the next frame showed it."""
    caplog.set_level(logging.ERROR, logger="app.ingest")
    with dropped_while_held() as held:
        state, raw = held.state, held.raw
        with no_descriptor_left():
            held.gate.set()
            wait_until(lambda: state.replays["unstarted"] == 1, "the next replay fails")
        assert (state.last_seq, state.gaps, state.missed) == (7, 1, 0)
        raw.send(29, held.payloads[29])  # shows the gap of the dropped frames, replayed now
        wait_until(lambda: state.last_seq == 29, "everything applied in the end")
        assert (state.gaps, state.missed, state.malformed) == (2, 0, 0)
        assert state.replays["complete"] == raw.replay_requests == 2
        assert held.ingestor.state.ingest_faults == 0
        with held.ingestor.state.lock:
            assert all(held.ingestor.state.index.get(seq) is not None for seq in range(30))
    [line] = unstarted_lines(caplog)
    assert "Too many open files" in line.getMessage()
