"""kvscope's keys in vLLM's ``kv_connector_extra_config``, checked before anything is allocated.

The mapping arrives loosely typed (often JSON typed on a command line), so
every key is checked here, by name: an unknown key is a typo or an option
kvscope does not honour, and both are errors rather than silently ignored.
"""

from __future__ import annotations

import importlib
import mmap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offload.cpu.config import ConfigError, positive_int
from offload.cpu.manager import MAX_BLOCK_SIZE, MAX_NUM_BLOCKS
from offload.cpu.miss_attribution import attribution_bytes
from offload.cpu.policies.cache_policy import CachePolicy
from offload.cpu.policies.registry import metadata_bound, policy_names, register_policy
from offload.decimal_text import NEGATIVE_ZERO, fractional_number, is_negative_zero
from offload.insight.sampling import DEFAULT_RATE
from offload.shown import shown, shown_repr
from offload.transfer.host_tier import size_text
from offload.unknown_keys import unknown_keys
from offload.vllm.host_memory import CGROUP_ROOT, PROC_ROOT, MemoryBound, memory_bound
from offload.vllm.vllm_keys import VLLM_KEYS, check_vllm_keys
from offload.wire.endpoints import endpoint_refusal
from offload.wire.rank_offsets import offset_endpoint, ports_overlap
from offload.wire.sample_frame import MIN_SAMPLE_RATE, is_worker_rate

KVSCOPE_KEYS = frozenset(
    {
        "cpu_bytes_to_use",
        "num_cpu_blocks",
        "eviction_policy",
        "cache_policy_module_path",
        "store_threshold",
        "max_tracker_size",
        "kvscope_endpoint",
        "kvscope_replay_endpoint",
        "sample_rate",
    }
)

CHUNK_ALIGNMENT = mmap.PAGESIZE
"""A chunk's bytes are rounded up to a page, as vLLM's CPU spec sizes its region."""

MAX_STORE_THRESHOLD = 2**16
"""Most offers ``store_threshold`` may ask of a chunk. The threshold takes no memory (the
tracker is bounded by ``max_tracker_size`` whatever it is), but a chunk offered 65,536
times before its first store is a tier that never stores: a larger value is a typo or a
units mistake (10**30 was taken), turning offloading off without a word."""

MAX_TRACKER_SIZE = 2**24
"""Most chunks whose offers the reuse filter tracks: 262 times vLLM's default of 64,000,
the offers of 16.7M chunks (268M tokens in blocks of 16), yet at about 175 bytes an
entry (a 32-byte key in an OrderedDict, measured 2026-11-29) at most 3 GiB of the
scheduler's memory, which the tier's memory check does not count. Unbounded, 10**30 was
taken and the tracker grew with every chunk ever offered."""


@dataclass(frozen=True, slots=True)
class SpecSettings:
    """The CPU tier kvscope builds for one vLLM engine."""

    num_chunks: int
    """Offloaded blocks (vLLM's chunks) the tier holds."""
    bytes_per_chunk: int
    """Bytes of one chunk across every worker, padded to a page."""
    eviction_policy: str
    store_threshold: int
    """Offers a chunk needs before it is stored; below 2, every offer is stored."""
    max_tracker_size: int
    kvscope_endpoint: str | None
    kvscope_replay_endpoint: str | None
    """The endpoints this engine binds: the configured ones moved by its data-parallel rank."""
    sample_rate: float
    """Share of blocks in the sampled access stream on kvscope's publisher; 0: none."""


