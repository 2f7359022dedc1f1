"""A peer's resets cost the index a walk per batch at most, and none while it stores little
(a walk more only after it stored an eighth of the index since its last: about what the
walk costs).

Each "AllBlocksCleared" walked every block of the index, whoever held it: a
1 MB frame of them, a store of one block before each, held the ingest thread
and the index lock (so every API request) for half an hour with a million
blocks tracked; and each frame that cleared a publisher or restarted its
sequence paid the walk, though it held one block or none. The frames here are the bytes a
peer sends, decoded as the ingest thread decodes them; what is counted is the
dicts of held-block records walked whole (the index keeps ``SHARDS`` of them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import msgspec

from app.decode import decode_kv_payload
from app.state.block_index import RESET_TRACKED, BlockIndex
from app.state.held_block import HeldBlock
from app.state.shards import SHARDS

HONEST_BLOCKS = 20_000


def record_dicts_walked(action: Callable[[], None]) -> int:
    """How many dicts of held-block records ``action`` walked (called ``values()`` of)."""
    walked = 0

    def profile(_frame: object, event: str, arg: object) -> None:
        nonlocal walked
        owner = getattr(arg, "__self__", None)
        if event == "c_call" and getattr(arg, "__name__", "") == "values" and owner:
            walked += isinstance(owner, dict) and isinstance(next(iter(owner.values())), HeldBlock)

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return walked


def frame(*events: dict) -> bytes:
    """A KV-event payload in vLLM's map form, as a peer would write it."""
    return msgspec.msgpack.encode([1.0, list(events)])


def stored(*hashes: int) -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "medium": "CPU"}


CLEARED = {"type": "AllBlocksCleared"}


def honest_index() -> BlockIndex:
    index = BlockIndex(max_blocks=2 * HONEST_BLOCKS)
    index.apply("honest", decode_kv_payload(frame(stored(*range(HONEST_BLOCKS)))), now=0.0)
    return index


def test_a_batch_of_stores_and_clears_walks_the_index_once() -> None:
    index = honest_index()
    hostile = frame(*(event for n in range(500) for event in (stored(10**9 + n, n), CLEARED)))
    hostile_then_kept = frame(stored(7), CLEARED, stored(10**9, 5, 10**9 + 1))
    batch = decode_kv_payload(hostile)

    walked = record_dicts_walked(lambda: index.apply("peer", batch, now=1.0))

    assert walked <= SHARDS  # every dict holding a record, 500 times, before
    assert len(index) == HONEST_BLOCKS  # every block the peer stored went with a clear
    three = index.get(3)
    assert three is not None and three.publishers == ("honest",)  # and the peer's copy of it
    index.apply("peer", decode_kv_payload(hostile_then_kept), now=2.0)
    assert len(index) == HONEST_BLOCKS + 2  # what it stored after its last clear stays
    peer = {row.medium: row.blocks for row in index.usage() if row.publisher == "peer"}
    assert peer == {"CPU": 3}
    five = index.get(5)
    assert five is not None and five.publishers == ("honest", "peer")
    seven = index.get(7)
    assert seven is not None and seven.publishers == ("honest",)


def test_resetting_a_publisher_that_holds_nothing_walks_nothing() -> None:
    index = honest_index()
    index.apply("peer", decode_kv_payload(frame(stored(10**9), CLEARED)), now=1.0)

    def clears_and_restarts() -> None:
        for _ in range(100):
            index.apply("peer", decode_kv_payload(frame(CLEARED)), now=2.0)
            index.reset_publisher("peer")  # what a restarted sequence does

    assert record_dicts_walked(clears_and_restarts) == 0
    assert len(index) == HONEST_BLOCKS


def test_resets_between_frames_look_only_at_what_was_stored_since() -> None:
    index = honest_index()
    index.apply("peer", decode_kv_payload(frame(stored(10**9))), now=1.0)
    first = record_dicts_walked(lambda: index.reset_publisher("peer"))  # untracked till now

    def restarts() -> None:  # a sequence restarted with every frame, one block stored each
        for n in range(100):
            index.apply("peer", decode_kv_payload(frame(stored(10**9 + n, n))), now=2.0)
            index.reset_publisher("peer")

    assert 0 < first <= SHARDS
    assert record_dicts_walked(restarts) == 0  # 100 walks before
    assert len(index) == HONEST_BLOCKS
    three = index.get(3)
    assert three is not None and three.publishers == ("honest",)


def test_a_publisher_that_stored_more_than_the_bound_since_its_reset_is_walked_whole() -> None:
    index = honest_index()
    index.reset_publisher("peer")
    many = range(10**9, 10**9 + RESET_TRACKED + 1)
    index.apply("peer", decode_kv_payload(frame(stored(*many), stored(5))), now=1.0)

    assert 0 < record_dicts_walked(lambda: index.reset_publisher("peer")) <= SHARDS
    assert len(index) == HONEST_BLOCKS
    five = index.get(5)
    assert five is not None and five.publishers == ("honest",)
