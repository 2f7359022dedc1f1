"""kvscope's spec as vLLM 0.33 loads it: through its factory, from a real OffloadingConfig."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from bench.tooling.vllm_config import SPEC, offloading_config
from offload import policy_names
from offload.cpu.config import ConfigError
from offload.shown import shown_repr
from offload.vllm import KVScopeOffloadingSpec
from offload.vllm.settings import (
    CHUNK_ALIGNMENT,
    KVSCOPE_KEYS,
    MAX_STORE_THRESHOLD,
    MAX_TRACKER_SIZE,
    SpecSettings,
    read_settings,
    records_bytes,
)
from offload.vllm.vllm_keys import VLLM_KEYS

_MEMORY = "(this host's memory|the cgroup memory limit)"
"""The bound a tier too large for this machine passes: the host's, or a container's."""


def test_vllm_factory_resolves_the_spec_from_the_extra_config() -> None:
    assert OffloadingSpecFactory.get_spec_cls(SPEC) is KVScopeOffloadingSpec
    spec = OffloadingSpecFactory.create_spec(offloading_config({"num_cpu_blocks": 8}))
    assert isinstance(spec, KVScopeOffloadingSpec)
    assert spec.get_manager().core.num_blocks == 8


@pytest.mark.parametrize(
    "name", ["KVScopeOffloadingSpecc", "kvscopeoffloadingspec", "", "x\n[FAKE]"]
)
def test_a_spec_name_offload_vllm_lacks_is_refused_naming_the_key(name: str) -> None:
    """vLLM's factory reads ``spec_name`` with ``getattr`` on ``spec_module_path``'s module,
    before any of kvscope's checks: a misspelt name failed in Python's own AttributeError,
    naming neither key."""
    config = offloading_config({"num_cpu_blocks": 8, "spec_name": name})
    with pytest.raises(AttributeError) as caught:
        OffloadingSpecFactory.create_spec(config)
    message = str(caught.value)
    assert f"has no attribute {shown_repr(name)}; as kv_connector_extra_config spec_name" in message
    assert "kvscope's spec is 'KVScopeOffloadingSpec'" in message
    assert "\n" not in message


def test_the_tier_is_sized_from_cpu_bytes_as_vllm_sizes_it() -> None:
    """vLLM: chunk bytes = per-worker bytes x workers x blocks per chunk, rounded up to a page."""
    config = offloading_config(
        {"cpu_bytes_to_use": 10 * 2**20},
        worker_kv_bytes_per_block=3000,
        world_size=2,
        blocks_per_chunk=2,
    )
    spec = KVScopeOffloadingSpec(config)
    chunk = -(-3000 * 2 * 2 // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
    assert spec.settings.bytes_per_chunk == chunk
    assert spec.settings.num_chunks == 10 * 2**20 // chunk
    assert spec.tokens_per_chunk == 32


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"num_cpu_blocks": 8, "cpu_byte_to_use": 1}, "cpu_byte_to_use"),
        ({"cpu_bytes_to_use": "lots"}, "cpu_bytes_to_use"),
        ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use"),
        ({"cpu_bytes_to_use": 100}, "cpu_bytes_to_use"),
        # Named as given, not as floored: -1.5 read -2, and 100.7 read 100.
        ({"cpu_bytes_to_use": -1.5}, "cpu_bytes_to_use=-1.5 must be at least 1"),
        ({"cpu_bytes_to_use": 0.5}, "cpu_bytes_to_use=0.5 must be at least 1"),
        ({"cpu_bytes_to_use": 100.7}, "cpu_bytes_to_use=100.7 is smaller than one offloaded"),
        ({"cpu_bytes_to_use": "100"}, "cpu_bytes_to_use='100' is smaller than one offloaded"),
        ({"cpu_bytes_to_use": 8 << 40}, f"more than {_MEMORY}"),  # 8 TiB: 2**31 chunks
        ({"num_cpu_blocks": 2**50}, "num_cpu_blocks=1125899906842624 must be at most 4294967296"),
        ({"cpu_bytes_to_use": 2**30, "num_cpu_blocks": 4}, "num_cpu_blocks"),
        ({}, "cpu_bytes_to_use"),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks"),
        ({"num_cpu_blocks": 8, "eviction_policy": "mru"}, "eviction_policy"),
        ({"num_cpu_blocks": 8, "store_threshold": -1}, "store_threshold"),
        ({"num_cpu_blocks": 8, "max_tracker_size": 0}, "max_tracker_size"),
        ({"num_cpu_blocks": 8, "kvscope_endpoint": "http://x:1"}, "kvscope_endpoint"),
        ({"num_cpu_blocks": 8, "kvscope_replay_endpoint": "tcp://*:1"}, "kvscope_replay_endpoint"),
        ({"num_cpu_blocks": 8, "kvscope_endpoint": "tcp://"}, "kvscope_endpoint"),
        ({"num_cpu_blocks": 8, "kvscope_endpoint": "tcp://no such host:5"}, "kvscope_endpoint"),
        ({"num_cpu_blocks": "9" * 5000}, "num_cpu_blocks='9999.*more than 20 characters"),
        ({"num_cpu_blocks": " 8"}, "num_cpu_blocks=' 8' is not a whole number"),
        ({"num_cpu_blocks": 8, "store_threshold": "+2"}, "store_threshold='\\+2' is not a whole"),
        ({"num_cpu_blocks": 8, "max_tracker_size": "1_000"}, "max_tracker_size='1_000' is not"),
        ({"cpu_bytes_to_use": "0x10000000"}, "cpu_bytes_to_use='0x10000000' is not a whole"),
        # vLLM reads its switches with bool(): "false" is on, null is off.
        ({"num_cpu_blocks": 8, "offload_prompt_only": "false"}, "offload_prompt_only='false'"),
        ({"num_cpu_blocks": 8, "offload_prompt_only": None}, "offload_prompt_only=None"),
        ({"num_cpu_blocks": 8, "self_describing_kv_events": "no"}, "self_describing_kv_events"),
        ({"num_cpu_blocks": 8, "canonical_layout": "false"}, "canonical_layout='false'"),
        ({"num_cpu_blocks": 8, "canonical_layout": True}, "canonical_layout=True is not supp"),
        # vLLM reads it with int() in its scheduler, after the spec, naming no key.
        ({"num_cpu_blocks": 8, "sync_load_budget_bytes": "lots"}, "sync_load_budget_bytes"),
        ({"num_cpu_blocks": 8, "sync_load_budget_bytes": "01"}, "sync_load_budget_bytes='01'"),
        ({"num_cpu_blocks": 8, "sync_load_budget_bytes": -5}, "sync_load_budget_bytes=-5"),
        # vLLM cuts a fraction off (8.5 bytes is 8) and fails on null in int().
        (
            {"num_cpu_blocks": 8, "sync_load_budget_bytes": 8.5},
            "sync_load_budget_bytes=8.5 is not a whole number",
        ),
        (
            {"num_cpu_blocks": 8, "sync_load_budget_bytes": None},
            "sync_load_budget_bytes=None is not a whole number",
        ),
        (
            {"num_cpu_blocks": 8, "eviction_policy": "x", "cache_policy_module_path": "..x"},
            "cache_policy_module_path",
        ),
        (
            {"num_cpu_blocks": 8, "eviction_policy": "x", "cache_policy_module_path": ""},
            "cache_policy_module_path",
        ),
        (
            {"num_cpu_blocks": 8, "eviction_policy": "x", "cache_policy_module_path": "no.such"},
            "cache_policy_module_path",
        ),
        # Not read beside a registered policy's name (vLLM's order), but never a module path.
        (
            {"num_cpu_blocks": 8, "eviction_policy": "lru", "cache_policy_module_path": 5},
            "cache_policy_module_path=5 must be a module path",
        ),
    ],
)
def test_each_bad_key_is_a_clear_error_naming_it(extra: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        KVScopeOffloadingSpec(offloading_config(extra))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"num_cpu_blocks": -(10**5000)}, "num_cpu_blocks=<an integer of more than 19 digits>"),
        ({"cpu_bytes_to_use": -(10**5000)}, "cpu_bytes_to_use=<an integer of more than 19 digits>"),
        (
            {"num_cpu_blocks": 8, "store_threshold": -(10**5000)},
            "store_threshold=<an integer of more than 19 digits>",
        ),
        ({"num_cpu_blocks": "a" * 10**6}, "num_cpu_blocks='aaaa"),
        ({"num_cpu_blocks": [0] * 10**6}, "num_cpu_blocks=[0, 0, 0, 0, 0, 0, ...]"),
        ({"num_cpu_blocks": 8, "eviction_policy": "x" * 10**6}, "eviction_policy='xxxx"),
        ({"num_cpu_blocks": 8, "x\n[FAKE] line" * 10**5: 1}, "does not read: 'x\\n[FAKE] line"),
        ({"num_cpu_blocks": 8, "kvscope_endpoint": "tcp://" + "a" * 10**6}, "kvscope_endpoint="),
        (
            {"num_cpu_blocks": 8, **{f"k{n:07}": n for n in range(10**5)}},
            "does not read: 'k0000000', 'k0000001', 'k0000002', 'k0000003', 'k0000004', "
            "and 99995 more; it accepts",
        ),
        (
            {"num_cpu_blocks": 8, "eviction_policy": "p", "cache_policy_module_path": "m" * 10**6},
            "cache_policy_module_path='mmmm",
        ),
    ],
    ids=[
        "num_cpu_blocks beyond int printing",
        "cpu_bytes_to_use beyond int printing",
        "store_threshold beyond int printing",
        "a megabyte string",
        "a million-item list",
        "a megabyte policy name",
        "a megabyte key forging log lines",
        "a megabyte endpoint",
        "a hundred thousand unknown keys",
        "a megabyte module path",
    ],
)
def test_a_value_too_large_to_print_is_named_in_one_short_line(extra: dict, named: str) -> None:
    """vLLM logs a start-up error whole: a value printed whole made it megabytes long, and an
    integer past 4,300 digits failed to print at all, so the error was a ValueError from
    ``repr`` naming no key."""
    with pytest.raises(ConfigError, match=re.escape(named)) as caught:
        KVScopeOffloadingSpec(offloading_config(extra))
    message = str(caught.value)
    assert len(message) < 2000
    assert "\n" not in message


@pytest.mark.parametrize(
    ("extra", "blocks_per_chunk", "named"),
    [
        (
            {"cpu_bytes_to_use": 10**5000},
            1,
            "kv_connector_extra_config cpu_bytes_to_use=<an integer of more than 19 digits> "
            "makes more than 4294967296 chunks of 4096 bytes, the most chunks a kvscope tier "
            "holds",
        ),
        # The most digits vLLM's JSON reader takes: a tier of 10**4299 bytes named its size
        # and its records whole, a line of 13,000 characters.
        ({"cpu_bytes_to_use": 10**4299}, 1, "cpu_bytes_to_use=<an integer of more than 19"),
        # vLLM reads blocks_per_chunk with int() and passes it on unbounded: a chunk past
        # 4,300 digits failed to print, in a ValueError naming no key.
        (
            {"num_cpu_blocks": 8},
            10**4299,
            "one offloaded chunk takes <an integer of more than 19 digits> bytes with "
            "kvscope's records for it (<an integer of more than 19 digits> GPU block(s) on each ",
        ),
        (
            {"cpu_bytes_to_use": 2**40},
            10**4299,
            "whatever cpu_bytes_to_use or num_cpu_blocks; lower blocks_per_chunk "
            "(given blocks_per_chunk=<an integer of more than 19 digits>)",
        ),
    ],
    ids=[
        "bytes beyond int printing",
        "bytes at vLLM's limit",
        "chunks of 10**4299 blocks",
        "bytes for chunks of 10**4299 blocks",
    ],
)
def test_a_tier_sized_past_printing_is_refused_in_one_short_line(
    extra: dict, blocks_per_chunk: int, named: str
) -> None:
    """The sizing errors print what they computed from the keys, not only what was given."""
    config = offloading_config(extra, blocks_per_chunk=blocks_per_chunk)
    with pytest.raises(ConfigError, match=re.escape(named)) as caught:
        KVScopeOffloadingSpec(config)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    ("extra", "blocks_per_chunk", "named"),
    [
        (
            {"blocks_per_chunk": 2**27},
            2**27,
            "kv_connector_extra_config blocks_per_chunk=134217728 makes chunks of 2147483648 "
            "tokens, more than 2147483647, the most tokens a kvscope chunk holds",
        ),
        # vLLM's block_size is a chunk's tokens, which it divides by the GPU block's.
        (
            {"block_size": 2**31},
            2**27,
            "kv_connector_extra_config block_size=2147483648 makes chunks of 2147483648 tokens",
        ),
        (
            {"blocks_per_chunk": 10**4299},
            10**4299,
            "blocks_per_chunk=<an integer of more than 19 digits> makes chunks of <an integer",
        ),
    ],
    ids=["blocks_per_chunk", "block_size", "blocks_per_chunk beyond int printing"],
)
def test_a_chunk_of_more_tokens_than_events_carry_is_refused_naming_its_key(
    extra: dict, blocks_per_chunk: int, named: str
) -> None:
    """The manager holds a chunk's tokens to what every KV event carries; with chunks of 0
    bytes (vLLM's GPU cache of 0 blocks) or memory to fit them, the spec was built, and
    the manager refused them as vLLM asked for it, in a ValueError naming its own argument
    (``block_size``, which to vLLM is another key), or failing to print the number."""
    config = offloading_config(
        {"num_cpu_blocks": 8, **extra},
        worker_kv_bytes_per_block=0,
        blocks_per_chunk=blocks_per_chunk,
    )
    with pytest.raises(ConfigError, match=re.escape(named)) as caught:
        KVScopeOffloadingSpec(config)
    assert len(str(caught.value)) < 400


HOSTILE = (
    *(-1, 0, -0.0, "-0", -0.5, 8.5, math.nan, math.inf, True, "8\n[FAKE]", {"a": 1}, [1]),
    *(2**70, None),
)
"""Values a loosely typed extra config may hold where each key wants something else."""

TAKEN: dict[str, tuple[object, ...]] = {
    # 0: store at the first offer, no sample; a budget of 0 loads nothing within a step,
    # and one past any step's loads (vLLM bounds it by nothing) loads every hit within it.
    "store_threshold": (0,),
    "sync_load_budget_bytes": (0, 2**70),
    "sample_rate": (0, None),
    "offload_prompt_only": (True,),
    "self_describing_kv_events": (True,),
    # Beside a registered policy's name (lru here) the module is not read, as in vLLM.
    "cache_policy_module_path": (None, "-0", "8\n[FAKE]"),
    # null is a key left out: no publisher, vLLM's own default chunk.
    **dict.fromkeys(
        ("kvscope_endpoint", "kvscope_replay_endpoint", "block_size", "blocks_per_chunk"),
        (None,),
    ),
}
"""The hostile values a key takes, as the README documents them; every other is refused."""


def _taken(key: str, value: object) -> bool:
    """Whether ``key`` takes ``value`` (``TAKEN``), compared as written: -0.0 equals 0 and
    True equals 1, and neither is taken where they are."""
    return repr(value) in map(repr, TAKEN.get(key, ()))


def _vllm_blocks_per_chunk(key: str, value: object) -> int:
    """The blocks per chunk vLLM's ``build_offloading_config`` passes on for ``key``'s
    ``value`` (16-token GPU blocks), where it takes the value at all."""
    if type(value) is not int or value <= 0:
        return 1
    return {"blocks_per_chunk": value, "block_size": value // 16}.get(key, 1)


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
@pytest.mark.parametrize(
    # vLLM's factory reads these two before any spec is built (one test above, the README).
    "key",
    sorted(KVSCOPE_KEYS | VLLM_KEYS - {"spec_name", "spec_module_path"}),
)
def test_every_key_takes_a_hostile_value_as_documented_or_refuses_it_naming_it(
    key: str, value: object
) -> None:
    """Negative, zero, negative zero (as a float or as text), a fraction, NaN, inf, a bool,
    text forging a log line, a nested object, 2**70, null: each key takes what the README
    says it takes, and any other value is one ConfigError at start-up naming the key, on one
    short line."""
    base: dict[str, object] = {"num_cpu_blocks": 8}
    if key in ("cpu_bytes_to_use", "num_cpu_blocks"):
        base = {}
    if key == "kvscope_replay_endpoint":
        base["kvscope_endpoint"] = "tcp://127.0.0.1:*"
    config = offloading_config(
        {**base, key: value}, blocks_per_chunk=_vllm_blocks_per_chunk(key, value)
    )
    if _taken(key, value):
        KVScopeOffloadingSpec(config)
        return
    with pytest.raises(ConfigError) as caught:
        KVScopeOffloadingSpec(config)
    message = str(caught.value)
    # null for a tier key is the key left out: then neither was given, as the error says.
    left_out = value is None and not base
    assert ("needs cpu_bytes_to_use" if left_out else f"{key}={shown_repr(value)}") in message
    assert "\n" not in message
    assert len(message) < 400


def test_every_misspelt_key_is_named_with_the_key_it_is_closest_to() -> None:
    """vLLM's own CPU spec ignores a key it does not read, so a typo left the option unset."""
    extra = {"num_cpu_blocks": 8, "evictionpolicy": "arc", "cpu_byte_to_use": 2**30, "zzz": 1}
    with pytest.raises(ConfigError) as caught:
        KVScopeOffloadingSpec(offloading_config(extra))
    assert (
        "KVScopeOffloadingSpec does not read: 'cpu_byte_to_use' (did you mean "
        "'cpu_bytes_to_use'?), 'evictionpolicy' (did you mean 'eviction_policy'?), 'zzz'; "
        "it accepts: block_size, "
    ) in str(caught.value)


def test_vllms_own_keys_reach_vllm_as_given() -> None:
    spec = KVScopeOffloadingSpec(
        offloading_config(
            {
                "num_cpu_blocks": 8,
                "offload_prompt_only": False,
                "self_describing_kv_events": True,
                "canonical_layout": False,
                "sync_load_budget_bytes": 2**20,
            }
        )
    )
    assert spec.offload_prompt_only is False
    assert spec.kv_events_config.self_describing_kv_events is True
    assert spec.extra_config["sync_load_budget_bytes"] == 2**20
    # A whole number written as a JSON float (1e9) is that number, as for every count.
    whole = KVScopeOffloadingSpec(
        offloading_config({"num_cpu_blocks": 8, "sync_load_budget_bytes": 1e9})
    )
    assert whole.extra_config["sync_load_budget_bytes"] == 10**9


@pytest.mark.parametrize(
    ("extra", "vllm_blocks_per_chunk", "named"),
    [
        # What vLLM 0.33's build_offloading_config makes of each (16-token GPU blocks): it
        # reads them with int() and checks neither a block_size's sign nor a fraction.
        ({"block_size": 0}, 0, "block_size=0 must be at least 1"),
        ({"block_size": -16}, -1, "block_size=-16 must be at least 1"),
        ({"block_size": 32.7}, 2, "block_size=32.7 is not a whole number"),
        ({"blocks_per_chunk": 2.5}, 2, "blocks_per_chunk=2.5 is not a whole number"),
        ({"blocks_per_chunk": True}, 1, "blocks_per_chunk=True is not a whole number"),
    ],
)
def test_a_chunk_size_vllm_would_misread_is_refused_by_name(
    extra: dict, vllm_blocks_per_chunk: int, named: str
) -> None:
    config = offloading_config(
        {"num_cpu_blocks": 8, **extra}, blocks_per_chunk=vllm_blocks_per_chunk
    )
    with pytest.raises(ConfigError, match=f"kv_connector_extra_config {named}"):
        KVScopeOffloadingSpec(config)


def test_an_extra_config_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(ConfigError, match="must be a mapping, got list"):
        read_settings(
            [("num_cpu_blocks", 4)],  # type: ignore[arg-type]
            worker_kv_bytes_per_block=4096,
            world_size=1,
            blocks_per_chunk=1,
        )


@pytest.mark.parametrize(
    ("num_cpu_blocks", "named"),
    [
        (2**31, f"more than {_MEMORY}.*; lower num_cpu_blocks$"),
        (2**40, "num_cpu_blocks=1099511627776 must be at most 4294967296"),
    ],
)
def test_a_huge_tier_of_empty_chunks_is_refused_naming_num_cpu_blocks(
    num_cpu_blocks: int, named: str
) -> None:
    """vLLM reports 0 KV bytes per block for a GPU cache of 0 blocks: the chunks hold
    nothing, but the manager keeps records per chunk (building it failed with a MemoryError
    or a ValueError naming no key)."""
    config = offloading_config({"num_cpu_blocks": num_cpu_blocks}, worker_kv_bytes_per_block=0)
    with pytest.raises(ConfigError, match=named):
        KVScopeOffloadingSpec(config)
    small = KVScopeOffloadingSpec(
        offloading_config({"num_cpu_blocks": 8}, worker_kv_bytes_per_block=0)
    )
    assert small.get_manager().core.num_blocks == 8


def test_a_tier_above_the_containers_memory_limit_is_refused_naming_it(tmp_path: Path) -> None:
    """Below the host's memory but above the container's limit: the worker would be killed
    for memory during its zero-fill, naming no key."""
    limit = tmp_path / "memory.max"

    def settings(cpu_bytes: int) -> SpecSettings:
        return read_settings(
            {"cpu_bytes_to_use": cpu_bytes},
            worker_kv_bytes_per_block=4096,
            world_size=1,
            blocks_per_chunk=1,
            cgroup_root=tmp_path,
            proc_root=tmp_path,  # no self/cgroup: the root's limit only
        )

    limit.write_text(f"{1 << 30}\n")
    records = records_bytes("lru", 262144)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"the CPU tier would take {(1 << 30) + records} bytes (262144 chunks of 4096 "
            f"bytes, and {records} bytes of kvscope's records at most, {records // 262144} a "
            "chunk, with eviction_policy 'lru'), more than the cgroup memory limit, 1.0 GiB "
            "(1073741824 bytes); lower cpu_bytes_to_use"
        ),
    ):
        settings(1 << 30)
    assert settings(1 << 28).num_chunks == 65536  # a quarter of the limit, and its records: fits
    limit.write_text("max\n")
    assert settings(1 << 30).num_chunks == 262144


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"num_cpu_blocks": 1, "blocks_per_chunk": 2**24}, "blocks_per_chunk=16777216"),
        ({"cpu_bytes_to_use": 2**30, "blocks_per_chunk": 2**24}, "blocks_per_chunk=16777216"),
        (
            {"cpu_bytes_to_use": 2**50, "blocks_per_chunk": "16777216"},
            "blocks_per_chunk='16777216'",
        ),
        # vLLM divides block_size (tokens) by the GPU block's 16 tokens: 2**24 blocks.
        ({"num_cpu_blocks": 1, "block_size": 2**28}, "block_size=268435456"),
    ],
    ids=["num_cpu_blocks", "cpu_bytes_to_use below a chunk", "bytes above it", "block_size"],
)
def test_a_chunk_larger_than_memory_is_refused_naming_the_chunk_size(
    extra: dict, named: str
) -> None:
    """One chunk of 2**24 GPU blocks of 2 MiB (32 TiB) fits no host: the error told the user
    to lower num_cpu_blocks, already 1, or, for cpu_bytes_to_use below the chunk, to give
    more bytes, which the memory check then refused."""
    config = offloading_config(extra, worker_kv_bytes_per_block=2**21, blocks_per_chunk=2**24)
    with pytest.raises(
        ConfigError,
        match=f"more than {_MEMORY}.*: no tier fits, whatever cpu_bytes_to_use or "
        f"num_cpu_blocks; lower {named.split('=')[0]} \\(given {re.escape(named)}\\)$",
    ):
        KVScopeOffloadingSpec(config)


