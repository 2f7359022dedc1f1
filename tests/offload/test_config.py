"""Sizing the CPU tier from kv_connector_extra_config: arithmetic and every bad value."""

from __future__ import annotations

import pytest

from offload.cpu.config import ConfigError, KVGeometry, resolve_config

# 32 layers' worth of K and V pages of 64 KiB each, 2 ranks, 16-token GPU blocks.
GEOMETRY = KVGeometry(bytes_per_gpu_block=65536, num_kv_tensors=32, world_size=2, gpu_block_size=16)
BYTES_PER_GPU_BLOCK_ALL = 65536 * 32 * 2


def test_cpu_bytes_size_the_tier_from_the_geometry() -> None:
    config = resolve_config(
        {"cpu_bytes_to_use": 10 * BYTES_PER_GPU_BLOCK_ALL * 4 + 123, "block_size": 64}, GEOMETRY
    )
    assert config.block_size_factor == 4
    assert config.bytes_per_block == BYTES_PER_GPU_BLOCK_ALL * 4
    assert config.num_blocks == 10
    assert config.block_size == 64
    assert config.eviction_policy == "lru"


def test_cpu_bytes_win_over_num_cpu_blocks() -> None:
    config = resolve_config(
        {"cpu_bytes_to_use": 3 * BYTES_PER_GPU_BLOCK_ALL, "num_cpu_blocks": 1000}, GEOMETRY
    )
    assert config.num_blocks == 3


def test_num_cpu_blocks_alone_and_block_size_defaults_to_the_gpu_block_size() -> None:
    config = resolve_config({"num_cpu_blocks": "250", "eviction_policy": "arc"}, GEOMETRY)
    assert (config.num_blocks, config.block_size, config.block_size_factor) == (250, 16, 1)
    assert config.eviction_policy == "arc"


def test_values_parsed_from_json_are_accepted() -> None:
    config = resolve_config({"cpu_bytes_to_use": 4e9, "block_size": "32"}, GEOMETRY)
    assert config.num_blocks == int(4e9) // (BYTES_PER_GPU_BLOCK_ALL * 2)


def test_the_manager_is_built_from_the_resolved_config() -> None:
    manager = resolve_config({"num_cpu_blocks": 7, "block_size": 48}, GEOMETRY).build_manager(
        enable_events=True
    )
    assert (manager.num_blocks, manager.block_size) == (7, 48)
    out = manager.prepare_store([1])
    assert out is not None
    manager.complete_store([1])
    assert [e.block_hashes for e in manager.take_events()] == [[1]]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "needs cpu_bytes_to_use .* or num_cpu_blocks"),
        ({"cpu_bytes_to_use": None}, "needs cpu_bytes_to_use"),
        ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use=0 must be at least 1"),
        ({"cpu_bytes_to_use": -5}, "cpu_bytes_to_use=-5 must be at least 1"),
        ({"cpu_bytes_to_use": "lots"}, "cpu_bytes_to_use='lots' is not a whole number"),
        ({"cpu_bytes_to_use": 1.5}, "cpu_bytes_to_use=1.5 is not a whole number"),
        ({"cpu_bytes_to_use": True}, "cpu_bytes_to_use=True is not a whole number"),
        ({"cpu_bytes_to_use": 1000}, "smaller than one offloaded block"),
        ({"num_cpu_blocks": 0}, "num_cpu_blocks=0 must be at least 1"),
        ({"num_cpu_blocks": "-3"}, "num_cpu_blocks='-3' must be at least 1"),
        ({"num_cpu_blocks": [4]}, r"num_cpu_blocks=\[4\] is not a whole number"),
        (
            {"num_cpu_blocks": 4, "block_size": 24},
            r"block_size=24 must be a multiple of the GPU block size \(16 tokens\)",
        ),
        ({"num_cpu_blocks": 4, "block_size": 0}, "block_size=0 must be at least 1"),
        ({"num_cpu_blocks": 4, "block_size": "x"}, "block_size='x' is not a whole number"),
        ({"num_cpu_blocks": 4, "eviction_policy": "mru"}, "eviction_policy='mru' .* lru, arc"),
    ],
)
def test_every_bad_value_is_one_clear_error_naming_the_key(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config(extra, GEOMETRY)


def test_a_config_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(ConfigError, match="must be a mapping, got list"):
        resolve_config([("num_cpu_blocks", 4)], GEOMETRY)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["bytes_per_gpu_block", "num_kv_tensors", "world_size", "gpu_block_size"]
)
def test_bad_geometry_is_rejected(field: str) -> None:
    values = {
        "bytes_per_gpu_block": 1,
        "num_kv_tensors": 1,
        "world_size": 1,
        "gpu_block_size": 1,
        field: 0,
    }
    with pytest.raises(ConfigError, match=f"KV geometry {field}=0 must be at least 1"):
        KVGeometry(**values)
