"""A flood of garbage writes a few summary lines, never the peer's bytes (issue 15, item 15).

Every malformed frame used to log a line (with a traceback); a garbage
replay flood wrote 244,504 warnings in 10 s. Lines are now rate-limited per
publisher and kind of problem, and say how many they stand for.
"""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from offload.wire import publisher as publisher_module
from offload.wire.log_limit import DEFAULT_INTERVAL_S, LogLimiter
from offload.wire.publisher import EventPublisher
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, ingesting, wait_connected

pytestmark = pytest.mark.timeout(120)

MARK = b"SECRET-PEER-BYTES"


def test_a_garbage_flood_logs_a_line_or_two_without_the_peer_bytes(caplog) -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            caplog.set_level(logging.DEBUG, logger="app.ingest")
            started = time.monotonic()
            # In rounds below ZMQ's high-water mark (1,000 messages), so that a busy
            # machine's slower ingest never makes the PUB socket drop some of them.
            for first in range(0, 3000, 250):
                for seq in range(first, first + 250):
                    raw.pub.send_multipart([b"", seq.to_bytes(8, "big")[:7], MARK])
                    raw.pub.send_multipart([MARK])
                sent = 2 * (first + 250)
                wait_until(lambda sent=sent: state.malformed == sent, "every frame counted")
            intervals = 1 + int((time.monotonic() - started) / DEFAULT_INTERVAL_S)
    finally:
        raw.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "app.ingest"]
    # Two kinds of problem, each a first line and then at most one per interval
    # (a busy machine may stretch the flood over more than one).
    assert 1 <= len(lines) <= 2 * (1 + intervals)
    assert not any(MARK.decode() in line for line in lines)


def test_malformed_replay_requests_log_a_line_not_one_each(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The publishers' limiter is the module's: a line another test wrote within its
    # interval would hold this test's first line back. A fresh one starts this test clean.
    monkeypatch.setattr(publisher_module, "_log", LogLimiter(publisher_module.logger))
    caplog.set_level(logging.DEBUG, logger="offload.wire.publisher")
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(publisher.replay_endpoint)
        for _ in range(2000):
            dealer.send_multipart([MARK])
        wait_until(lambda: publisher.malformed_replay_requests == 2000, "every request counted")
        ctx.destroy(linger=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "offload.wire.publisher"]
    assert 1 <= len(lines) <= 2


def test_a_limiter_writes_the_first_line_then_one_per_interval_with_the_count() -> None:
    now = [0.0]
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    log = logging.getLogger("test.limiter")
    log.addHandler(Collect())
    log.propagate = False
    limiter = LogLimiter(log, interval_s=10.0, clock=lambda: now[0])
    for step in range(100):
        now[0] = step * 0.5  # 50 s of one problem twice a second
        limiter.log(logging.WARNING, "k", "bad frame")
    assert len(records) == 5
    assert records[0] == "bad frame"
    assert records[1] == "bad frame (and 19 more like it since the last such line)"