def test_the_memory_error_names_the_key_that_can_make_the_tier_fit(tmp_path: Path) -> None:
    """Under a 1 GiB limit: a chunk of 2 GiB is the chunk size's fault; eight chunks of
    256 MiB, either key's; a chunk of one 2 GiB GPU block, no key's."""
    (tmp_path / "memory.max").write_text(f"{1 << 30}\n")

    def settings(extra: dict, blocks_per_chunk: int, block_bytes: int = 2**21) -> SpecSettings:
        return read_settings(
            extra,
            worker_kv_bytes_per_block=block_bytes,
            world_size=1,
            blocks_per_chunk=blocks_per_chunk,
            cgroup_root=tmp_path,
            proc_root=tmp_path,
        )

    with pytest.raises(
        ConfigError,
        match=r"\(1024 GPU block\(s\) on each of 1 worker\(s\).*"
        r"; lower blocks_per_chunk \(given blocks_per_chunk=1024\)$",
    ):
        settings({"num_cpu_blocks": 1, "blocks_per_chunk": 1024}, 1024)
    with pytest.raises(
        ConfigError,
        match=r"\(8 chunks of 268435456 bytes, .*; "
        r"lower num_cpu_blocks or blocks_per_chunk$",
    ):
        settings({"num_cpu_blocks": 8, "blocks_per_chunk": 128}, 128)
    with pytest.raises(ConfigError, match=r"; lower cpu_bytes_to_use$"):
        settings({"cpu_bytes_to_use": 2**31, "blocks_per_chunk": 128}, 128)
    with pytest.raises(ConfigError, match=r"; lower num_cpu_blocks$"):
        settings({"num_cpu_blocks": 8}, 1, 2**28)
    with pytest.raises(
        ConfigError,
        match=r"a chunk of one GPU block cannot be smaller: this host cannot hold the tier$",
    ):
        settings({"num_cpu_blocks": 1}, 1, 2**31)
    assert settings({"num_cpu_blocks": 3, "blocks_per_chunk": 128}, 128).num_chunks == 3


