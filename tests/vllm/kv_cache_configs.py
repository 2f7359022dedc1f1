"""vLLM KV cache configs for tests that run vLLM's own cache manager without a model."""

from __future__ import annotations

from collections.abc import Sequence

from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
)


def shared_pool_config(specs: Sequence[KVCacheSpec], num_blocks: int) -> KVCacheConfig:
    """One KV cache group per spec (layer ``layer.I``) over one pool of ``num_blocks``, each
    group's layer in a tensor of its own, as vLLM's hybrid allocator lays them out."""
    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
    stride = max(spec.page_size_bytes for spec in specs)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(
                size=stride * num_blocks,
                layers=list(group.layer_names),
                layer_stride=group.kv_cache_spec.page_size_bytes * num_blocks,
                block_stride=group.kv_cache_spec.page_size_bytes,
            )
            for group in groups
        ],
        kv_cache_groups=groups,
    )
