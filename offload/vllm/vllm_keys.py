"""The keys of ``kv_connector_extra_config`` that vLLM's offloading connector reads itself.

They pass through to vLLM, but vLLM reads its flags with ``bool()``: the JSON string
``"false"`` (or ``null``) silently turned ``offload_prompt_only`` on (or off), whatever
the user meant; it reads ``sync_load_budget_bytes`` with ``int()`` in its scheduler,
after the spec is built, so text or ``null`` failed there in an error naming no key and
8.5 was 8; and it reads the chunk size
(``block_size`` or ``blocks_per_chunk``) with ``int()``, so a fraction was cut off and
``true`` was 1, and it checks no ``block_size`` for a sign, so 0 or -16 made chunks of
0 or -1 blocks. So they are checked here, where the config enters, with kvscope's own
keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offload.cpu.config import ConfigError, positive_int
from offload.shown import shown_repr

VLLM_KEYS = frozenset(
    {
        "spec_name",
        "spec_module_path",
        "block_size",
        "blocks_per_chunk",
        "canonical_layout",
        "offload_prompt_only",
        "self_describing_kv_events",
        "sync_load_budget_bytes",
    }
)
"""Keys vLLM's offloading connector reads itself; they pass through untouched."""

CHUNK_SIZES = ("block_size", "blocks_per_chunk")
"""vLLM's keys that size a chunk, in tokens or GPU blocks: whole numbers, at least 1."""

FLAGS = ("offload_prompt_only", "self_describing_kv_events", "canonical_layout")
"""vLLM's keys that are switches: ``bool(value)`` to vLLM, so only a real boolean means
what it says."""


def check_vllm_keys(extra_config: Mapping[str, Any]) -> None:
    """Refuse a value of vLLM's own keys that vLLM would misread, or that kvscope cannot
    honour; raises ConfigError naming the key.

    vLLM has read the chunk size before it builds any spec, refusing text that is no
    number; what it took in silently is refused here.
    """
    for key in CHUNK_SIZES:
        if extra_config.get(key) is not None:
            positive_int(key, extra_config[key])
    for key in FLAGS:
        if key in extra_config and not isinstance(extra_config[key], bool):
            raise ConfigError(
                f"kv_connector_extra_config {key}={shown_repr(extra_config[key])} must be "
                "true or false (vLLM reads any other value as a switch: the string "
                '"false" turns it on)'
            )
    if extra_config.get("canonical_layout"):
        raise ConfigError(
            "kv_connector_extra_config canonical_layout=True is not supported by "
            "KVScopeOffloadingSpec: kvscope keeps each worker's pages as they lie on its "
            "GPU, not vLLM's topology-free canonical pages; leave canonical_layout out"
        )
    if "sync_load_budget_bytes" in extra_config:
        # Not floored as cpu_bytes_to_use is: vLLM writes float bytes there itself
        # (--kv-offloading-size), never here, so a fraction is a typo, refused as a chunk
        # size's is. null is refused too: given, it is no default, and int(None) fails.
        positive_int("sync_load_budget_bytes", extra_config["sync_load_budget_bytes"], minimum=0)