def test_the_memory_check_counts_what_the_eviction_policy_keeps(tmp_path: Path) -> None:
    """gated's offer histories keep tens of KiB a chunk: a tier of small chunks that fits
    with lru's records is refused with gated's, whose bound it names."""
    (tmp_path / "memory.max").write_text(f"{1 << 30}\n")

    def settings(policy: str) -> SpecSettings:
        return read_settings(
            {"num_cpu_blocks": 65536, "eviction_policy": policy},
            worker_kv_bytes_per_block=4096,
            world_size=1,
            blocks_per_chunk=1,
            cgroup_root=tmp_path,
            proc_root=tmp_path,
        )

    assert settings("lru").num_chunks == 65536  # 256 MiB of chunks and lru's records
    records = records_bytes("gated", 65536)
    assert records > (1 << 30) - 65536 * 4096  # gated's do not fit beside the chunks
    with pytest.raises(ConfigError, match=f"{records} bytes of kvscope's records at most"):
        settings("gated")


def test_vllm_options_keep_their_meaning() -> None:
    spec = KVScopeOffloadingSpec(
        offloading_config({"num_cpu_blocks": 8, "offload_prompt_only": False, "store_threshold": 2})
    )
    assert spec.offload_prompt_only is False
    manager = spec.get_manager()
    assert manager.store_threshold == 2
    assert manager.counts is not None


