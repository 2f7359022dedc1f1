"""vLLM 0.33's GPU prefix cache, driven through paths its plainer tests leave alone, read
by the sidecar's index: the index must hold exactly the hashes vLLM's pool caches, count
the copies the pool spends, and find the prefix vLLM would hit.

Everything is vLLM's own: ``KVCacheManager`` (or ``BlockPool``) makes the events, they
are encoded as vLLM's publisher encodes them (msgspec msgpack of a ``KVEventBatch``),
then decoded and applied by the sidecar. The pool's truth is read from its own map of
cached hashes.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
import torch
from vllm import SamplingParams
from vllm.distributed.kv_events import BlockStored, KVEventBatch
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

from app.decode import decode_kv_payload
from app.state.block_index import BlockIndex, PrefixMatch
from tests.vllm.kv_cache_configs import shared_pool_config

HASH_TOKENS = 16

init_none_hash(sha256)
HASHER = get_request_block_hasher(HASH_TOKENS, sha256)


def _full(block_size: int) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16
    )


def _window(block_size: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=32
    )


def _manager(specs: Sequence[KVCacheSpec], num_blocks: int) -> KVCacheManager:
    """vLLM's KV cache manager over one pool shared by ``specs``' groups, events on."""
    config = shared_pool_config(specs, num_blocks)
    return KVCacheManager(
        config,
        max_model_len=4096,
        scheduler_block_size=max(spec.block_size for spec in specs),
        hash_block_size=HASH_TOKENS,
        enable_caching=True,
        enable_kv_cache_events=True,
    )


def _request(name: str, tokens: list[int], report_all: bool = False, **kwargs: object) -> Request:
    extra = {"kv_cache_report_mode": "full"} if report_all else None
    params = SamplingParams(max_tokens=4, extra_args=extra)
    return Request(name, tokens, params, None, block_hasher=HASHER, **kwargs)  # type: ignore[arg-type]


def _prefill(manager: KVCacheManager, request: Request) -> int:
    """The scheduler's path for a whole prompt in one step: lookup, then allocation (which
    caches the full blocks). Returns the tokens the prefix cache hit."""
    blocks, hit, _ = manager.get_computed_blocks(request)
    allocated = manager.allocate_slots(
        request, request.num_tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks
    )
    assert allocated is not None
    request.num_computed_tokens = request.num_tokens
    return hit


def _apply(events: list, index: BlockIndex, now: float) -> None:
    """``events`` as vLLM's publisher sends them, into ``index``."""
    batch = decode_kv_payload(msgspec.msgpack.encode(KVEventBatch(ts=now, events=events)))
    assert batch.malformed == 0
    index.apply("vllm", batch, now)


def _pool_copies(pool: BlockPool) -> dict[object, int]:
    """Raw hash (as events name it) -> cache blocks the pool keys under it, all groups."""
    copies: dict[object, int] = {}
    for key, blocks in pool.cached_block_hash_to_block._cache.items():
        block_hash = maybe_convert_block_hash(get_block_hash(key))
        assert get_group_id(key) >= 0
        held = 1 if isinstance(blocks, KVCacheBlock) else len(blocks)
        copies[block_hash] = copies.get(block_hash, 0) + held
    return copies


def _assert_agrees(pool: BlockPool, index: BlockIndex) -> None:
    copies = _pool_copies(pool)
    assert {h for h in copies if index.get(h) is None} == set(), "cached, not indexed"
    assert len(index) == len(copies), "indexed, not cached"
    assert index.blocks_by_medium().get("GPU", 0) == sum(copies.values()), "copies spent"


def test_a_prompt_sent_again_keeps_its_last_block_while_one_copy_is_cached() -> None:
    """vLLM always recomputes a prompt's last token, so the same prompt of four whole
    blocks hits three and computes the fourth into a new cache block under the same hash
    (the pool does not deduplicate). When the first request's copy is evicted, the second
    request's copy is still cached and hit: the index must not drop the block with the
    first copy's removal."""
    manager = _manager([_full(16)], num_blocks=10)
    pool, index = manager.block_pool, BlockIndex(max_blocks=100)
    prompt = list(range(4 * 16))
    first = _request("first", prompt)
    _prefill(manager, first)
    manager.free(first)
    again = _request("again", prompt)
    assert _prefill(manager, again) == 3 * 16
    manager.free(again)
    _apply(manager.take_events(), index, 1.0)
    _assert_agrees(pool, index)  # five cache blocks for four hashes

    other = _request("other", list(range(1000, 1000 + 5 * 16)))
    _prefill(manager, other)  # the free queue gives up the first request's last block only
    _apply(manager.take_events(), index, 2.0)

    _assert_agrees(pool, index)
    chain = [maybe_convert_block_hash(h) for h in first.block_hashes]
    _blocks, hit, _ = manager.get_computed_blocks(_request("third", [*prompt, 1]))
    assert hit == 4 * 16
    assert index.lookup_prefix(chain).runs == {"GPU": 4}
    assert index.untracked_removals == 0


