"""One scripted sequence of vLLM-style calls, on kvscope's manager and on vLLM 0.33's own.

Requests overlap in prefixes, store in several batches, load what they hit,
sometimes fail a store, and finish; every answer and every event is
compared. With LRU the two must agree call for call.
"""

from __future__ import annotations

import random

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from bench.tooling.vllm_config import kvscope_manager, offloading_config

CAPACITY = 24


def _script(seed: int) -> list[tuple[str, list[int], bool]]:
    """Requests as (id, prefix of block hashes, whether the store fails)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10_000) for _ in range(rng.randint(4, 12))] for _ in range(6)]
    requests = []
    for number in range(60):
        shared = rng.choice(prefixes)
        blocks = shared[: rng.randint(1, len(shared))] + [
            rng.randrange(10_000, 20_000) for _ in range(rng.randint(0, 6))
        ]
        requests.append((f"req-{number}", blocks, rng.random() < 0.1))
    return requests


def _run(manager, script) -> list:
    """Drive a manager as vLLM's scheduler does; the trace of everything it answered."""
    trace: list = []
    for req_id, hashes, fail in script:
        keys = [make_offload_key(h.to_bytes(8, "big"), 0) for h in hashes]
        ctx = ReqContext(req_id=req_id)
        for place, key in enumerate(keys, 1):
            ctx.set_offload_key_position(key, place * 16)
        manager.on_new_request(ctx)
        hits = 0
        for key in keys:
            result = manager.lookup(key, ctx)
            trace.append(("lookup", result))
            if result is not LookupResult.HIT:
                break
            hits += 1
        if hits:
            spec = manager.prepare_load(keys[:hits], ctx)
            trace.append(("load", spec.block_ids.tolist()))
            manager.touch(keys[:hits], ctx)
        for start in range(hits, len(keys), 3):
            batch = keys[start : start + 3]
            output = manager.prepare_store(batch, ctx)
            if output is None:
                trace.append(("store", None))
                continue
            trace.append(
                (
                    "store",
                    output.keys_to_store,
                    output.store_spec.block_ids.tolist(),
                    output.evicted_keys,
                )
            )
            manager.complete_store(output.keys_to_store, ctx, success=not fail)
        if hits:
            manager.complete_load(keys[:hits], ctx)
        manager.on_request_finished(ctx)
        trace.append(
            ("events", [(e.keys, e.removed, e.metadata_only) for e in manager.take_events()])
        )
    return trace


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "publisher",
    [{}, {"kvscope_endpoint": "tcp://127.0.0.1:*", "sample_rate": 1}],
    ids=["alone", "publishing"],
)
def test_kvscope_answers_every_call_as_vllm_does_with_lru(seed: int, publisher: dict) -> None:
    """Also with kvscope's publisher, parents and sample on: they change no answer."""
    script = _script(seed)
    manager = kvscope_manager(CAPACITY, "lru", enable_events=True, **publisher)
    try:
        ours = _run(manager, script)
    finally:
        manager.shutdown()
    theirs = _run(CPUOffloadingManager(CAPACITY, "lru", enable_events=True), script)
    assert len(ours) == len(theirs)
    for step, (mine, vllms) in enumerate(zip(ours, theirs, strict=True)):
        assert mine == vllms, f"call {step} differs"
    assert any(entry[0] == "store" and entry[1] and entry[3] for entry in ours), "no eviction ran"


CHUNK = (7).to_bytes(8, "big")
GROUP_0, GROUP_1 = make_offload_key(CHUNK, 0), make_offload_key(CHUNK, 1)
"""One chunk's copies in two KV cache groups of 16-token chunks: one raw hash, one position."""
NEXT = make_offload_key((9).to_bytes(8, "big"), 0)


def _hybrid_request(req_id: str) -> ReqContext:
    ctx = ReqContext(req_id=req_id)
    for key, end in ((GROUP_0, 16), (GROUP_1, 16), (NEXT, 32)):
        ctx.set_offload_key_position(key, end)
    return ctx


