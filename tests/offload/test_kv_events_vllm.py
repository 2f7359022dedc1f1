"""Our KV-event bytes against vLLM 0.33.0's own schema classes, both directions.

The classes under test on vLLM's side are its real definitions: the fixture
takes ``vllm/distributed/kv_events.py`` out of the vLLM 0.33.0 wheel and runs
it. Why not ``import vllm``: the package's import chain pulls in the whole
framework (CUDA kernels, torch extensions, transformers, a GPU platform
check), far more than this check needs and more than a CPU test machine has.
The one file needs only four vLLM-internal names at import time, none of which
shape the wire format, so minimal stand-ins are put in ``sys.modules`` while
the file loads and removed afterwards:

- ``KVEventsConfig`` and the network helpers serve vLLM's publisher class,
  which is defined in the file but not exercised here;
- ``init_logger`` is the standard logging call;
- ``ExternalBlockHash`` is ``bytes | int``, its definition in vLLM.

The wheel is cached (``~/.cache/kvscope/``, or a copy in the repository's
``.bench/``), so only the first run downloads it; the test is skipped, saying
why, only if it can be neither found nor downloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import msgspec
import pytest

from bench.tooling.vllm_wheel import WheelUnavailable, load_member, stand_in
from offload.base import OffloadingEvent
from offload.wire.kv_events import (
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    to_kv_events,
)

SCHEMA_MEMBER = "vllm/distributed/kv_events.py"


def _unused(*_args: object, **_kwargs: object) -> Any:
    raise AssertionError("vLLM's publisher is not part of this test")


def _stand_ins() -> dict[str, ModuleType]:
    return {
        "vllm.config.kv_events": stand_in("vllm.config.kv_events", KVEventsConfig=object),
        "vllm.logger": stand_in("vllm.logger", init_logger=logging.getLogger),
        "vllm.utils.network_utils": stand_in(
            "vllm.utils.network_utils",
            get_ip=_unused,
            get_tcp_uri=_unused,
            is_valid_ipv6_address=_unused,
            split_zmq_path=_unused,
        ),
        "vllm.v1.core.kv_cache_utils": stand_in(
            "vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int
        ),
    }


@pytest.fixture(scope="session")
def vllm_schema() -> Iterator[ModuleType]:
    """vLLM 0.33.0's kv_events module, executed from the wheel's own source.

    It stays registered in ``sys.modules`` for the session because msgspec
    resolves a struct's annotations through its module when a decoder is made.
    """
    try:
        module = load_member(SCHEMA_MEMBER, "vllm_0_33_kv_events", _stand_ins())
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
    yield module


def test_our_batches_decode_with_vllms_schema(vllm_schema: ModuleType) -> None:
    events = [
        OffloadingEvent([1, 2, 3], block_size=16, medium="CPU", removed=False),
        OffloadingEvent([b"\x00" * 32, b"\xff" * 32], 32, "CPU", False, b"\x02" * 32, 1),
        OffloadingEvent([2, b"\x01" * 32], block_size=16, medium="CPU", removed=True, group_idx=1),
    ]
    batch = KVEventBatch(ts=12.5, events=to_kv_events(events), data_parallel_rank=3)

    theirs = msgspec.msgpack.Decoder(vllm_schema.KVEventBatch).decode(encode_batch(batch))

    assert (theirs.ts, theirs.data_parallel_rank) == (12.5, 3)
    expected_types = [vllm_schema.BlockStored, vllm_schema.BlockStored, vllm_schema.BlockRemoved]
    assert [type(event) for event in theirs.events] == expected_types
    for got, sent in zip(theirs.events, events, strict=True):
        assert (got.block_hashes, got.medium) == (sent.block_hashes, "CPU")
        assert got.group_idx == sent.group_idx  # a tier's copy per KV cache group names it
        if not sent.removed:
            assert (got.block_size, got.token_ids, got.parent_block_hash) == (
                sent.block_size,
                [],
                sent.parent_block_hash,
            )


def _vllm_batch(vllm_schema: ModuleType) -> Any:
    """A batch as vLLM's GPU-side scheduler would publish it."""
    return vllm_schema.KVEventBatch(
        ts=99.0,
        events=[
            vllm_schema.BlockStored(
                block_hashes=[b"\xaa" * 32],
                parent_block_hash=b"\xbb" * 32,
                token_ids=list(range(16)),
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
            ),
            vllm_schema.BlockRemoved(block_hashes=[b"\xaa" * 32], medium="GPU"),
            vllm_schema.AllBlocksCleared(),
        ],
    )


def test_vllms_batches_decode_with_ours(vllm_schema: ModuleType) -> None:
    theirs = _vllm_batch(vllm_schema)

    ours = decode_batch(msgspec.msgpack.encode(theirs))

    assert msgspec.to_builtins(ours) == msgspec.to_builtins(theirs)


def test_both_schemas_write_the_same_bytes(vllm_schema: ModuleType) -> None:
    theirs = _vllm_batch(vllm_schema)
    ours = decode_batch(msgspec.msgpack.encode(theirs))

    assert encode_batch(ours) == msgspec.msgpack.encode(theirs)


def test_block_stored_with_every_field_round_trips(vllm_schema: ModuleType) -> None:
    fields: dict[str, Any] = {
        "block_hashes": [b"\x01" * 32, 7],
        "parent_block_hash": 6,
        "token_ids": [5, 6, 7, 8],
        "block_size": 2,
        "lora_id": 4,
        "medium": "CPU",
        "lora_name": "adapter-a",
        "extra_keys": [("adapter-a", "mm-digest", 3), None],
        "group_idx": 1,
        "kv_cache_spec_kind": "sliding_window",
        "kv_cache_spec_sliding_window": 128,
        "locality": "LOCAL",
        "ownership": "tier-2",
        "session_id": "session-9",
        "lookahead_token_ids": [[9], [10, 11]],
    }
    theirs = vllm_schema.BlockStored(**fields)
    assert sorted(fields) == sorted(vllm_schema.BlockStored.__struct_fields__)
    assert BlockStored.__struct_fields__ == vllm_schema.BlockStored.__struct_fields__
    batch = vllm_schema.KVEventBatch(ts=1.0, events=[theirs])

    ours = decode_batch(msgspec.msgpack.encode(batch))
    back = msgspec.msgpack.Decoder(vllm_schema.KVEventBatch).decode(encode_batch(ours))

    assert ours.events == [BlockStored(**fields)]
    assert back.events == [theirs]
