"""vLLM's KV-event wire schema, so that anything reading vLLM's events reads ours.

Field names, order, tagging and defaults are vLLM 0.33's
(``vllm/distributed/kv_events.py``), restated rather than imported because the
core must not depend on the vLLM package;
``tests/offload/test_kv_events_vllm.py`` decodes our bytes with vLLM's classes
(and theirs with ours) to keep this file honest. docs/PROTOCOL.md spells out
the bytes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from offload.base import OffloadingEvent
from offload.wire.untrusted import decode

WireBlockHash = bytes | int
"""The block-hash types the wire format carries (vLLM's ExternalBlockHash)."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One publish step's events, stamped with the wall-clock time of the step."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged event union: the tag is the subclass's name."""


class BlockStored(KVCacheEvent):
    """Blocks that became readable on ``medium``; fields in vLLM 0.33's order.

    The untyped ``extra_keys`` entries are whatever vLLM hashed alongside the
    tokens (LoRA name, multimodal identifiers, cache salt); kvscope never sets
    them but must carry them when relaying vLLM's own events.
    """

    block_hashes: list[WireBlockHash]
    parent_block_hash: WireBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks that left ``medium``; fields in vLLM 0.33's order."""

    block_hashes: list[WireBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """Every block on the publisher's media is gone (e.g. a cache reset)."""


class KVEventBatch(EventBatch):
    """The batch type consumers decode: events narrowed to the tagged union."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def to_kv_events(events: list[OffloadingEvent]) -> list[BlockStored | BlockRemoved]:
    """Translate the manager's events into vLLM's, one for one and in order.

    The offloading manager never sees tokens, so that field carries vLLM's
    "not known" value (no token ids); the parent is the event's own, set
    where the blocks continue one chain, and so is the KV cache group. This
    runs for every event published, so it is one comprehension with
    positional arguments (cheaper than a call per event, or keywords):
    BlockStored's are (block_hashes, parent_block_hash, token_ids,
    block_size, lora_id, medium, lora_name, extra_keys, group_idx).
    """
    return [
        BlockRemoved(e.block_hashes, e.medium, e.group_idx)
        if e.removed
        else BlockStored(
            e.block_hashes,
            e.parent_block_hash,
            [],
            e.block_size,
            None,
            e.medium,
            None,
            None,
            e.group_idx,
        )
        for e in events
    ]


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload of one batch, as vLLM's publisher would send it."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode a batch published by kvscope or by vLLM itself.

    Raises ``msgspec.DecodeError`` (a ``ValueError``) on malformed payloads.
    """
    return decode(_DECODER, payload)
