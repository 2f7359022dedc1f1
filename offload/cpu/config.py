"""Sizing the CPU tier from vLLM's ``kv_connector_extra_config``.

vLLM hands the connector a loosely typed mapping (often parsed from JSON on
the command line), so every value is checked here, with an error naming the
key, before a single byte of the tier is allocated: a typo must fail at
start-up, not as an out-of-memory an hour later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import policy_names

DEFAULT_POLICY = "lru"


class ConfigError(ValueError):
    """A bad offloading setting; the message names the key and what it accepts."""


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The GPU KV cache's shape, as vLLM's KV cache config describes it."""

    bytes_per_gpu_block: int
    """Page size of one GPU block in one KV cache tensor."""
    num_kv_tensors: int
    world_size: int
    gpu_block_size: int
    """Tokens per GPU block."""

    def __post_init__(self) -> None:
        for field in ("bytes_per_gpu_block", "num_kv_tensors", "world_size", "gpu_block_size"):
            positive_int(field, getattr(self, field), "KV geometry")


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """The resolved CPU tier: how many blocks, how big, which policy."""

    num_blocks: int
    block_size: int
    """Tokens per offloaded block."""
    block_size_factor: int
    """Offloaded block size / GPU block size."""
    bytes_per_block: int
    """Bytes of one offloaded block across all KV tensors and ranks."""
    eviction_policy: str

    def build_manager(self, enable_events: bool = False) -> CPUOffloadingManager:
        return CPUOffloadingManager(
            self.block_size, self.num_blocks, self.eviction_policy, enable_events
        )


def resolve_config(extra_config: Mapping[str, Any], geometry: KVGeometry) -> OffloadConfig:
    """Check every key and size the tier; raises ConfigError on the first bad value.

    ``cpu_bytes_to_use`` wins over ``num_cpu_blocks`` when both are given,
    as in vLLM; ``block_size`` defaults to the GPU block size.
    """
    if not isinstance(extra_config, Mapping):
        raise ConfigError(
            f"kv_connector_extra_config must be a mapping, got {type(extra_config).__name__}"
        )
    block_size = geometry.gpu_block_size
    if extra_config.get("block_size") is not None:
        block_size = positive_int("block_size", extra_config["block_size"])
        if block_size % geometry.gpu_block_size:
            raise ConfigError(
                f"block_size={block_size} must be a multiple of the GPU block size "
                f"({geometry.gpu_block_size} tokens)"
            )
    factor = block_size // geometry.gpu_block_size
    bytes_per_block = (
        geometry.bytes_per_gpu_block * geometry.num_kv_tensors * geometry.world_size * factor
    )
    policy = extra_config.get("eviction_policy", DEFAULT_POLICY)
    if policy not in policy_names():
        raise ConfigError(
            f"eviction_policy={policy!r} is not a known policy; use one of: "
            + ", ".join(policy_names())
        )
    if extra_config.get("cpu_bytes_to_use") is not None:
        cpu_bytes = positive_int("cpu_bytes_to_use", extra_config["cpu_bytes_to_use"])
        num_blocks = cpu_bytes // bytes_per_block
        if num_blocks < 1:
            raise ConfigError(
                f"cpu_bytes_to_use={cpu_bytes} is smaller than one offloaded block "
                f"({bytes_per_block} bytes)"
            )
    elif extra_config.get("num_cpu_blocks") is not None:
        num_blocks = positive_int("num_cpu_blocks", extra_config["num_cpu_blocks"])
    else:
        raise ConfigError(
            "kv_connector_extra_config needs cpu_bytes_to_use (bytes of CPU memory) "
            "or num_cpu_blocks (a block count)"
        )
    return OffloadConfig(num_blocks, block_size, factor, bytes_per_block, policy)


def positive_int(
    key: str, value: Any, where: str = "kv_connector_extra_config", minimum: int = 1
) -> int:
    """An integer >= ``minimum`` from an int, an integral float or a decimal string."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise ConfigError(f"{where} {key}={value!r} is not a whole number")
    if number < minimum:
        raise ConfigError(f"{where} {key}={value!r} must be at least {minimum}")
    return number