def test_a_hybrid_models_copies_of_one_chunk_leave_in_vllms_order() -> None:
    """A chunk's copies in two groups share a running request's rank (one position); vLLM
    evicts the lower group's first (its heap breaks the tie by key). A request that stored
    only group 1's copy, then one that reuses it and stores group 0's beside it, ranks the
    two in the opposite order: kvscope evicted group 1's copy."""
    config = offloading_config({"num_cpu_blocks": 2}, events=True, tokens_per_block=(16, 16))
    evicted = []
    for manager in (
        OffloadingSpecFactory.create_spec(config).get_manager(),
        CPUOffloadingManager(2, "lru", enable_events=True),
    ):
        first = _hybrid_request("a")
        manager.complete_store(manager.prepare_store([GROUP_1], first).keys_to_store, first)
        manager.on_request_finished(first)
        second = _hybrid_request("b")
        manager.complete_store(
            manager.prepare_store([GROUP_0, GROUP_1], second).keys_to_store, second
        )
        evicted.append(manager.prepare_store([NEXT], _hybrid_request("c")).evicted_keys)
    ours, vllms = evicted
    assert vllms == [GROUP_0]
    assert ours == vllms


def test_a_failed_store_frees_its_slots_in_the_order_vllm_names_them() -> None:
    """vLLM completes a store with a set, in no order of its own: a failed store's slots go
    back in that order, the next store takes the most recently freed, and the rollback's
    event lists the keys so. kvscope freed them in write order (its stored events' order),
    so the store after a failure was given other slots than vLLM's manager gives."""
    keys = [make_offload_key(h.to_bytes(8, "big"), 0) for h in range(5)]
    answers = []
    for manager in (
        kvscope_manager(4, "lru", enable_events=True),
        CPUOffloadingManager(4, "lru", enable_events=True),
    ):
        ctx = ReqContext(req_id="failing")
        manager.prepare_store(keys[:3], ctx)
        manager.complete_store([keys[2], keys[0], keys[1]], ctx, success=False)
        rollback = [(e.keys, e.metadata_only) for e in manager.take_events()]
        output = manager.prepare_store(keys[3:], ReqContext(req_id="next"))
        answers.append((rollback, output.store_spec.block_ids.tolist()))
    ours, vllms = answers
    assert vllms == ([([keys[2], keys[0], keys[1]], True)], [3, 1])
    assert ours == vllms


def test_arc_under_vllm_loses_a_stored_prefix_tail_first_as_vllms_arc_does() -> None:
    """vLLM's connector never calls touch: a request's end is the one use of its blocks.
    kvscope's ARC left the blocks a request stored in T1 in store order, so the head of
    the prefix went first and the rest of it, still held, could no longer be hit (a
    lookup stops at the first miss). Found ones move to T2 then, as vLLM's ARC moves them."""
    prefix = [make_offload_key(h.to_bytes(8, "big"), 0) for h in range(1, 5)]
    later = [make_offload_key(h.to_bytes(8, "big"), 0) for h in range(5, 8)]
    evictions = []
    for manager in (
        kvscope_manager(4, "arc", enable_events=True),
        CPUOffloadingManager(4, "arc", enable_events=True),
    ):
        storing = ReqContext(req_id="storing")
        for place, key in enumerate(prefix, 1):
            storing.set_offload_key_position(key, place * 16)
        manager.complete_store(manager.prepare_store(prefix, storing).keys_to_store, storing)
        manager.on_request_finished(storing)
        reusing = ReqContext(req_id="reusing")
        manager.prepare_load(prefix[:2], reusing)
        manager.complete_load(prefix[:2], reusing)
        manager.on_request_finished(reusing)
        other = ReqContext(req_id="other")
        evicted = []
        for key in later:
            output = manager.prepare_store([key], other)
            manager.complete_store(output.keys_to_store, other)
            evicted += output.evicted_keys
        evictions.append(evicted)
    ours, vllms = evictions
    assert vllms == [prefix[3], prefix[2], later[0]]
    assert ours == vllms
