"""vLLM's own GPU prefix cache with several KV cache groups, read by the sidecar.

A hybrid model (sliding-window and full-attention layers) keeps one copy of a
block per KV cache group in one block pool, and vLLM's ``BlockPool`` announces
each copy on its own: a ``BlockStored`` and later a ``BlockRemoved`` per group,
naming the same raw hash with its ``group_idx``. The events here are the real
pool's, encoded as vLLM's publisher encodes them, decoded and applied by the
sidecar.
"""

from __future__ import annotations

import msgspec
import pytest
from vllm import SamplingParams
from vllm.distributed.kv_events import KVEventBatch
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.request import Request

from app.api.schemas import Event
from app.decode import decode_kv_payload
from app.state.block_index import BlockIndex, Usage
from app.state.event_log import LoggedEvent

BLOCK_TOKENS = 16
BLOCKS = 4


@pytest.fixture
def pool() -> BlockPool:
    init_none_hash(sha256)
    return BlockPool(
        num_gpu_blocks=2 * BLOCKS + 1,  # block 0 is vLLM's null block
        enable_caching=True,
        hash_block_size=BLOCK_TOKENS,
        enable_kv_cache_events=True,
    )


def _applied(pool: BlockPool, index: BlockIndex, now: float) -> list[Event]:
    """The pool's events since the last call, as vLLM publishes them, into ``index``; and
    as the API shows them."""
    payload = msgspec.msgpack.encode(KVEventBatch(ts=now, events=pool.take_events()))
    batch = decode_kv_payload(payload)
    index.apply("vllm", batch, now)
    return [Event.of(LoggedEvent(0, "vllm", 0, now, event)) for event in batch.events]


def test_a_block_stays_on_the_gpu_while_one_kv_cache_group_holds_it(pool: BlockPool) -> None:
    hasher = get_request_block_hasher(BLOCK_TOKENS, sha256)
    prompt = list(range(BLOCKS * BLOCK_TOKENS))
    request = Request("r", prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)
    full, sliding = pool.get_new_blocks(BLOCKS), pool.get_new_blocks(BLOCKS)
    pool.cache_full_blocks(request, full, 0, BLOCKS, BLOCK_TOKENS, kv_cache_group_id=0)
    pool.cache_full_blocks(request, sliding, 0, BLOCKS, BLOCK_TOKENS, kv_cache_group_id=1)
    index = BlockIndex(max_blocks=100)
    assert [event.group for event in _applied(pool, index, 1.0)] == [0, 1]
    hashes = [maybe_convert_block_hash(h) for h in request.block_hashes]  # as events name them
    assert len(index) == BLOCKS
    assert index.usage() == [Usage("vllm", "GPU", 2 * BLOCKS, None)], "a copy per group"

    pool.free_blocks(sliding)  # the sliding window moved past them: free, then reused
    pool.get_new_blocks(BLOCKS)
    _applied(pool, index, 2.0)

    assert index.lookup_prefix(hashes).runs == {"GPU": BLOCKS}, "the full group holds them"
    assert index.usage() == [Usage("vllm", "GPU", BLOCKS, None)]
    assert index.untracked_removals == 0