@pytest.mark.parametrize(
    ("key", "maximum"),
    [("store_threshold", MAX_STORE_THRESHOLD), ("max_tracker_size", MAX_TRACKER_SIZE)],
)
def test_the_reuse_filters_keys_are_refused_past_their_bound(key: str, maximum: int) -> None:
    """Any whole number was taken: a tracker of 10**30 chunks never forgot one, growing with
    every chunk offered, and a threshold of 10**30 never stored one."""
    extra = {"num_cpu_blocks": 8, "store_threshold": 2}
    for too_many, shown in [
        (maximum + 1, str(maximum + 1)),
        (str(maximum + 1), f"'{maximum + 1}'"),
        (10**30, "<an integer of more than 19 digits>"),
    ]:
        named = f"kv_connector_extra_config {key}={shown} must be at most {maximum}, "
        with pytest.raises(ConfigError, match=re.escape(named)):
            KVScopeOffloadingSpec(offloading_config({**extra, key: too_many}))
    manager = KVScopeOffloadingSpec(offloading_config({**extra, key: maximum})).get_manager()
    assert getattr(manager, key) == maximum


def test_vllms_metric_definitions_refuse_a_store_threshold_past_its_bound() -> None:
    """vLLM defines the metrics from the extra config apart from the spec, so the bound holds
    there too: a threshold one path took and the other refused was two readings of one key."""
    too_many = {**SPEC, "store_threshold": MAX_STORE_THRESHOLD + 1}
    with pytest.raises(ConfigError, match=f"store_threshold={MAX_STORE_THRESHOLD + 1} must be"):
        KVScopeOffloadingSpec.build_metric_definitions(too_many)


