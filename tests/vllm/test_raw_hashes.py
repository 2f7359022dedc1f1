"""kvscope's publisher names CPU blocks by the raw block hashes vLLM's GPU events name.

vLLM's offload key is the hash of a chunk's last block followed by its KV
cache group; vLLM's GPU prefix cache names that block by the hash alone. The
tests drive kvscope's manager as vLLM's scheduler does (helpers of
test_sample_and_parents.py), read kvscope's frames on a real SUB socket,
decode them with vLLM's own event types, and feed them, beside vLLM-encoded
GPU events, to the sidecar's block index.
"""

from __future__ import annotations

import time

import msgspec
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

from app.decode import decode_kv_payload
from app.state.block_index import BlockIndex
from offload.wire.framing import DEFAULT_KV_TOPIC
from tests.support.polling import wait_until
from tests.vllm.test_sample_and_parents import (
    TOKENS_PER_CHUNK,
    Request,
    Scheduler,
    Subscriber,
    raw,
    subscribed,
)

_VLLM_EVENTS = msgspec.msgpack.Decoder(KVEventBatch)


def _events(vllm: Scheduler, subscriber: Subscriber, count: int) -> list:
    """kvscope's KV events, decoded with vLLM's types, once ``count`` have arrived."""

    def heard() -> list:
        vllm.step()  # the publisher sends at a step's end once its interval is over
        subscriber.read()
        return [
            event
            for payload in subscriber.frames.get(DEFAULT_KV_TOPIC, [])
            for event in _VLLM_EVENTS.decode(payload).events
        ]

    wait_until(lambda: len(heard()) >= count, f"{count} KV events")
    return heard()


def _run(vllm: Scheduler, request: Request, start: int, end: int) -> None:
    """A request looked up, offered ``keys[start:end]`` in one job, and finished."""
    vllm.manager.on_new_request(request.ctx)
    vllm.lookup(request)
    vllm.store(request, start, end)
    vllm.manager.on_request_finished(request.ctx)


def test_stored_then_evicted_chunks_name_raw_hashes_and_the_same_hashes_leave() -> None:
    with subscribed({"num_cpu_blocks": 4, "sample_rate": 0}, events=True) as (manager, sub):
        vllm = Scheduler(manager)
        first = Request("first", [1, 2, 3, 4])
        manager.on_new_request(first.ctx)
        vllm.lookup(first)
        vllm.store(first, 0, 2)
        vllm.store(first, 2, 4)
        manager.on_request_finished(first.ctx)
        _run(vllm, Request("second", [5, 6, 7, 8]), 0, 4)  # a full tier: evicts all of first
        events = _events(vllm, sub, 4)
        # vLLM's own stream keeps vLLM's offload keys.
        vllm_events = [(event.keys, event.removed) for event in manager.take_events()]
    assert [(e.block_hashes, e.parent_block_hash, e.block_size) for e in events[:2]] == [
        ([raw(1), raw(2)], None, TOKENS_PER_CHUNK),
        ([raw(3), raw(4)], raw(2), TOKENS_PER_CHUNK),
    ]
    assert isinstance(events[2], BlockRemoved) and isinstance(events[3], BlockStored)
    assert sorted(events[2].block_hashes) == [raw(1), raw(2), raw(3), raw(4)]
    assert (events[3].block_hashes, events[3].parent_block_hash) == (
        [raw(5), raw(6), raw(7), raw(8)],
        None,
    )
    assert {event.medium for event in events} == {"CPU"}
    assert vllm_events[0] == ([*first.keys[:2]], False)
    assert sorted(vllm_events[2][0]) == first.keys


def test_a_chunk_of_several_blocks_is_named_by_its_last_blocks_raw_hash() -> None:
    """Four 16-token blocks per chunk: vLLM keys chunk i by block 4i+3's hash."""
    chunk_tokens = 4 * TOKENS_PER_CHUNK
    extra = {"num_cpu_blocks": 3, "sample_rate": 0}
    with subscribed(extra, blocks_per_chunk=4) as (manager, sub):
        vllm = Scheduler(manager)
        first = Request("first", [3, 7, 11], chunk_tokens)
        manager.on_new_request(first.ctx)
        vllm.lookup(first)
        vllm.store(first, 0, 2)
        vllm.store(first, 2, 3)
        manager.on_request_finished(first.ctx)
        _run(vllm, Request("second", [15, 19, 23], chunk_tokens), 0, 3)
        events = _events(vllm, sub, 4)
    assert [(e.block_hashes, e.parent_block_hash, e.block_size) for e in events[:2]] == [
        ([raw(3), raw(7)], None, chunk_tokens),
        ([raw(11)], raw(7), chunk_tokens),  # the parent: the block just before the chunk
    ]
    assert isinstance(events[2], BlockRemoved)
    assert sorted(events[2].block_hashes) == [raw(3), raw(7), raw(11)]


def _gpu_batch(*hashes: int, parent: int | None = None) -> bytes:
    """vLLM's GPU prefix cache storing one run, encoded by vLLM's own types (no medium)."""
    stored = BlockStored(
        block_hashes=[raw(h) for h in hashes],
        parent_block_hash=None if parent is None else raw(parent),
        token_ids=[],
        block_size=TOKENS_PER_CHUNK,
        lora_id=None,
        medium=None,
        lora_name=None,
    )
    return msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=[stored]))


def test_the_sidecar_reaches_cpu_runs_under_gpu_blocks_and_counts_a_shared_block_once() -> None:
    with subscribed({"sample_rate": 0}) as (manager, sub):
        vllm = Scheduler(manager)
        # A failed first job leaves 40 out of the tier; 41 is stored under it.
        broken = Request("broken", [40, 41])
        manager.on_new_request(broken.ctx)
        vllm.lookup(broken)
        vllm.store(broken, 0, 1, success=False)
        vllm.store(broken, 1, 2)
        manager.on_request_finished(broken.ctx)
        _events(vllm, sub, 1)
        kvscope_frames = sub.frames[DEFAULT_KV_TOPIC]
    index, cpu_only = BlockIndex(1024), BlockIndex(1024)
    index.apply("vllm", decode_kv_payload(_gpu_batch(40)), 1.0)
    for payload in kvscope_frames:
        index.apply("kvscope", decode_kv_payload(payload), 2.0)
        cpu_only.apply("kvscope", decode_kv_payload(payload), 2.0)
    # 41's parent, 40, is held by the GPU alone: a lookup reaches 41 through it.
    assert len(index) == 2
    assert [row.stranded for row in index.usage()] == [0, 0]
    # Without the GPU's events the same CPU run hangs under a block held nowhere.
    assert [row.stranded for row in cpu_only.usage()] == [1]
    # The GPU caches 41 too: one block on both tiers.
    index.apply("vllm", decode_kv_payload(_gpu_batch(41, parent=40)), 3.0)
    held = index.get(raw(41))
    assert held is not None and sorted(held.media) == ["CPU", "GPU"]
    assert len(index) == 2
    assert index.blocks_by_medium() == {"GPU": 2, "CPU": 1}
    assert index.lookup_prefix([raw(40), raw(41)]).runs == {"GPU": 2, "CPU": 0}