@pytest.mark.parametrize("specs", [(_full(16),), (_full(32), _window(16))], ids=str)
def test_a_full_report_of_prefix_hits_is_no_copy_and_no_reload(specs: tuple) -> None:
    """``kv_cache_report_mode`` "full" makes vLLM store every group's hit blocks again
    (``emit_cached_block_events``): no new copy and no reload, even while a lower tier
    holds the blocks; eviction then empties the index."""
    manager = _manager(specs, num_blocks=40)
    index = BlockIndex(max_blocks=100)
    prompt = list(range(6 * 16))
    first = _request("first", prompt)
    _prefill(manager, first)
    manager.free(first)
    _apply(manager.take_events(), index, 1.0)
    chain = [maybe_convert_block_hash(h) for h in first.block_hashes]
    cpu = BlockStored(chain, None, [], 16, None, "CPU", None)  # an offload tier's copies
    _apply([cpu], index, 1.5)
    gpu_before = index.blocks_by_medium()["GPU"]

    reader = _request("reader", [*prompt, 5], report_all=True)
    assert _prefill(manager, reader) == 6 * 16
    events = manager.take_events()
    assert len(events) == len(specs), "one report per group, nothing cached anew"
    assert all(event.parent_block_hash is None for event in events)
    _apply(events, index, 2.0)

    assert index.blocks_by_medium()["GPU"] == gpu_before
    assert [index.get(h).hits for h in chain] == [0] * len(chain)
    manager.free(reader)
    pool = manager.block_pool
    pool.get_new_blocks(pool.get_num_free_blocks())  # the free queue gives up every block
    _apply(manager.take_events(), index, 3.0)
    assert _pool_copies(pool) == {} and index.blocks_by_medium()["GPU"] == 0
    assert all(index.get(h).media == ("CPU",) for h in chain)


def test_a_sliding_window_groups_full_report_names_blocks_it_no_longer_holds() -> None:
    """A sliding-window group frees the blocks its window has passed, and the pool evicts
    them; a later request's "full" report still names its whole hit for that group (the
    freed blocks are vLLM's null blocks in it). The index must not count them held again:
    each report added them back, and no removal ever followed."""
    manager = _manager((_full(32), _window(16)), num_blocks=20)
    pool, index = manager.block_pool, BlockIndex(max_blocks=100)
    prompt = list(range(8 * 16))
    writer = _request("writer", prompt)
    _prefill(manager, writer)
    manager.remove_skipped_blocks("writer", writer.num_computed_tokens)  # the window moved
    other = _request("other", list(range(1000, 1000 + 8 * 16)))
    _prefill(manager, other)  # takes the blocks the window freed: evicts them
    manager.free(other)
    _apply(manager.take_events(), index, 1.0)
    _assert_agrees(pool, index)
    window_holds = {
        maybe_convert_block_hash(h) for h in writer.block_hashes if pool.get_cached_block(h, [1])
    }

    for step in range(3):
        reader = _request(f"reader{step}", [*prompt, 5], report_all=True)
        assert _prefill(manager, reader) == len(prompt)
        events = manager.take_events()
        report = next(e for e in events if isinstance(e, BlockStored) and e.group_idx == 1)
        assert set(report.block_hashes) > window_holds, "it names blocks the window freed"
        _apply(events, index, 2.0 + step)
        _assert_agrees(pool, index)
        manager.free(reader)
        _apply(manager.take_events(), index, 2.5 + step)
        _assert_agrees(pool, index)


def _window_passed(specs: tuple) -> tuple[KVCacheManager, BlockIndex, list[int], list]:
    """A prompt of eight 16-token blocks prefilled by a 32-token full-attention group and a
    16-token sliding-window group, the window moved past it and the fine blocks it freed
    evicted by another request, all applied to an index: the manager, the index, the prompt
    and its (fine) chain of hashes."""
    manager = _manager(specs, num_blocks=20)
    index = BlockIndex(max_blocks=100)
    prompt = list(range(8 * 16))
    writer = _request("writer", prompt)
    _prefill(manager, writer)
    manager.remove_skipped_blocks("writer", writer.num_computed_tokens)
    other = _request("other", list(range(1000, 1000 + 8 * 16)))
    _prefill(manager, other)
    manager.free(other)
    _apply(manager.take_events(), index, 1.0)
    chain = [maybe_convert_block_hash(h) for h in writer.block_hashes]
    assert index.get(chain[2]) is None, "h3 is cached nowhere"
    return manager, index, prompt, chain


