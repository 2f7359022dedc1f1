"""``KVLayout.from_canonical``: vLLM 0.33's ``CanonicalKVCaches`` as a transfer layout.

The canonical forms vLLM builds (``register_kv_caches`` in its offloading
connector worker) are rebuilt here over small CPU caches: one int8
``(num_blocks, page_size_bytes)`` view per layer, rows exactly a page apart
or further (padding), and one packed tensor holding every layer of a block.
Each must survive a CPU backend round trip byte for byte. The last test
builds the real ``CanonicalKVCaches``, run from the vLLM wheel's own source.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType

import pytest
import torch

from bench.tooling.vllm_wheel import WheelUnavailable, load_member, stand_in
from offload.transfer import CPUTransferBackend, KVLayout, KVOrder
from tests.support import kv_caches
from tests.support.kv_caches import random_bits


@dataclass
class Tensor:
    """The attributes vLLM 0.33's ``CanonicalKVCacheTensor`` has."""

    tensor: torch.Tensor
    page_size_bytes: int


@dataclass
class Ref:
    """The attributes vLLM 0.33's ``CanonicalKVCacheRef`` has."""

    tensor_idx: int
    page_size_bytes: int
    mapping: object | None = None


@dataclass
class Caches:
    """The attributes vLLM 0.33's ``CanonicalKVCaches`` has."""

    tensors: list[Tensor]
    group_data_refs: list[list[Ref]] = field(default_factory=list)


NUM_BLOCKS = 24
GEOMETRY = (4, 2, 8)  # block_size, heads, head_dim


def byte_rows(layer: torch.Tensor) -> torch.Tensor:
    """A layer's blocks-first cache as vLLM's canonical int8 (num_blocks, page) view."""
    return layer.view(torch.int8).view(layer.shape[0], -1)


def per_layer(num_layers: int, dtype: torch.dtype = torch.float16) -> Caches:
    """K/V fused in each block (blocks first), one canonical tensor per layer."""
    shape = (NUM_BLOCKS, 2, *GEOMETRY)
    rows = [byte_rows(random_bits(shape, dtype, seed)) for seed in range(num_layers)]
    page = rows[0].shape[1]
    return Caches([Tensor(r, page) for r in rows], [[Ref(i, page) for i in range(num_layers)]])


def padded(num_layers: int, page: int, stride: int) -> Caches:
    """Rows further apart than a page: a block's page, then bytes no layer owns."""
    tensors = []
    for seed in range(num_layers):
        storage = random_bits((NUM_BLOCKS, stride), torch.int8, seed)
        tensors.append(Tensor(storage[:, :page], page))
    return Caches(tensors, [[Ref(i, page - 8) for i in range(num_layers)]])


def packed(num_layers: int) -> Caches:
    """Every layer interleaved in each block: one tensor, one ref per group, as vLLM packs."""
    block = (num_layers, 2, *GEOMETRY)
    cache = random_bits((NUM_BLOCKS, *block), torch.bfloat16, 5)
    rows = byte_rows(cache)
    page = rows.shape[1]
    return Caches([Tensor(rows, page)], [[Ref(0, page)], [Ref(0, page)]])


def round_trip(layout: KVLayout, num_cpu_blocks: int, num_blocks: int, seed: int) -> None:
    kv_caches.round_trip(layout, CPUTransferBackend, num_cpu_blocks, num_blocks, seed)


@pytest.mark.parametrize("factor", [1, 2, 3])
@pytest.mark.parametrize(
    "caches",
    [per_layer(1), per_layer(3), per_layer(2, torch.float32), padded(2, 96, 160), packed(3)],
    ids=["one_layer", "three_layers", "float32", "padded_rows", "packed"],
)
def test_every_canonical_form_round_trips_byte_exact(caches: Caches, factor: int) -> None:
    layout = KVLayout.from_canonical(caches, factor)

    assert layout.order is KVOrder.BLOCK_BYTES
    assert layout.num_layers == len(caches.tensors)
    assert layout.num_gpu_blocks == NUM_BLOCKS
    page = caches.tensors[0].page_size_bytes
    assert layout.bytes_per_gpu_block == len(caches.tensors) * page
    round_trip(layout, num_cpu_blocks=5, num_blocks=4, seed=factor)


def test_padding_between_rows_is_neither_stored_nor_overwritten() -> None:
    caches = padded(1, 96, 160)
    storage = caches.tensors[0].tensor
    padding = torch.as_strided(storage, (NUM_BLOCKS, 64), (160, 1), storage.storage_offset() + 96)
    before = padding.clone()
    layout = KVLayout.from_canonical(caches)

    round_trip(layout, num_cpu_blocks=4, num_blocks=3, seed=1)

    assert torch.equal(padding, before)
    assert layout.cpu_shape(4) == (4, 96)


