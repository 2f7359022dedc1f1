"""The shadow queue: its price of a frame's requests against what they really hold, and
each publisher's share of it."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Hashable

import pytest

from app.state.insight_queue import ACTIVE_S, ShadowQueue, ShadowWork, requests_bytes
from offload.base import BlockHash
from offload.wire.sample_frame import (
    SampledRequest,
    SampleFrame,
    decode_sample_frame,
    encode_sample_frame,
)
from offload.wire.stats_frame import WorkerConfig


def frame_of(requests: list[list[BlockHash]]) -> bytes:
    return encode_sample_frame(
        SampleFrame(
            ts=1.0,
            engine_id="engine",
            rank=0,
            config=WorkerConfig(policy="lru", capacity_blocks=1_000, block_size=16),
            rate=1.0,
            seed=0,
            requests=[SampledRequest(len(r) + 300, r) for r in requests],
        )
    )


SHAPES = {
    "one small int each": [[1_000 + i] for i in range(10_000)],
    "one 64-bit int each": [[2**63 + i] for i in range(10_000)],
    "long int requests": [[2**40 + 1_000 * r + i for i in range(1_000)] for r in range(40)],
    "sha-256 bytes": [[(r * 100 + i).to_bytes(32, "big") for i in range(100)] for r in range(200)],
}


@pytest.mark.parametrize("requests", list(SHAPES.values()), ids=list(SHAPES))
def test_the_price_of_a_frames_requests_covers_what_they_hold(
    requests: list[list[BlockHash]],
) -> None:
    """What a queued item keeps alive, the decoded lists, hashes and counts the shadow
    tiers will replay, is at most its price, and the price is not inflated past 1.5x."""
    payload = frame_of(requests)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        frame = decode_sample_frame(payload)
        sampled = [r.sampled for r in frame.requests]
        counts = [r.block_refs for r in frame.requests]
        del frame
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    price = requests_bytes(sampled, counts)
    assert held <= price <= 1.5 * held, (held, price)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def item(owner: Hashable, size: int, shed: list[Hashable] | None = None) -> ShadowWork:
    return ShadowWork(
        lambda pace: None, lambda: None if shed is None else shed.append(owner), size, owner
    )


def test_a_publisher_alone_has_the_whole_queue() -> None:
    queue = ShadowQueue(1_000, Clock())
    assert all(queue.put(item("a", 100)) for _ in range(10))
    assert not queue.put(item("a", 1))
    assert (queue.bytes, queue.items, queue.shed) == (1_000, 10, 1)


def test_a_flooding_publisher_sheds_its_own_frames_not_the_others() -> None:
    clock = Clock()
    queue = ShadowQueue(1_000, clock)
    shed: list[Hashable] = []
    assert queue.put(item("quiet", 100, shed))
    # The flood takes its half and no more, however often it asks ...
    flooded = [queue.put(item("flood", 100, shed)) for _ in range(20)]
    assert flooded.count(True) == 5
    assert shed == ["flood"] * 15
    # ... so the quiet one's frames still get in, up to its own half.
    assert all(queue.put(item("quiet", 100, shed)) for _ in range(4))
    assert not queue.put(item("quiet", 100, shed))
    assert queue.bytes == 1_000 and queue.shed == 16


def test_a_share_grows_back_once_the_others_stop_sending() -> None:
    clock = Clock()
    queue = ShadowQueue(1_000, clock)
    assert queue.put(item("gone", 100))
    assert queue.get(0) is not None
    assert [queue.put(item("left", 300)) for _ in range(2)] == [True, False]
    clock.now += ACTIVE_S + 1
    assert queue.put(item("left", 300))
    assert queue.put(item("left", 300))
    assert queue.bytes == 900


def test_what_an_owner_holds_falls_as_its_items_leave() -> None:
    queue = ShadowQueue(1_000, Clock())
    for size in (0, 0, 200, 300):
        assert queue.put(item("a", size))
    assert queue.put(item("b", 400))
    taken = [queue.get(0) for _ in range(4)]
    assert [w.bytes for w in taken if w is not None] == [0, 0, 200, 300]
    # "a" holds nothing now: its half is free again, "b" still holds its 400.
    assert queue.put(item("a", 500))
    assert not queue.put(item("b", 200))
    assert queue.bytes == 900


def test_a_flood_that_came_first_gives_up_its_share_once_another_publisher_asks() -> None:
    """An owner refused for a full queue was not counted as asking, so a flood that filled
    the queue first kept all of it, and every frame of the others was shed."""
    queue = ShadowQueue(1_000, Clock())
    assert all(queue.put(item("flood", 100)) for _ in range(10))
    assert not queue.put(item("quiet", 100)), "the queue is full"
    queue.get(0)
    assert not queue.put(item("flood", 100)), "the flood holds over its half now"
    assert queue.put(item("quiet", 100)), "the place it left is the quiet one's"