HYBRID_ORDERS = pytest.mark.parametrize(
    "specs",
    [(_full(32), _window(16)), (_window(16), _full(32))],
    ids=["full-attention-first", "sliding-window-first"],
)


@HYBRID_ORDERS
def test_blocks_vllm_hits_are_not_stranded_whichever_group_stores_first(specs: tuple) -> None:
    """The 32-token group names a block by its last 16-token hash and chains it under the
    coarse block before (h4 under h2), the 16-token sliding-window group under the fine
    one (h4 under h3). The window passes the prompt and the pool evicts the fine blocks it
    freed, h3 among them, cached nowhere now; vLLM still hits the whole prompt, so no block
    of it is stranded, in either group order (with the window's group first, the index
    hung h4 under h3 and counted six copies stranded)."""
    manager, index, prompt, chain = _window_passed(specs)
    assert index.lookup_prefix(chain[1::2]).runs == {"GPU": 4}, "the coarse chain is held"

    assert _prefill(manager, _request("reader", [*prompt, 5])) == len(prompt)
    assert [row.stranded for row in index.usage()] == [0]


@HYBRID_ORDERS
def test_a_lookup_of_the_fine_chain_finds_the_prefix_vllm_hits(specs: tuple) -> None:
    """A request's own chain is of 16-token hashes: the lookup walks it past the blocks the
    window dropped (h3, h5), each covered by the coarse block after it, to the whole
    prompt vLLM hits (it stopped at h3)."""
    manager, index, prompt, chain = _window_passed(specs)
    assert index.get(chain[4]) is None, "h5 is cached nowhere"
    hit = _prefill(manager, _request("reader", [*prompt, 5]))
    assert index.lookup_prefix(chain) == PrefixMatch({"GPU": hit // HASH_TOKENS}, len(chain))


def test_partial_entries_promotion_and_replacement_follow_the_pool() -> None:
    """A partial entry names a hash block inside a bigger cache block (its event's block
    size is the hash block's, not the group's); promotion to the full block removes it
    and stores the full hash; ``replace_existing_hashes`` swaps them back; a second key on
    a cached block is a copy the pool drops with the block. LoRA, multimodal extra keys,
    a session and lookahead tokens ride along."""
    pool = BlockPool(
        num_gpu_blocks=4,
        enable_caching=True,
        hash_block_size=HASH_TOKENS,
        enable_kv_cache_events=True,
        num_hash_lookahead_tokens=2,
    )
    index = BlockIndex(max_blocks=100)
    image = MultiModalFeatureSpec(None, "image", "img-0", PlaceholderRange(offset=4, length=20))
    request = _request(
        "r",
        list(range(50)),
        lora_request=LoRARequest("adapter", 3, "/adapter"),
        mm_features=[image],
        session_id="s",
    )
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 1, 32, kv_cache_group_id=0)
    pool.cache_partial_block(request, blocks[1], 48, kv_cache_group_id=0, block_size=32)
    events = pool.take_events()
    assert [e.block_size for e in events] == [32, 16]
    assert events[1].lora_name == "adapter" and events[1].session_id == "s"
    _apply(events, index, 1.0)
    _assert_agrees(pool, index)

    request.append_output_token_ids(list(range(900, 916)))
    pool.cache_full_blocks(request, blocks, 1, 2, 32, kv_cache_group_id=0)  # promotion
    _apply(pool.take_events(), index, 2.0)
    _assert_agrees(pool, index)
    pool.cache_partial_block(request, blocks[1], 48, 0, 32, replace_existing_hashes=True)
    pool.cache_partial_block(request, blocks[0], 16, 0, 32)  # a second key, same block
    _apply(pool.take_events(), index, 3.0)
    _assert_agrees(pool, index)
    assert len(index) == 3

    pool.free_blocks(blocks)
    pool.get_new_blocks(3)  # evicts both blocks and all three keys
    _apply(pool.take_events(), index, 4.0)
    _assert_agrees(pool, index)
    assert len(index) == 0 and index.untracked_removals == 0


def test_a_prefix_cache_reset_clears_every_group_and_copy() -> None:
    manager = _manager((_full(32), _window(16)), num_blocks=40)
    index = BlockIndex(max_blocks=100)
    prompt = list(range(4 * 16))
    for name in ("a", "b"):
        request = _request(name, prompt)
        _prefill(manager, request)
        manager.free(request)
    _apply(manager.take_events(), index, 1.0)
    _assert_agrees(manager.block_pool, index)
    assert manager.reset_prefix_cache()
    _apply(manager.take_events(), index, 2.0)
    assert len(index) == 0 and index.blocks_by_medium() == {"GPU": 0}
    request = _request("c", prompt)
    assert _prefill(manager, request) == 0
    _apply(manager.take_events(), index, 3.0)
    _assert_agrees(manager.block_pool, index)