def test_the_layout_views_vllms_tensors_without_copying() -> None:
    caches = per_layer(2)
    layout = KVLayout.from_canonical(caches)

    for ours, theirs in zip(layout.gpu_tensors, caches.tensors, strict=True):
        assert ours is theirs.tensor


def test_a_byte_layout_has_no_token_geometry() -> None:
    layout = KVLayout.from_canonical(per_layer(1))

    for name in ("gpu_block_size", "num_heads", "head_dim"):
        with pytest.raises(ValueError, match=f"block_bytes layout does not record {name}"):
            getattr(layout, name)


def _wide(num_blocks: int, page: int) -> Tensor:
    return Tensor(torch.zeros(num_blocks, page, dtype=torch.int8), page)


UNSUPPORTED = [
    (Caches([]), "tensors is empty"),
    (object(), "object has no tensors list"),
    (Caches([Tensor(torch.zeros(4, 8), 32)]), r"shape \(4, 8\) and dtype torch.float32"),
    (
        Caches([Tensor(torch.zeros(4, 2, 8, dtype=torch.int8), 16)]),
        r"shape \(4, 2, 8\) and dtype torch.int8",
    ),
    (Caches([Tensor(torch.zeros(4, 8, dtype=torch.int8), 16)]), "rows of 8 bytes but page"),
    (Caches([_wide(4, 8), _wide(4, 16)]), r"\(4, 16\) but tensor 0 is \(4, 8\).*hybrid caches"),
    (Caches([_wide(4, 8), _wide(5, 8)]), r"\(5, 8\) but tensor 0 is \(4, 8\)"),
    (
        Caches([Tensor(torch.zeros(8, 4, dtype=torch.int8).t(), 8)]),
        "a block's bytes must be contiguous",
    ),
    (Caches([_wide(4, 8)], [[Ref(1, 8)]]), r"group_data_refs\[0\]\[0\] names canonical tensor 1"),
    (Caches([_wide(4, 8)], [[Ref(0, 8)], [Ref(0, 9)]]), r"\[1\]\[0\] has a page of 9 bytes"),
    (Caches([_wide(4, 8)], [[object()]]), "without int tensor_idx"),
    (Caches([object()]), "without a tensor and an int page_size_bytes"),
]


@pytest.mark.parametrize(("caches", "message"), UNSUPPORTED)
def test_shapes_a_layout_cannot_hold_raise_naming_them(caches: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVLayout.from_canonical(caches)


BASE_MEMBER = "vllm/v1/kv_offload/base.py"


@pytest.fixture(scope="module")
def vllm_base() -> Iterator[ModuleType]:
    """vLLM 0.33.0's ``kv_offload/base.py``, executed from the wheel's own source.

    Its three vLLM imports serve other classes in the file, so stand-ins do:
    ``KvHintsEnvelope`` is only an annotation of ``ReqContext``, the other two
    are used inside methods this test does not call.
    """
    stand_ins = {
        "vllm.v1.kv_hints": stand_in("vllm.v1.kv_hints", KvHintsEnvelope=type("KvHints", (), {})),
        "vllm.v1.kv_offload.config": stand_in("vllm.v1.kv_offload.config", OffloadingConfig=object),
        "vllm.v1.metrics.cache_hit_source": stand_in(
            "vllm.v1.metrics.cache_hit_source", CacheHitSource=object
        ),
    }
    try:
        module = load_member(BASE_MEMBER, "vllm_0_33_kv_offload_base", stand_ins)
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
    yield module


def test_vllms_own_canonical_kv_caches_round_trip(vllm_base: ModuleType) -> None:
    shape = (NUM_BLOCKS, 2, *GEOMETRY)
    rows = [byte_rows(random_bits(shape, torch.float16, seed)) for seed in range(2)]
    page = rows[0].shape[1]
    theirs = vllm_base.CanonicalKVCaches(
        tensors=[vllm_base.CanonicalKVCacheTensor(tensor=r, page_size_bytes=page) for r in rows],
        group_data_refs=[
            [vllm_base.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page) for i in range(2)]
        ],
    )

    layout = KVLayout.from_canonical(theirs, block_size_factor=2)

    assert layout.num_layers == 2
    assert layout.bytes_per_cpu_block == 2 * 2 * page
    round_trip(layout, num_cpu_blocks=4, num_blocks=3, seed=11)
