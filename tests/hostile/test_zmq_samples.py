"""Sample frames a peer gets wrong are refused and counted; ones built to exhaust memory fit.

Each frame goes over real sockets from a raw publisher into a live ingest
thread; the test then checks the frame was counted as malformed, the curve
kept what it had, and a good frame after it is still applied. A frame that
is well formed but names a tier of 2^48 blocks must leave the simulations
within their memory bound (the sample is narrowed to fit).
"""

from __future__ import annotations

import math

import msgspec
import pytest

from app.state.insight import PublisherInsight
from offload.wire.framing import DEFAULT_SAMPLE_TOPIC
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, ingesting, wait_connected

pytestmark = pytest.mark.timeout(120)


def frame(**changes: object) -> dict:
    """A sample frame as a peer may write it: plain msgpack, so any value can be sent."""
    base = {
        "version": 1, "ts": 2.0, "engine_id": "e0", "rank": 0,
        "config": {"policy": "lru", "capacity_blocks": 64, "block_size": 16},
        "rate": 0.5, "seed": 0, "requests": [[3, [1, 2]]],
        "unsampled_requests": 1, "unsampled_block_refs": 4,
        "shed_requests": 0, "shed_block_refs": 0,
    }  # fmt: skip
    for key, value in changes.items():
        if key in base["config"]:
            base["config"][key] = value  # type: ignore[index]
        else:
            base[key] = value
    return base


BAD = {
    "not msgpack": b"\xc1\xc1",
    "not a map": msgspec.msgpack.encode([1, 2, 3]),
    "another major version": msgspec.msgpack.encode(frame(version=9)),
    "a NaN rate": msgspec.msgpack.encode(frame(rate=math.nan)),
    "a rate of 0": msgspec.msgpack.encode(frame(rate=0.0)),
    "a negative seed": msgspec.msgpack.encode(frame(seed=-1)),
    "an infinite ts": msgspec.msgpack.encode(frame(ts=math.inf)),
    "more sampled blocks than blocks": msgspec.msgpack.encode(frame(requests=[[1, [1, 2]]])),
    "int and bytes hashes in one request": msgspec.msgpack.encode(
        frame(requests=[[2, [1, b"\x01" * 32]]])
    ),
    "a 1 KiB hash": msgspec.msgpack.encode(frame(requests=[[1, [b"x" * 1024]]])),
    "an empty hash": msgspec.msgpack.encode(frame(requests=[[1, [b""]]])),
    "a hash that is a string": msgspec.msgpack.encode(frame(requests=[[1, ["abc"]]])),
    "a negative count": msgspec.msgpack.encode(frame(unsampled_block_refs=-5)),
    "a policy with a newline": msgspec.msgpack.encode(frame(policy="lru\n")),
    "a megabyte engine id": msgspec.msgpack.encode(frame(engine_id="e" * 2**20)),
    "a request of 2^20 blocks": msgspec.msgpack.encode(frame(requests=[[2**20, [1]]])),
}


def send(raw: RawPublisher, seq: int, payload: bytes) -> None:
    raw.pub.send_multipart([DEFAULT_SAMPLE_TOPIC, seq.to_bytes(8, "big"), payload])


@pytest.mark.parametrize("payload", BAD.values(), ids=BAD.keys())
def test_a_bad_sample_frame_is_refused_counted_and_the_curve_kept(payload: bytes) -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            send(raw, 0, msgspec.msgpack.encode(frame()))
            wait_until(lambda: state.insight is not None, "the good frame applied")
            insight = state.insight
            assert isinstance(insight, PublisherInsight)
            # the shadow thread replays the good frame on its own time: let it finish first
            wait_until(lambda: ingestor.state.insight.queue.unfinished == 0, "the shadows ran")
            before = insight.reading().curve
            send(raw, 1, payload)
            wait_until(lambda: state.malformed == 1, "the frame is counted as malformed")
            assert insight.frames == 1 and insight.reading().curve == before
            send(raw, 2, msgspec.msgpack.encode(frame()))
            wait_until(lambda: insight.frames == 2, "a good frame after it is applied")
    finally:
        raw.close()


def test_a_tier_of_two_to_the_48_blocks_is_simulated_within_the_memory_bound() -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            hashes = list(range(1, 4001))
            huge = frame(capacity_blocks=2**48, rate=1.0, requests=[[4000, hashes]])
            for seq in range(3):
                send(raw, seq, msgspec.msgpack.encode(huge))
            wait_until(lambda: state.insight is not None and state.insight.frames == 3, "applied")
            insight = state.insight
            assert insight is not None
            wait_until(lambda: ingestor.state.insight.queue.unfinished == 0, "the shadows ran")
            rates = insight.rates
            assert rates.stack is not None and rates.stack < 1e-6
            assert rates.shadows is not None and rates.shadows < 1e-6
            _, size = insight.memory()
            assert size <= insight.config.max_bytes
            assert state.malformed == 0
    finally:
        raw.close()
