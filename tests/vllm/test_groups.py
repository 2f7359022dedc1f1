"""Several KV cache groups (hybrid models) on kvscope's publisher.

vLLM keys each group's copy of a chunk by the chunk's raw hash and the
group, offers every group's chunks in one store (group after group), and
gives each group its own tokens per block. The tests drive kvscope's manager
that way, built from a real ``OffloadingConfig`` with several groups, read
what reaches a live SUB socket with vLLM's own event types, and feed it to
the sidecar's block index.
"""

from __future__ import annotations

import random

import msgspec
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch
from vllm.v1.kv_offload.base import OffloadKey, ReqContext, make_offload_key

from app.decode import decode_kv_payload
from app.state.block_index import BlockIndex
from offload.vllm.manager import KVScopeManager
from offload.wire.framing import DEFAULT_KV_TOPIC
from tests.vllm.test_sample_and_parents import Scheduler, Subscriber, raw, subscribed

_VLLM_EVENTS = msgspec.msgpack.Decoder(KVEventBatch)


class Request:
    """A request's keys per group: group g's chunk i ends at token (i + 1) x its chunk."""

    def __init__(self, req_id: str, hashes: list[int], chunk_tokens: tuple[int, ...]) -> None:
        self.ctx = ReqContext(req_id=req_id)
        self.keys: list[list[OffloadKey]] = []
        for group, tokens in enumerate(chunk_tokens):
            step = tokens // min(chunk_tokens)  # a group's key is every step-th block's hash
            keys = [make_offload_key(raw(h), group) for h in hashes[step - 1 :: step]]
            for place, key in enumerate(keys, 1):
                self.ctx.set_offload_key_position(key, place * tokens)
            self.keys.append(keys)


def _store(manager: KVScopeManager, request: Request, *spans: slice, success: bool = True) -> None:
    """One offer of each group's chunks in ``spans`` (group after group), then the step's end."""
    keys = [key for group, span in enumerate(spans) for key in request.keys[group][span]]
    output = manager.prepare_store(keys, request.ctx)
    assert output is not None
    # vLLM completes a store with a set (scheduler.py: keys=set(keys_to_store)): any order.
    manager.complete_store(output.keys_to_store[::-1], request.ctx, success=success)
    Scheduler(manager).step()


def _published(manager: KVScopeManager, subscriber: Subscriber) -> list:
    """Every KV event the manager published, decoded with vLLM's types: the manager is shut
    down (it sends what is queued), then the socket read until nothing more comes."""
    manager.shutdown()
    quiet = 0
    while quiet < 10:
        before = len(subscriber.frames.get(DEFAULT_KV_TOPIC, []))
        subscriber.read()
        quiet = quiet + 1 if len(subscriber.frames.get(DEFAULT_KV_TOPIC, [])) == before else 0
    return [
        event
        for payload in subscriber.frames.get(DEFAULT_KV_TOPIC, [])
        for event in _VLLM_EVENTS.decode(payload).events
    ]


def test_a_chunk_every_group_holds_is_announced_once_and_leaves_with_its_last_copy() -> None:
    """Random requests over shared prefixes, two groups, a small tier, some failed stores:
    the stream never announces a held hash again nor removes one a group still holds, and
    the sidecar's index ends holding exactly the tier's hashes."""
    rng = random.Random(7)
    prefixes = [[rng.randrange(1, 1000) * 10 + n for n in range(6)] for _ in range(3)]
    with subscribed({"num_cpu_blocks": 7, "sample_rate": 0}, tokens_per_block=(16, 16)) as (
        manager,
        subscriber,
    ):
        for number in range(40):
            hashes = rng.choice(prefixes)[: rng.randint(2, 6)]
            request = Request(f"r{number}", hashes, (16, 16))
            manager.on_new_request(request.ctx)
            for start in range(0, len(hashes), 2):
                span = slice(start, start + 2)
                _store(manager, request, span, span, success=rng.random() > 0.1)
            manager.on_request_finished(request.ctx)
        held_by_tier = {
            bytes(key[:-4]) for key, block in manager.core.policy.blocks.items() if block.ref >= 0
        }
        events = _published(manager, subscriber)
        frames = subscriber.frames[DEFAULT_KV_TOPIC]
    announced: set[bytes] = set()
    for event in events:
        if isinstance(event, BlockStored):
            assert announced.isdisjoint(event.block_hashes), "a held hash announced again"
            announced.update(event.block_hashes)
        else:
            assert isinstance(event, BlockRemoved)
            assert set(event.block_hashes) <= announced, "a hash removed twice"
            announced.difference_update(event.block_hashes)
    assert any(isinstance(event, BlockRemoved) for event in events)
    assert announced == held_by_tier
    index = BlockIndex(1024)
    for payload in frames:
        index.apply("kvscope", decode_kv_payload(payload), 1.0)
    assert len(index) == len(held_by_tier)
    assert all(index.get(block) is not None for block in held_by_tier)


def test_each_groups_chain_begins_anew_in_one_offer() -> None:
    """A sliding-window group offers its last chunks, then a full group all of them: the
    full group's run hangs under its own chain, not under the other group's last chunk."""
    with subscribed({"sample_rate": 0}, tokens_per_block=(16, 16)) as (manager, subscriber):
        request = Request("r", [1, 2, 3, 4], (16, 16))
        manager.on_new_request(request.ctx)
        _store(manager, request, slice(2, 4), slice(0, 4))
        events = _published(manager, subscriber)
    assert [(e.block_hashes, e.parent_block_hash) for e in events] == [
        ([raw(3), raw(4)], None),  # the tier never met block 2 before it: not known
        ([raw(1), raw(2)], None),  # 3 and 4 are announced already
    ]


def test_a_groups_runs_carry_its_own_chunk_size_and_hang_under_its_own_chunks() -> None:
    """Group 1's blocks cover 64 tokens to group 0's 16: its key is every fourth block's hash."""
    with subscribed({"sample_rate": 0}, tokens_per_block=(16, 64)) as (manager, subscriber):
        request = Request("r", list(range(1, 13)), (16, 64))
        assert [key[:-4] for key in request.keys[1]] == [raw(4), raw(8), raw(12)]
        manager.on_new_request(request.ctx)
        for chunk in range(3):  # group 0 (a sliding window, say) offers nothing
            _store(manager, request, slice(0, 0), slice(chunk, chunk + 1))
        _store(manager, request, slice(0, 12), slice(3, 3))
        events = _published(manager, subscriber)
    assert [(e.block_hashes, e.parent_block_hash, e.block_size) for e in events] == [
        ([raw(4)], None, 64),
        ([raw(8)], raw(4), 64),
        ([raw(12)], raw(8), 64),
        # Group 0's chain, less the hashes group 1 announced, each run under its block before.
        ([raw(1), raw(2), raw(3)], None, 16),
        ([raw(5), raw(6), raw(7)], raw(4), 16),
        ([raw(9), raw(10), raw(11)], raw(8), 16),
    ]
