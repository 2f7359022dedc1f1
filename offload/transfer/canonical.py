"""vLLM's canonical KV cache description, read into layer tensors for ``KVLayout``.

vLLM 0.33 hands an offloading worker ``CanonicalKVCaches``
(``vllm/v1/kv_offload/base.py``): ``tensors``, the unique block tensors,
each a ``CanonicalKVCacheTensor`` with ``tensor`` (int8, shaped
``(num_blocks, page_size_bytes)``, blocks first, a block's bytes contiguous
in its row but rows possibly further apart than a page) and
``page_size_bytes``; and ``group_data_refs``, per KV cache group the
``CanonicalKVCacheRef`` of each layer: ``tensor_idx`` into ``tensors``,
the layer's un-padded ``page_size_bytes``, and an optional ``mapping`` onto a
parallelism-free page. Layers sharing bytes share one tensor; a packed cache
(all layers interleaved in one block) is a single tensor.

Read by attribute, never by importing vLLM. What a ``KVLayout`` cannot hold
raises ValueError naming the shape: tensors that are not 2-D int8 byte
rows, a ``page_size_bytes`` other than the row's length, tensors whose
page sizes or block counts differ (hybrid caches), and refs naming a tensor
that is not there or a page longer than the tensor's. A ref's ``mapping``
is not used: kvscope stores each rank's own pages as they lie on the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BYTES_DTYPE = torch.int8
"""vLLM's canonical tensors are int8 views of the cache's bytes."""


def canonical_layer_tensors(kv_caches: object) -> list[torch.Tensor]:
    """The canonical tensors, checked, in ``kv_caches.tensors`` order; raises ValueError."""
    entries = _sequence(kv_caches, "tensors", "CanonicalKVCaches")
    if not entries:
        raise ValueError("CanonicalKVCaches.tensors is empty; a KV layout needs a tensor")
    tensors = [_byte_rows(index, entry) for index, entry in enumerate(entries)]
    first = tensors[0]
    for index, tensor in enumerate(tensors[1:], start=1):
        if tensor.shape != first.shape:
            raise ValueError(
                f"canonical tensor {index} is (num_blocks, page_size_bytes) = "
                f"{tuple(tensor.shape)} but tensor 0 is {tuple(first.shape)}; a KV layout "
                "needs one block count and one page size (hybrid caches are not supported)"
            )
    page_size = first.shape[1]
    groups = _sequence(kv_caches, "group_data_refs", "CanonicalKVCaches")
    for group, refs in enumerate(groups):
        for position, ref in enumerate(refs):
            _check_ref(group, position, ref, len(tensors), page_size)
    return tensors


def _sequence(owner: object, name: str, kind: str) -> Sequence[object]:
    value = getattr(owner, name, None)
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ValueError(f"{type(owner).__name__} has no {name} list; expected vLLM 0.33's {kind}")
    return value


def _byte_rows(index: int, entry: object) -> torch.Tensor:
    tensor = getattr(entry, "tensor", None)
    page_size = getattr(entry, "page_size_bytes", None)
    if not isinstance(tensor, torch.Tensor) or not isinstance(page_size, int):
        raise ValueError(
            f"canonical tensor {index} is a {type(entry).__name__} without a tensor and "
            "an int page_size_bytes; expected vLLM 0.33's CanonicalKVCacheTensor"
        )
    shape = tuple(tensor.shape)
    if tensor.ndim != 2 or tensor.dtype != BYTES_DTYPE or 0 in shape:
        raise ValueError(
            f"canonical tensor {index} has shape {shape} and dtype {tensor.dtype}; "
            "a KV layout reads (num_blocks, page_size_bytes) int8 tensors, no dimension empty"
        )
    if shape[1] != page_size:
        raise ValueError(
            f"canonical tensor {index} has rows of {shape[1]} bytes but page_size_bytes "
            f"{page_size}; a KV layout needs a row to be exactly one page"
        )
    if tensor.stride(1) != 1:
        raise ValueError(
            f"canonical tensor {index} has strides {tensor.stride()}; a block's bytes must "
            "be contiguous in its row"
        )
    return tensor


def _check_ref(group: int, position: int, ref: object, num_tensors: int, page_size: int) -> None:
    where = f"group_data_refs[{group}][{position}]"
    tensor_idx = getattr(ref, "tensor_idx", None)
    ref_page = getattr(ref, "page_size_bytes", None)
    if not isinstance(tensor_idx, int) or not isinstance(ref_page, int):
        raise ValueError(
            f"{where} is a {type(ref).__name__} without int tensor_idx and page_size_bytes; "
            "expected vLLM 0.33's CanonicalKVCacheRef"
        )
    if not 0 <= tensor_idx < num_tensors:
        raise ValueError(
            f"{where} names canonical tensor {tensor_idx}, but there are {num_tensors} "
            f"(indices 0 to {num_tensors - 1})"
        )
    if not 0 < ref_page <= page_size:
        raise ValueError(
            f"{where} has a page of {ref_page} bytes; tensor {tensor_idx}'s pages are "
            f"{page_size} bytes, and a layer's page must fit in one"
        )