def test_an_out_of_tree_kvscope_policy_loads_from_its_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fifo_policy.py").write_text(
        textwrap.dedent(
            """
            from offload.cpu.policies.lru import LRUCachePolicy

            class fifo(LRUCachePolicy):
                name = "fifo"

                def touch(self, block_hashes):
                    return None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = KVScopeOffloadingSpec(
        offloading_config(
            {
                "num_cpu_blocks": 4,
                "eviction_policy": "fifo",
                "cache_policy_module_path": "fifo_policy",
            }
        )
    )
    assert spec.get_manager().core.policy.name == "fifo"
    sys.modules.pop("fifo_policy", None)


ABSTRACT = "from offload import CachePolicy\n\nclass half(CachePolicy):\n    name = 'half'\n"
"""A policy class that passed every check and failed only as vLLM built the manager, in a
TypeError naming no key, after the publisher had bound its port."""


@pytest.mark.parametrize(
    ("source", "policy", "says"),
    [
        ("class x(:\n", "x", " cannot be imported: SyntaxError"),
        ("raise RuntimeError('boom')\n", "x", " cannot be imported: RuntimeError: boom"),
        (ABSTRACT, "half", ": half does not implement evict"),
    ],
    ids=["a syntax error", "failing as it runs", "an abstract class"],
)
def test_a_policy_module_that_yields_no_policy_is_a_clear_error_naming_the_key(
    source: str, policy: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "policy_module.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = {
        "num_cpu_blocks": 4,
        "eviction_policy": policy,
        "cache_policy_module_path": "policy_module",
    }
    try:
        with pytest.raises(ConfigError, match=f"cache_policy_module_path='policy_module'{says}"):
            KVScopeOffloadingSpec(offloading_config(extra))
    finally:
        sys.modules.pop("policy_module", None)
    assert policy not in policy_names()


def test_metric_definitions_name_kvscope_counters_and_vllm_gauges() -> None:
    definitions = KVScopeOffloadingSpec.build_metric_definitions({**SPEC, "store_threshold": 2})
    assert "kvscope_lookup_hit_blocks_total" in definitions
    assert definitions["kvscope_evicted_blocks_total"].labelnames == ("medium", "policy", "reason")
    assert "vllm:kv_offload_cpu_cache_usage_perc" in definitions
    assert "vllm:kv_offload_stores_skipped" in definitions


def test_vllms_replicated_layout_offer_is_declined_not_refused() -> None:
    """vLLM offers the single-copy layout to every MLA model under tensor parallelism on one
    node (``build_offloading_config``); a backend takes it by setting its spec's
    ``replicated_layout``, which vLLM's connector worker reads. kvscope keeps a copy per
    worker, so it declines the offer: refusing the config stopped every such engine."""
    config = dataclasses.replace(
        offloading_config({"cpu_bytes_to_use": 2**24}, world_size=2), replicated_layout=True
    )
    spec = OffloadingSpecFactory.create_spec(config)
    assert isinstance(spec, KVScopeOffloadingSpec)
    assert spec.replicated_layout is False
    # Sized as vLLM sizes a tier that keeps every worker's copy.
    assert spec.settings.bytes_per_chunk == -(-4096 * 2 // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
    spec.get_manager().shutdown()


def test_vllms_own_kv_offloading_size_sizes_the_tier_as_vllm_does() -> None:
    """``--kv-offloading-size`` is GiB as a float; vLLM writes it into the extra config as
    float bytes (0.3 GiB: 322122547.2) and its CPU spec floors them. kvscope refused any
    fraction as not a whole number, so the engine would not start."""
    vllm_config = VllmConfig(
        cache_config=CacheConfig(kv_offloading_size=0.3),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(kv_connector_extra_config=dict(SPEC)),
    )
    assert vllm_config.kv_transfer_config is not None
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config
    assert extra["cpu_bytes_to_use"] == 0.3 * 2**30
    config = offloading_config(extra, worker_kv_bytes_per_block=3000)
    spec = KVScopeOffloadingSpec(config)
    assert spec.settings.num_chunks == CPUOffloadingSpec(config).num_chunks > 0


@pytest.mark.parametrize(
    ("bytes_per_block", "tokens_per_block"),
    [
        (32 * 2 * 8 * 128 * 2 * 16, 16),  # a Llama-8B-like fp16 cache: 2 MiB, a page multiple
        (61 * 576 * 2 * 64, 64),  # an MLA-like single latent tensor, bf16: not a page multiple
        (61 * 656 * 64, 64),  # the same latent in fp8 with its scales
        (28 * 2 * 4 * 64 * 1 * 32 + 4 * 8192, (32, 64)),  # hybrid: two groups, two block sizes
        (3000, 16),
    ],
    ids=["llama-fp16", "mla-bf16", "mla-fp8", "hybrid", "odd"],
)
@pytest.mark.parametrize("world_size", [1, 2, 8])
@pytest.mark.parametrize("blocks_per_chunk", [1, 4])
@pytest.mark.parametrize("cpu_bytes", [2**30, 10.5 * 2**30])
def test_the_tier_holds_as_many_chunks_of_as_many_tokens_as_vllms_cpu_tier(
    bytes_per_block: int,
    tokens_per_block: int | tuple[int, ...],
    world_size: int,
    blocks_per_chunk: int,
    cpu_bytes: float,
) -> None:
    """Same OffloadingConfig, same answer as vLLM's own CPUOffloadingSpec: chunk count,
    chunk bytes, tokens per block and per chunk, and the flags vLLM's scheduler reads."""
    config = offloading_config(
        {"cpu_bytes_to_use": cpu_bytes},
        worker_kv_bytes_per_block=bytes_per_block,
        world_size=world_size,
        blocks_per_chunk=blocks_per_chunk,
        tokens_per_block=tokens_per_block,
    )
    ours, vllms = KVScopeOffloadingSpec(config), CPUOffloadingSpec(config)
    assert ours.settings.num_chunks == vllms.num_chunks > 0
    assert ours.settings.bytes_per_chunk == vllms.kv_bytes_per_chunk
    assert ours.tokens_per_block == vllms.tokens_per_block
    assert ours.blocks_per_chunk == vllms.blocks_per_chunk == blocks_per_chunk
    assert ours.tokens_per_hash == vllms.tokens_per_hash
    assert ours.offload_prompt_only == vllms.offload_prompt_only
    assert ours.replicated_layout == vllms.replicated_layout is False
    # vLLM's info metric: its CPU tier's labels, its tokens at max_model_len among them,
    # with the same values; and kvscope's policy.
    extra = {"eviction_policy": "lru"}
    assert ours.config_info_keys({}) == (*vllms.config_info_keys({}), *extra)
    assert ours.get_manager().config_info() == [{**vllms.get_manager().config_info()[0], **extra}]
    # Every group's chunk spans its own blocks: groups of different block sizes differ.
    sizes = tokens_per_block if isinstance(tokens_per_block, tuple) else (tokens_per_block,)
    assert ours.chunk_tokens == {g: t * blocks_per_chunk for g, t in enumerate(sizes)}
