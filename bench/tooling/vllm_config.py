"""vLLM 0.33's ``OffloadingConfig`` for kvscope's spec, as vLLM's connector would build it."""

from __future__ import annotations

from typing import Any

SPEC = {"spec_name": "KVScopeOffloadingSpec", "spec_module_path": "offload.vllm"}


def offloading_config(
    extra: dict[str, Any] | None = None,
    *,
    worker_kv_bytes_per_block: int = 4096,
    world_size: int = 1,
    blocks_per_chunk: int = 1,
    tokens_per_block: int | tuple[int, ...] = 16,
    events: bool = False,
    engine_id: str = "engine-0",
    data_parallel_rank: int = 0,
    data_parallel_size: int = 1,
) -> Any:
    """A real ``OffloadingConfig`` naming kvscope's spec, plus ``extra`` keys.

    ``tokens_per_block`` as a tuple gives one KV cache group per entry (a hybrid
    model), group i of layer ``layer.i``; the hash block is the smallest.
    """
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    sizes = tokens_per_block if isinstance(tokens_per_block, tuple) else (tokens_per_block,)
    return OffloadingConfig(
        groups=tuple(
            OffloadingGroupConfig(tokens, (f"layer.{group}",), group)
            for group, tokens in enumerate(sizes)
        ),
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=events,
        extra_config={**SPEC, **(extra or {})},
        engine_id=engine_id,
        model=OffloadingModelConfig(name="test-model", dtype="float16", max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=min(sizes), blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=world_size,
            tp_size=world_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=data_parallel_rank,
            data_parallel_size=data_parallel_size,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def kvscope_manager(
    num_chunks: int,
    cache_policy: str = "lru",
    enable_events: bool = False,
    store_threshold: int = 0,
    max_tracker_size: int = 64_000,
    tokens_per_block: int | tuple[int, ...] = 16,
    **extra: Any,
) -> Any:
    """A manager built the way vLLM builds one: its factory, kvscope's spec, get_manager().

    ``tokens_per_block`` as in ``offloading_config``: a tuple gives one KV cache group each.
    """
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = offloading_config(
        {
            "num_cpu_blocks": num_chunks,
            "eviction_policy": cache_policy,
            "store_threshold": store_threshold,
            "max_tracker_size": max_tracker_size,
            **extra,
        },
        events=enable_events,
        tokens_per_block=tokens_per_block,
    )
    return OffloadingSpecFactory.create_spec(config).get_manager()
