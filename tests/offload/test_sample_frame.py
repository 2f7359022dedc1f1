"""The sampled access stream on the worker's side: frames, the buffer, the publisher's queue.

The sampler is the real SpatialSampler; frames go through the real encoder
and decoder, and the publisher is a real EventPublisher with a subscriber on
loopback. Waits poll a condition (tests/support/polling.py).
"""

from __future__ import annotations

import msgspec
import pytest
import zmq

from offload.insight.sampling import SpatialSampler
from offload.wire.framing import DEFAULT_SAMPLE_TOPIC, decode_seq
from offload.wire.publisher import EventPublisher
from offload.wire.sample_buffer import SampleBuffer
from offload.wire.sample_frame import (
    InvalidSampleFrame,
    SampledRequest,
    SampleFrame,
    UnsupportedSampleVersion,
    decode_sample_frame,
    encode_sample_frame,
)
from offload.wire.stats_frame import WorkerConfig
from tests.support.polling import wait_until

pytestmark = pytest.mark.timeout(120)

CONFIG = WorkerConfig(policy="lru", capacity_blocks=100, block_size=16)


def taken(buffer: SampleBuffer) -> SampleFrame:
    """The buffer's frame as a reader decodes it."""
    frame = buffer.take("e0", 0, CONFIG)
    assert frame is not None
    return decode_sample_frame(encode_sample_frame(frame))


def test_a_buffer_frames_the_sample_and_counts_every_reference() -> None:
    sampler = SpatialSampler(0.25)
    buffer = SampleBuffer(sampler)
    requests = [list(range(start, start + 40)) for start in range(0, 4000, 40)]
    for request in requests:
        buffer.add(request)
    frame = buffer.take("e0", 3, CONFIG)
    assert frame is not None
    decoded = decode_sample_frame(encode_sample_frame(frame))
    assert (decoded.ts, decoded.engine_id, decoded.rank) == (frame.ts, "e0", 3)
    assert decoded.block_refs == 4000, "sampled or not, every reference is counted"
    assert decoded.sampled_refs == sum(len(sampler.sample(r)) for r in requests) > 0
    assert [r.sampled for r in decoded.requests] == [
        sampler.sample(r) for r in requests if sampler.sample(r)
    ]
    assert (decoded.rate, decoded.seed, decoded.config) == (0.25, 0, CONFIG)
    assert buffer.take("e0", 3, CONFIG) is None, "taken: the buffer starts over"


def test_a_full_buffer_sheds_whole_requests_and_counts_them_in_later_frames() -> None:
    buffer = SampleBuffer(SpatialSampler(1.0), max_bytes=16)  # [refs, [hash, ...]]: 3 + 1 each
    buffer.add(list(range(10)))
    buffer.add(list(range(10, 15)))  # does not fit: shed, blocks and count
    assert buffer.bytes == 13
    frame = taken(buffer)
    assert (frame.block_refs, frame.shed_requests, frame.shed_block_refs) == (10, 1, 5)
    buffer.add([99])
    later = taken(buffer)
    assert (later.shed_requests, later.shed_block_refs) == (1, 5)


BAD = {
    "more sampled than blocks": {"requests": [[1, [1, 2]]]},
    "hashes of two types": {"requests": [[3, [1, b"ab"]]]},
    "a rate of 0": {"rate": 0.0},
    "a rate below the least a worker runs": {"rate": 5e-7},
    "a rate above 1": {"rate": 1.5},
    "a negative count": {"unsampled_block_refs": -1},
    "a hash of 65 bytes": {"requests": [[1, [b"x" * 65]]]},
    "an empty sampled list": {"requests": [[1, []]]},
    "too many requests": {"requests": [[1, [1]]] * 16_385},
}


@pytest.mark.parametrize("change", BAD.values(), ids=BAD.keys())
def test_a_frame_that_breaks_a_rule_is_refused_whole(change: dict) -> None:
    frame = msgspec.to_builtins(SampleFrame(ts=1.0, engine_id="e", rank=0, config=CONFIG, rate=0.5,
                                            seed=0, requests=[SampledRequest(2, [1])]))  # fmt: skip
    frame.update(change)
    with pytest.raises((msgspec.ValidationError, InvalidSampleFrame)):
        decode_sample_frame(msgspec.msgpack.encode(frame))


def test_a_frame_of_another_major_version_is_refused_by_its_version() -> None:
    with pytest.raises(UnsupportedSampleVersion):
        decode_sample_frame(msgspec.msgpack.encode({"version": 2}))


def test_the_publisher_sends_sample_frames_numbered_on_their_own_topic() -> None:
    with EventPublisher("tcp://127.0.0.1:*") as publisher:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.SUBSCRIBE, DEFAULT_SAMPLE_TOPIC)
            sub.connect(publisher.endpoint)
            frame = SampleFrame(ts=1.0, engine_id="e", rank=0, config=CONFIG, rate=0.5, seed=0,
                                requests=[SampledRequest(2, [7])])  # fmt: skip

            def received() -> bool:
                """Publish one more (the first ones are lost until the subscription is live,
                and the one just published may already be the last one sent)."""
                publisher.publish_sample(frame)
                return sub.poll(10) != 0

            wait_until(received, "a sample frame arrives (slow joiner)")
            topic, seq, payload = sub.recv_multipart()
            assert topic == DEFAULT_SAMPLE_TOPIC and decode_sample_frame(payload) == frame
            first = decode_seq(seq)
            wait_until(received, "the next one")
            assert decode_seq(sub.recv_multipart()[1]) == first + 1
            # The publisher's thread counts a frame once its send returns, which may be after
            # the subscriber has it.
            wait_until(lambda: publisher.samples_published >= 2, "both frames counted as sent")
            assert publisher.batches_published == 0
        finally:
            ctx.destroy(linger=0)


def test_the_publishers_sample_queue_is_bounded_in_bytes_and_counts_what_it_drops() -> None:
    big = SampleFrame(ts=1.0, engine_id="e", rank=0, config=CONFIG, rate=1.0, seed=0,
                      requests=[SampledRequest(1000, list(range(1000)))])  # fmt: skip
    size = len(encode_sample_frame(big))
    # A flush interval no test outlasts: only the queue's bound can drop frames here.
    with EventPublisher("tcp://127.0.0.1:*", flush_interval=10, sample_queue_bytes=2 * size) as pub:
        for _ in range(5):
            pub.publish_sample(big)
        assert pub.samples_dropped == 3 and pub.dropped == 3
        assert pub._pending_sample_bytes <= 2 * size