def read_settings(
    extra_config: Mapping[str, Any],
    *,
    worker_kv_bytes_per_block: int,
    world_size: int,
    blocks_per_chunk: int,
    data_parallel_rank: int = 0,
    data_parallel_size: int = 1,
    cgroup_root: Path = CGROUP_ROOT,
    proc_root: Path = PROC_ROOT,
) -> SpecSettings:
    """Check every key and size the tier; raises ConfigError naming the first bad key.

    Every data-parallel engine gets the same extra config, so each binds the
    endpoints moved by its rank (``offset_endpoint``). The tier must fit this
    host's memory and the cgroup limits read under ``cgroup_root`` on the way up from
    this process's cgroup, as ``proc_root`` names it.
    """
    if not isinstance(extra_config, Mapping):
        raise ConfigError(
            f"kv_connector_extra_config must be a mapping, got {type(extra_config).__name__}"
        )
    _check_known(extra_config)
    check_vllm_keys(extra_config)
    policy = _policy(extra_config)
    store_threshold = read_store_threshold(extra_config)
    max_tracker_size = _bounded(
        "max_tracker_size",
        extra_config.get("max_tracker_size", 64_000),
        MAX_TRACKER_SIZE,
        "the most chunks kvscope tracks offers of",
    )
    endpoint = _endpoint(extra_config, "kvscope_endpoint", data_parallel_rank)
    replay = _endpoint(extra_config, "kvscope_replay_endpoint", data_parallel_rank)
    if replay is not None and endpoint is None:
        raise ConfigError(
            "kvscope_replay_endpoint needs kvscope_endpoint: replay serves a publisher"
        )
    if replay is not None and endpoint is not None:
        _check_apart(endpoint, replay, data_parallel_size)
    sample_rate = _sample_rate(extra_config, endpoint)
    chunk = (
        -(-worker_kv_bytes_per_block * world_size * blocks_per_chunk // CHUNK_ALIGNMENT)
        * CHUNK_ALIGNMENT
    )
    bound = memory_bound(cgroup_root, proc_root)
    if bound is not None:  # else nothing to compare with
        _check_chunk_fits(extra_config, chunk, blocks_per_chunk, world_size, policy, bound)
    num_chunks, size_key = _num_chunks(extra_config, chunk)
    if bound is not None:
        lower = size_key
        if size_key == "num_cpu_blocks" and blocks_per_chunk > 1:  # fewer, or smaller, chunks
            lower += f" or {_chunk_size_key(extra_config)}"
        _check_fits_host(num_chunks, chunk, lower, policy, bound)
    return SpecSettings(
        num_chunks, chunk, policy, store_threshold, max_tracker_size, endpoint, replay, sample_rate
    )


def read_store_threshold(extra_config: Mapping[str, Any]) -> int:
    """``store_threshold``, 0 when not given; vLLM reads it apart from the spec too, to
    define the metrics (``KVScopeOffloadingSpec.build_metric_definitions``)."""
    return _bounded(
        "store_threshold",
        extra_config.get("store_threshold", 0),
        MAX_STORE_THRESHOLD,
        "the most offers kvscope asks before storing a chunk",
        minimum=0,
    )


def check_chunk_tokens(extra_config: Mapping[str, Any], chunk_tokens: Iterable[int]) -> None:
    """Refuse chunks of more tokens than the manager holds (``MAX_BLOCK_SIZE``, what every
    KV event carries), naming the key that sized them.

    vLLM reads ``block_size`` and ``blocks_per_chunk`` with ``int()``, unbounded, and a
    chunk of 0 bytes (a GPU cache of 0 blocks), or a host with memory for one, passes the
    tier's memory check; the manager then refused the chunk as vLLM asked for it, naming
    its own ``block_size``, which to vLLM is another key.
    """
    most = max(chunk_tokens)
    if most > MAX_BLOCK_SIZE:
        key = _chunk_size_key(extra_config)
        raise ConfigError(
            f"kv_connector_extra_config {key}={shown_repr(extra_config.get(key, 1))} makes "
            f"chunks of {shown_repr(most)} tokens, more than {MAX_BLOCK_SIZE}, the most "
            "tokens a kvscope chunk holds"
        )


def _chunk_size_key(extra_config: Mapping[str, Any]) -> str:
    """vLLM's key that sized the chunk: ``block_size`` (tokens) when given, else
    ``blocks_per_chunk``, vLLM's default of 1 when neither is."""
    return "block_size" if extra_config.get("block_size") is not None else "blocks_per_chunk"


def _bounded(key: str, given: Any, maximum: int, why: str, *, minimum: int = 1) -> int:
    """``key``'s whole number, ``given``, refused past ``maximum``; ``why`` says what the
    maximum is, for the error."""
    number = positive_int(key, given, minimum=minimum)
    if number > maximum:
        raise ConfigError(
            f"kv_connector_extra_config {key}={shown_repr(given)} must be at most {maximum}, {why}"
        )
    return number


def _check_known(extra_config: Mapping[str, Any]) -> None:
    """Refuse every key neither kvscope nor vLLM's connector reads (offload/unknown_keys.py)."""
    accepted = sorted(KVSCOPE_KEYS | VLLM_KEYS)
    unknown = unknown_keys(extra_config, accepted)
    if unknown is not None:
        raise ConfigError(
            "kv_connector_extra_config has key(s) KVScopeOffloadingSpec does not read: "
            f"{unknown}; it accepts: " + ", ".join(accepted)
        )


def _num_chunks(extra_config: Mapping[str, Any], bytes_per_chunk: int) -> tuple[int, str]:
    """The tier's chunks, and the key that sized it."""
    has_bytes = extra_config.get("cpu_bytes_to_use") is not None
    has_count = extra_config.get("num_cpu_blocks") is not None
    if has_bytes and has_count:
        raise ConfigError("give one of cpu_bytes_to_use and num_cpu_blocks, not both")
    if has_count:
        # Bounded here, or the manager refuses it, naming its own argument, or fails allocating.
        count = _bounded(
            "num_cpu_blocks",
            extra_config["num_cpu_blocks"],
            MAX_NUM_BLOCKS,
            "the most chunks a kvscope tier holds",
        )
        return count, "num_cpu_blocks"
    if not has_bytes:
        raise ConfigError(
            "kv_connector_extra_config needs cpu_bytes_to_use (bytes of CPU memory) "
            "or num_cpu_blocks (a chunk count)"
        )
    given = extra_config["cpu_bytes_to_use"]
    cpu_bytes = positive_int("cpu_bytes_to_use", given, floor=True)
    if bytes_per_chunk == 0:
        raise ConfigError(
            "cpu_bytes_to_use cannot size the tier: vLLM reports 0 KV bytes per block; "
            "give num_cpu_blocks instead"
        )
    # The chunk's bytes shown bounded: vLLM reads blocks_per_chunk with int() and passes
    # it on unbounded, so a chunk may be past what an int prints.
    if cpu_bytes < bytes_per_chunk:
        raise ConfigError(
            f"cpu_bytes_to_use={shown_repr(given)} is smaller than one offloaded chunk "
            f"({shown_repr(bytes_per_chunk)} bytes across all workers)"
        )
    count = cpu_bytes // bytes_per_chunk
    if count > MAX_NUM_BLOCKS:  # as num_cpu_blocks is bounded, whatever the host's memory
        raise ConfigError(
            f"kv_connector_extra_config cpu_bytes_to_use={shown_repr(given)} makes more than "
            f"{MAX_NUM_BLOCKS} chunks of {shown_repr(bytes_per_chunk)} bytes, the most "
            "chunks a kvscope tier holds"
        )
    return count, "cpu_bytes_to_use"


def records_bytes(policy: str, num_chunks: int) -> int:
    """The most the scheduler's manager of a tier of ``num_chunks`` keeps beside the KV
    data, every history full: what ``policy`` states a tier of it keeps
    (``CachePolicy.metadata_bound``: slots, keys, the policy's tables, the hashes they keep
    alive) and the miss reasons it remembers (``attribution_bytes``; a worker's manager
    attributes misses)."""
    return metadata_bound(policy).at(num_chunks) + attribution_bytes(num_chunks)


def _check_chunk_fits(
    extra_config: Mapping[str, Any],
    bytes_per_chunk: int,
    blocks_per_chunk: int,
    world_size: int,
    policy: str,
    bound: MemoryBound,
) -> None:
    """Refuse a chunk that alone, with its records, is more than ``bound``: then no tier
    fits, and the key to change is the chunk size, not the tier's.

    Checked before the tier is sized: the memory check named the tier's key
    (``num_cpu_blocks`` or ``cpu_bytes_to_use``), which cannot help, and for a
    ``cpu_bytes_to_use`` below one chunk the error asked for more bytes, which the
    memory check then refused.
    """
    tier_bytes = bytes_per_chunk + records_bytes(policy, 1)
    if tier_bytes <= bound.num_bytes:
        return
    if blocks_per_chunk > 1:
        key = _chunk_size_key(extra_config)
        given = extra_config.get(key, blocks_per_chunk)
        fix = f"lower {key} (given {key}={shown_repr(given)})"
    else:
        fix = "a chunk of one GPU block cannot be smaller: this host cannot hold the tier"
    raise ConfigError(
        f"one offloaded chunk takes {shown_repr(tier_bytes)} bytes with kvscope's records "
        f"for it ({shown_repr(blocks_per_chunk)} GPU block(s) on each of {world_size} "
        f"worker(s)), more than {bound.what}, {size_text(bound.num_bytes)} "
        f"({bound.num_bytes} bytes): no tier fits, whatever cpu_bytes_to_use or "
        f"num_cpu_blocks; {fix}"
    )


def _check_fits_host(
    num_chunks: int,
    bytes_per_chunk: int,
    lower: str,
    policy: str,
    bound: MemoryBound,
) -> None:
    """Refuse a tier larger than ``bound`` (the host's memory, or the cgroup's limit where
    lower) before allocating any of it: past either, the worker is killed during its
    zero-fill. One chunk fits (``_check_chunk_fits``), so ``lower`` names the tier's key,
    and with ``num_cpu_blocks`` the chunk's too when it is more than one GPU block.

    The manager's records count too (``records_bytes``): with vLLM reporting 0 KV bytes per
    block (a GPU cache of 0 blocks), a tier of 2**31 empty chunks otherwise passed, and
    building its manager failed with a MemoryError naming no key; and with gated, whose
    offer histories keep 64 hashes a slot, they are tens of KiB a chunk.
    """
    records = records_bytes(policy, num_chunks)
    tier_bytes = num_chunks * bytes_per_chunk + records
    if tier_bytes > bound.num_bytes:
        raise ConfigError(
            f"the CPU tier would take {shown_repr(tier_bytes)} bytes ({num_chunks} chunks of "
            f"{shown_repr(bytes_per_chunk)} bytes, and {records} bytes of kvscope's records at "
            f"most, {records // num_chunks} a chunk, with eviction_policy {policy!r:.80}), more "
            f"than {bound.what}, {size_text(bound.num_bytes)} ({bound.num_bytes} bytes); "
            f"lower {lower}"
        )


def _policy(extra_config: Mapping[str, Any]) -> str:
    """The eviction policy's name, after loading ``cache_policy_module_path`` if given.

    As in vLLM, the module path names where the policy class called
    ``eviction_policy`` lives; it must be a kvscope ``CachePolicy``.
    """
    name = extra_config.get("eviction_policy", "lru")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"eviction_policy={shown_repr(name)} must be a policy name")
    module_path = extra_config.get("cache_policy_module_path")
    # Checked whatever the name: beside a registered one the path is not read, and a
    # number or a list there passed unnoticed.
    if module_path is not None and not isinstance(module_path, str):
        raise ConfigError(
            f"cache_policy_module_path={shown_repr(module_path)} must be a module path"
        )
    if module_path is not None and name not in policy_names():  # vLLM's order: registry first
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:  # a missing module, "" or "..x", or one failing as it runs
            raise ConfigError(
                f"cache_policy_module_path={shown_repr(module_path)} cannot be imported: "
                f"{type(exc).__name__}: {shown(exc)}"
            ) from exc
        policy_cls = getattr(module, name, None)
        if not (isinstance(policy_cls, type) and issubclass(policy_cls, CachePolicy)):
            raise ConfigError(
                f"cache_policy_module_path={shown_repr(module_path)} has no kvscope "
                f"CachePolicy named {shown_repr(name)}"
            )
        if getattr(policy_cls, "name", None) != name:
            quoted = shown_repr(name)
            raise ConfigError(f"policy class {quoted} must declare name = {quoted}")
        try:
            register_policy(policy_cls)
        except (TypeError, ValueError) as exc:  # abstract, or a name another class holds
            raise ConfigError(
                f"cache_policy_module_path={shown_repr(module_path)}: {shown(exc)}"
            ) from exc
    if name not in policy_names():
        raise ConfigError(
            f"eviction_policy={shown_repr(name)} is not a known policy; use one of: "
            + ", ".join(policy_names())
            + " (or name a module holding it with cache_policy_module_path)"
        )
    return name


