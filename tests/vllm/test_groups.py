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
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    get_offload_group_idx,
    make_offload_key,
)

from app.decode import decode_kv_payload
from app.state.block_index import BlockIndex
from bench.tooling.vllm_config import kvscope_manager
from offload.cpu.manager_metrics import manager_snapshot
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


def test_each_groups_copy_is_announced_with_its_group_and_indexed_as_a_copy() -> None:
    """Random requests over shared prefixes, two groups, a small tier, some failed stores:
    the stream announces each group's copy of a hash on its own, naming the group, as
    vLLM's own events do: never a copy held already, never the removal of one not held;
    the sidecar's index ends holding exactly the tier's hashes, a copy per key."""
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
            (bytes(key[:-4]), get_offload_group_idx(key))
            for key, block in manager.core.policy.blocks.items()
            if block.ref >= 0
        }
        events = _published(manager, subscriber)
        frames = subscriber.frames[DEFAULT_KV_TOPIC]
    announced: set[tuple[bytes, int]] = set()
    for event in events:
        copies = {(block, event.group_idx) for block in event.block_hashes}
        if isinstance(event, BlockStored):
            assert announced.isdisjoint(copies), "a held copy announced again"
            announced |= copies
        else:
            assert isinstance(event, BlockRemoved)
            assert copies <= announced, "a copy removed twice"
            announced -= copies
    assert any(isinstance(event, BlockRemoved) for event in events)
    assert announced == held_by_tier
    index = BlockIndex(1024)
    for payload in frames:
        index.apply("kvscope", decode_kv_payload(payload), 1.0)
    assert len(index) == len({block for block, _group in held_by_tier})
    assert all(index.get(block) is not None for block, _group in held_by_tier)
    assert index.blocks_by_medium() == {"CPU": len(held_by_tier)}


def test_each_groups_chain_begins_anew_in_one_offer() -> None:
    """A sliding-window group offers its last chunks, then a full group all of them: the
    full group's run hangs under its own chain, not under the other group's last chunk."""
    with subscribed({"sample_rate": 0}, tokens_per_block=(16, 16)) as (manager, subscriber):
        request = Request("r", [1, 2, 3, 4], (16, 16))
        manager.on_new_request(request.ctx)
        _store(manager, request, slice(2, 4), slice(0, 4))
        events = _published(manager, subscriber)
    assert [(e.block_hashes, e.parent_block_hash, e.group_idx) for e in events] == [
        ([raw(3), raw(4)], None, 0),  # the tier never met block 2 before it: not known
        ([raw(1), raw(2), raw(3), raw(4)], None, 1),
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
    assert [(e.block_hashes, e.parent_block_hash, e.block_size, e.group_idx) for e in events] == [
        ([raw(4)], None, 64, 1),
        ([raw(8)], raw(4), 64, 1),
        ([raw(12)], raw(8), 64, 1),
        ([raw(h) for h in range(1, 13)], None, 16, 0),  # group 0's own chain, whole
    ]


def test_a_coarse_groups_chain_reaches_what_the_fine_groups_copies_no_longer_do() -> None:
    """Group 0 (16 tokens) stores 1 to 4 before group 1 (32 tokens) stores 2 and 4, which it
    chains from the root (4 under 2). The tier then evicts group 0's copies of 1 and 2:
    group 1's chain still reaches 2 and 4, and 3 hangs under 2, still held. A stream that
    announced a hash once, under the first group's parent, left 2 under 1 (held nowhere):
    the sidecar counted 2, 3 and 4 stranded, and a lookup of the request's chain found
    nothing on the CPU."""
    with subscribed({"num_cpu_blocks": 6, "sample_rate": 0}, tokens_per_block=(16, 32)) as (
        manager,
        subscriber,
    ):
        request = Request("r", [1, 2, 3, 4], (16, 32))
        manager.on_new_request(request.ctx)
        _store(manager, request, slice(0, 4), slice(0, 2))
        manager.touch([*request.keys[0][2:], *request.keys[1]], request.ctx)
        other = Request("other", [11, 12], (16, 32))
        manager.on_new_request(other.ctx)
        _store(manager, other, slice(0, 2), slice(0, 0))  # the tier is full: 2 evictions
        assert {make_offload_key(raw(h), 0) for h in (1, 2)}.isdisjoint(manager.core.policy.blocks)
        events = _published(manager, subscriber)
        frames = subscriber.frames[DEFAULT_KV_TOPIC]
    assert (events[1].block_hashes, events[1].parent_block_hash, events[1].block_size) == (
        [raw(2), raw(4)],
        None,
        32,
    ), "group 1's copies, under group 1's chain"
    index = BlockIndex(64)
    for payload in frames:
        index.apply("kvscope", decode_kv_payload(payload), 1.0)
    assert [(row.blocks, row.stranded) for row in index.usage()] == [(6, 0)]
    assert index.lookup_prefix([raw(h) for h in (1, 2, 3, 4)]).runs == {"CPU": 4}


def test_each_groups_lookups_count_their_own_chunks_tokens() -> None:
    """A 16-token group and a 32-token one: a lookup of a group's key asks about, finds or
    loses that group's chunk of tokens (a miss on the 32-token group counted 16)."""
    manager = kvscope_manager(8, tokens_per_block=(16, 32))
    request = Request("r", [10, 20, 30, 40], (16, 32))
    _store(manager, request, slice(0, 1), slice(0, 1))  # each group's first chunk
    for group in (0, 1):
        manager.lookup(request.keys[group][0], request.ctx)  # hits
        manager.lookup(request.keys[group][1], request.ctx)  # misses: never stored
    hits = [request.keys[0][0], request.keys[1][0]]
    manager.prepare_load(hits, request.ctx)  # scheduled: its lookups count
    manager.complete_load(hits, request.ctx)
    manager.core.misses.flush()  # the last miss is charged when the counts settle
    counts = {
        (sample.name, sample.labels.get("reason")): sample.value
        for sample in manager_snapshot(manager.core).counters
    }
    assert counts[("kvscope_lookup_miss_blocks_total", "cold")] == 2
    assert counts[("kvscope_lookup_miss_tokens_total", "cold")] == 16 + 32
    assert counts[("kvscope_lookup_tokens_total", None)] == 2 * (16 + 32)
    assert counts[("kvscope_lookup_hit_tokens_total", None)] == 16 + 32


def test_a_key_of_a_group_the_config_does_not_name_counts_the_first_groups_tokens() -> None:
    """vLLM's manager takes a key of any group (its own tests store group 1's in a tier of
    one group): kvscope's looks it up too, as a chunk of the first group's tokens."""
    manager = kvscope_manager(8)  # one group, 16 tokens a chunk
    key, context = make_offload_key(raw(1), 1), ReqContext(req_id="r")
    assert manager.lookup(key, context) is LookupResult.MISS
    assert manager.prepare_store([key], context) is not None  # scheduled: its lookup counts
    manager.core.misses.flush()
    assert manager.core.misses.tokens["cold"] == 16
    assert manager.core.stats.lookup_tokens == 16
