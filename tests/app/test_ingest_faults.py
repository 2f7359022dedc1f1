"""Faults of the sidecar's own in the ingest thread: counted, logged a few lines at most, and
ingest goes on.

Before, a fault in a step of the loop's turn (a replay's expiry, the young collection, the
history's sample) got out of the loop and ended the thread silently: no line in the log,
no publisher read from then on, and the probes still answered 200; and a batch the index
failed part-way was applied again by the replay the next frame asked for. A step that
fails here is a subclass of the real ``Ingestor`` or ``BlockIndex`` overriding that one
step, since nothing a peer sends reaches those failures; everything else is real (sockets
on loopback, the index, the app). Waits poll a condition; nothing asserts on time.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.decode import DecodedEvent
from app.ingest import Ingestor
from app.ingest import ingestor as ingestor_module
from app.settings import SidecarSettings
from app.state.block_index import BlockIndex
from app.state.event_log import EventLog
from app.state.sidecar import SidecarState
from offload.base import OffloadingEvent
from offload.wire.log_limit import LogLimiter
from tests.support.http_app import in_process
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, kv_payload, wait_connected

pytestmark = pytest.mark.timeout(120)


def stored(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, "CPU", False)


class ExpiryWithoutDescriptors(Ingestor):
    """A real ingest thread whose replays' expiry fails every turn, with the error a replay's
    socket refused for want of file descriptors raises (which once got out of the expiry)."""

    def _expire_replays(self) -> None:
        raise zmq.ZMQError(errno.EMFILE)


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh limiter: a line another test wrote within its interval would hold one back."""
    monkeypatch.setattr(ingestor_module, "_log", LogLimiter(ingestor_module.logger))


@pytest.mark.usefixtures("fresh_log")
def test_a_step_failing_every_turn_is_counted_logged_once_and_ingest_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="app.ingest")
    raw = RawPublisher()
    state = SidecarState(BlockIndex(1000), EventLog(1000), (raw.endpoints,))
    ingestor = ExpiryWithoutDescriptors(state)
    ingestor.start()
    try:
        publisher = wait_connected(raw, ingestor)
        raw.send(0, kv_payload(stored(1)))
        wait_until(lambda: publisher.last_seq == 0, "a batch applied after the faults")
        wait_until(lambda: state.ingest_faults >= 20, "the loop turns on, failing each time")
        wait_until(lambda: state.history.series > 0, "the other steps still run")
        raw.send(1, kv_payload(stored(2)))
        wait_until(lambda: publisher.last_seq == 1, "later batches applied too")
        settings = SidecarSettings(connect=[raw.endpoints.endpoint])
    finally:
        ingestor.close()
        raw.close()
    with in_process(create_app(settings, state)) as http:
        assert http.get("/healthz").status_code == 200  # closed is not stopped
        families = text_string_to_metric_families(http.get("/metrics").text)
        faults = next(f for f in families if f.name == "kvscope_sidecar_ingest_faults")
        assert faults.samples[0].value >= 20
    lines = [r for r in caplog.records if r.name == "app.ingest"]
    # the first line at once, then at most one a 10 s interval (the test takes a few seconds)
    assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]
    assert lines[0].getMessage() == "skipped _expire_replays"
    assert lines[0].exc_info is not None and lines[0].exc_info[0] is zmq.ZMQError


class Fatal(BaseException):
    """What no handler in the loop catches, as a fault inside a handler itself would get out."""


class ExpiryThatEndsTheThread(Ingestor):
    """A real ingest thread whose replays' expiry raises what the loop does not get past."""

    def _expire_replays(self) -> None:
        raise Fatal("the ingest thread's end")


def test_an_ingest_thread_that_ends_turns_healthz_to_503_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An orchestrator restarts a sidecar whose liveness probe fails; one that reads no
    publisher any more answered 200 for as long as it ran."""
    caplog.set_level(logging.ERROR, logger="app.ingest")
    raw = RawPublisher()
    state = SidecarState(BlockIndex(1000), EventLog(1000), (raw.endpoints,))
    ingestor = ExpiryThatEndsTheThread(state)
    app = create_app(SidecarSettings(connect=[raw.endpoints.endpoint], token="s3cret"), state)
    try:
        with in_process(app) as http:
            assert http.get("/healthz").json() == {"status": "ok"}
            ingestor.start()
            wait_until(lambda: state.ingest_stopped, "the thread ends")
            answer = http.get("/healthz")  # open: no token, as orchestrators call it
            assert (answer.status_code, answer.json()) == (503, {"status": "ingest stopped"})
    finally:
        ingestor.close()
        raw.close()
    [line] = [r for r in caplog.records if r.name == "app.ingest"]
    assert line.levelno == logging.CRITICAL
    assert line.exc_info is not None and line.exc_info[0] is Fatal


FAULTY = 666
"""The block whose store the failing index cannot make."""


class StoreThatFails(BlockIndex):
    """A real index that fails storing ``FAULTY``, as a bug or MemoryError part-way through a
    batch would: the batch's events before it are in."""

    def _store(self, publisher: str, event: DecodedEvent, now: float) -> Iterator[int]:
        if FAULTY in event.block_hashes:
            raise MemoryError
        return super()._store(publisher, event, now)


@pytest.mark.usefixtures("fresh_log")
def test_a_batch_that_fails_part_way_is_applied_once_its_fault_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its number was left unused: the next frame showed a gap, whose replay applied the same
    batch again (and failed again, at the same place)."""
    caplog.set_level(logging.ERROR, logger="app.ingest")
    raw = RawPublisher()
    state = SidecarState(StoreThatFails(1000), EventLog(1000), (raw.endpoints,))
    ingestor = Ingestor(state)
    ingestor.start()
    try:
        publisher = wait_connected(raw, ingestor)
        raw.send(0, kv_payload(stored(1)))
        raw.send(1, kv_payload(stored(2), stored(FAULTY), stored(3)))
        raw.send(2, kv_payload(stored(4)))
        wait_until(lambda: publisher.last_seq == 2, "the batch after it applied")
        assert (publisher.gaps, publisher.missed, publisher.replayed) == (0, 0, 0)
        assert (publisher.malformed, publisher.batches_applied, state.ingest_faults) == (0, 3, 1)
        assert raw.replay_requests == 0
        with state.lock:
            held = {h for h in (1, 2, 3, 4, FAULTY) if state.index.get(h) is not None}
        assert held == {1, 2, 4}  # the part applied before the fault stays
        assert state.event_log.last_id == 5  # what the publisher sent, every event
    finally:
        ingestor.close()
        raw.close()
    [line] = [r for r in caplog.records if r.name == "app.ingest"]
    assert line.exc_info is not None and line.exc_info[0] is MemoryError