def _endpoint(extra_config: Mapping[str, Any], key: str, rank: int) -> str | None:
    """The endpoint data-parallel rank ``rank`` binds for ``key``, None when not given.

    Checked by shape only, not against this host's interfaces: vLLM builds the spec in
    every worker process too, on every node, and only the scheduler binds, which checks
    them against its host's as it does (``interface_refusal``, offload/vllm/spec.py)."""
    value = extra_config.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f"{key}={shown_repr(value)} must be a ZMQ endpoint to bind, such as tcp://*:5557 or "
            "ipc:///tmp/kvscope"
        )
    refusal = endpoint_refusal(value, bind=True)
    if refusal is not None:
        raise ConfigError(f"{key}={shown_repr(value)} {refusal}")
    moved = offset_endpoint(value, rank)
    refusal = endpoint_refusal(moved, bind=True)
    if refusal is not None:  # a port moved past 65535, a path past a unix socket's limit
        raise ConfigError(
            f"{key}={shown_repr(value)}: data-parallel rank {rank} binds {shown_repr(moved)}, "
            f"which {refusal}"
        )
    return moved


def _check_apart(endpoint: str, replay: str, ranks: int) -> None:
    """Refuse endpoints that one engine, or two data-parallel ranks, would bind twice."""
    if endpoint == replay:
        raise ConfigError(
            f"kvscope_replay_endpoint={shown_repr(replay)} is kvscope_endpoint's too: "
            "the replay socket needs an endpoint of its own"
        )
    if ports_overlap(endpoint, replay, ranks):
        raise ConfigError(
            f"kvscope_replay_endpoint={shown_repr(replay)} and "
            f"kvscope_endpoint={shown_repr(endpoint)} would "
            f"bind one port twice: with {ranks} data-parallel rank(s), each moving both "
            f"ports up by its rank, keep the ports at least {ranks} apart"
        )


def _sample_rate(extra_config: Mapping[str, Any], endpoint: str | None) -> float:
    """The sampling rate, 0 or in [``MIN_SAMPLE_RATE``, 1]: the demo's default, and 0 to
    turn the stream off.

    A string is read by kvscope's one rule for numbers in text
    (``offload/decimal_text.py``), as ``kvscope demo --sample-rate`` reads
    its rate: ``float()`` would also take ``" 0.5 "``, ``"+0.5"``, ``"0_5"``
    and ``"nan"``.

    The sample travels on kvscope's publisher, so a rate set without
    ``kvscope_endpoint`` would sample into nothing: that is refused, as a
    replay endpoint without a publisher is. Left out, the rate is the
    default with a publisher and 0 without one.
    """
    value = extra_config.get("sample_rate")
    if value is None:
        return DEFAULT_RATE if endpoint is not None else 0.0
    rate: float | None = None
    if isinstance(value, float) and is_negative_zero(value):  # refused as the text "-0" is
        raise ConfigError(
            f"kv_connector_extra_config sample_rate={shown_repr(value)} must be a number from 0 "
            f"(no sample) to 1 (every block): {NEGATIVE_ZERO}"
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        # Compared before converting: an int may be beyond any float.
        rate = float(value) if 0 <= value <= 1 else None
    elif isinstance(value, str):
        try:
            rate = fractional_number(value)
        except ValueError as exc:
            raise ConfigError(
                f"kv_connector_extra_config sample_rate={shown_repr(value)} must be {exc}"
            ) from None
    if rate is None or not is_worker_rate(rate):
        raise ConfigError(
            f"kv_connector_extra_config sample_rate={shown_repr(value)} must be a number "
            f"from 0 (no sample) to 1 (every block), and 0 or at least {MIN_SAMPLE_RATE:g}"
        )
    if rate > 0 and endpoint is None:
        raise ConfigError(
            f"sample_rate={shown_repr(value)} needs kvscope_endpoint: the sample goes to kvscope's "
            "publisher (set sample_rate to 0, or give kvscope_endpoint)"
        )
    return rate
