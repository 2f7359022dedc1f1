"""KV cache geometry, shared by every transfer backend.

Where a block's bytes lie in each layer's tensor, and whether a job is
valid, depend only on the geometry, never on the device, so the CPU and CUDA
backends validate and plan jobs here, identically, before any byte moves.
A job names N CPU blocks and N * ``block_size_factor`` GPU blocks (rows).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from offload.base import positive_count
from offload.shown import shown_repr
from offload.transfer.canonical import canonical_layer_tensors
from offload.transfer.job import Direction, GpuRun

KV_DIM_SIZE = 2
"""K and V, stacked in one tensor per layer."""
RANK = 5
"""(2 and num_blocks in either order, block_size, num_heads, head_dim)."""
BYTES_RANK = 2
"""(num_blocks, page_size_bytes): a block's bytes, whatever they hold."""


class KVOrder(enum.StrEnum):
    """Which leading dimension of a layer tensor is K/V and which is blocks.

    vLLM's attention backends disagree: FlashAttention stacks K and V first,
    FlashInfer puts blocks first. The copy only needs the block dimension.
    ``block_bytes`` is vLLM's canonical form (``KVLayout.from_canonical``):
    2-D ``(num_blocks, page_size_bytes)`` int8 tensors, one whole block per
    row, K and V (or whatever the page holds) not told apart.
    """

    KV_FIRST = "kv_first"
    BLOCKS_FIRST = "blocks_first"
    BLOCK_BYTES = "block_bytes"

    @property
    def block_dim(self) -> int:
        """The dimension indexed by block id."""
        return 1 if self is KVOrder.KV_FIRST else 0

    @property
    def kv_dim(self) -> int | None:
        """The dimension of size 2 holding K and V; None where the order has none."""
        if self is KVOrder.BLOCK_BYTES:
            return None
        return 1 - self.block_dim

    @property
    def rank(self) -> int:
        """Dimensions of a layer tensor."""
        return BYTES_RANK if self is KVOrder.BLOCK_BYTES else RANK

    @property
    def shape_text(self) -> str:
        """A layer tensor's shape, for error messages."""
        if self is KVOrder.BLOCK_BYTES:
            return "(num_blocks, page_size_bytes)"
        leading = ("2", "num_blocks") if self is KVOrder.KV_FIRST else ("num_blocks", "2")
        return f"({', '.join(leading)}, block_size, num_heads, head_dim)"


@dataclass(frozen=True, slots=True, eq=False)
class TransferPlan:
    """One validated job, in the unit the copy works in: GPU-block-sized rows.

    ``src_rows[i]`` of the source tensors goes to ``dst_rows[i]`` of the
    destination tensors, whichever way the job runs. The index tensors are
    the plan's own copies, so a caller mutating its lists after ``submit``
    cannot change a job in flight.
    """

    direction: Direction
    src_rows: torch.Tensor
    dst_rows: torch.Tensor
    num_blocks: int
    """Offloaded (CPU) blocks moved."""
    bytes: int


class KVLayout:
    """The GPU KV cache's per-layer tensors and the offloaded block size.

    Every layer must share shape, dtype and device: a job's block ids mean
    the same rows in every layer, and one byte count describes a block.
    """

    def __init__(
        self,
        gpu_tensors: Sequence[torch.Tensor],
        block_size_factor: int = 1,
        order: KVOrder | str = KVOrder.KV_FIRST,
    ) -> None:
        self.order = _member(KVOrder, order, "KV order")
        self.gpu_tensors = tuple(gpu_tensors)
        self.block_size_factor = positive_count("block_size_factor", block_size_factor)
        _check_layers(self.gpu_tensors, self.order)
        self.rows(self.gpu_tensors)  # strides that defeat row views fail here, not mid-copy

    @classmethod
    def from_canonical(cls, kv_caches: object, block_size_factor: int = 1) -> KVLayout:
        """The layout of vLLM's ``CanonicalKVCaches`` (vLLM 0.33), in the ``block_bytes`` order.

        Duck-typed: ``kv_caches.tensors`` (each with ``.tensor`` and
        ``.page_size_bytes``) and ``kv_caches.group_data_refs`` are read, and
        vLLM is never imported. Every canonical tensor becomes one layer, so
        a job moves every tensor's pages, as vLLM's own CPU worker does.
        Raises ValueError, naming the shape, for what a layout cannot hold:
        see ``offload.transfer.canonical``.
        """
        return cls(canonical_layer_tensors(kv_caches), block_size_factor, KVOrder.BLOCK_BYTES)

    @property
    def num_layers(self) -> int:
        return len(self.gpu_tensors)

    @property
    def num_gpu_blocks(self) -> int:
        return self.gpu_tensors[0].shape[self.order.block_dim]

    @property
    def dtype(self) -> torch.dtype:
        return self.gpu_tensors[0].dtype

    @property
    def gpu_block_size(self) -> int:
        """Tokens per GPU block."""
        return self._geometry(2, "gpu_block_size")

    @property
    def num_heads(self) -> int:
        return self._geometry(3, "num_heads")

    @property
    def head_dim(self) -> int:
        return self._geometry(4, "head_dim")

    def _geometry(self, dim: int, name: str) -> int:
        if self.order is KVOrder.BLOCK_BYTES:
            raise ValueError(
                f"a {self.order} layout does not record {name}: its tensors are "
                f"{self.order.shape_text} bytes"
            )
        return self.gpu_tensors[0].shape[dim]

    @property
    def bytes_per_gpu_block(self) -> int:
        """One GPU block's bytes across all layers, K and V."""
        per_layer = self.gpu_tensors[0].numel() // self.num_gpu_blocks
        return self.num_layers * per_layer * self.dtype.itemsize

    @property
    def bytes_per_cpu_block(self) -> int:
        """One offloaded block's bytes across all layers, K and V."""
        return self.bytes_per_gpu_block * self.block_size_factor

    def cpu_shape(self, num_cpu_blocks: int) -> tuple[int, ...]:
        """A CPU layer tensor's shape: the GPU one, with a row per GPU-sized sub-block.

        Mirroring the GPU order keeps both sides' rows equally strided, so a
        copy is a plain row gather and scatter in either direction.
        """
        shape = list(self.gpu_tensors[0].shape)
        rows = positive_count("num_cpu_blocks", num_cpu_blocks) * self.block_size_factor
        shape[self.order.block_dim] = rows
        return tuple(shape)

    def rows(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """2-D (blocks, row) views of layer tensors: every block's bytes, one row per plane.

        A plane is where a block's bytes are contiguous: K and V apart in the
        kv_first order, together in blocks_first. Rows let a backend move a
        whole job with one gather and one scatter per plane. Views, never
        copies, so writing a row writes the cache; the result is layer-major,
        K before V, for the GPU and the CPU side alike.
        """
        kv_first = self.order is KVOrder.KV_FIRST  # block_bytes rows are whole blocks already
        views: list[torch.Tensor] = []
        for tensor in tensors:
            planes = tensor.unbind(0) if kv_first else (tensor,)
            try:
                views += [plane.view(plane.shape[0], -1) for plane in planes]
            except RuntimeError:
                raise ValueError(
                    f"a block's bytes are not contiguous in a {self.order} layer tensor of "
                    f"shape {tuple(tensor.shape)} and strides {tensor.stride()}"
                ) from None
        return views

    def wide_rows(
        self, cpu_tensors: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """GPU and CPU rows, viewed alike as the widest element type that tiles them all.

        ``dtypes`` are the candidates, widest first; bytes (``uint8``) when none
        fits. Both sides share the element type, so rows (or staging buffers of
        them) move between the sides as is; a GPU view with an odd offset
        narrows both. Moving bits between same-typed tensors never changes them.
        """
        gpu_rows, cpu_rows = self.rows(self.gpu_tensors), self.rows(cpu_tensors)
        for dtype in dtypes:
            try:
                return [r.view(dtype) for r in gpu_rows], [r.view(dtype) for r in cpu_rows]
            except RuntimeError:  # a row's bytes or offset not a multiple of the width
                continue
        return [r.view(torch.uint8) for r in gpu_rows], [r.view(torch.uint8) for r in cpu_rows]

    def allocate_cpu_tensors(self, num_cpu_blocks: int) -> list[torch.Tensor]:
        """The CPU tier's storage, one tensor per layer.

        Zero-filled rather than empty so every page is touched now, at
        start-up, not during the first transfers, and no stale memory is
        ever loaded into the GPU cache. Pinned only when CUDA exists, since
        pinning needs a CUDA context and only pays off for device copies.
        """
        shape = self.cpu_shape(num_cpu_blocks)
        pin = torch.cuda.is_available()
        return [
            torch.zeros(shape, dtype=self.dtype, device="cpu", pin_memory=pin)
            for _ in range(self.num_layers)
        ]

    def plan(
        self,
        direction: Direction | str,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        num_cpu_blocks: int,
        gpu_runs: Sequence[GpuRun] | None = None,
    ) -> TransferPlan:
        """Validate a job and translate its block ids into rows; raises ValueError.

        Each of ``gpu_runs`` fills CPU blocks of its own, from its offset in
        the first (see ``TransferBackend.submit``). Everything a backend
        must refuse is caught here, before the job is queued: an unknown
        direction, ids that are not ints, negative or out of range, runs
        that do not add up to the GPU side or start outside a CPU block, side
        lengths that do not match ``block_size_factor`` and the runs, and a
        destination block named twice (the copy's result would depend on
        the order the writes land in).
        """
        direction = _member(Direction, direction, "direction")
        to_cpu = direction is Direction.GPU_TO_CPU
        sides = {"src_blocks": src_blocks, "dst_blocks": dst_blocks}
        gpu_name = "src_blocks" if to_cpu else "dst_blocks"
        cpu_name = "dst_blocks" if to_cpu else "src_blocks"
        gpu_ids = _block_ids(gpu_name, sides[gpu_name], "GPU", self.num_gpu_blocks)
        cpu_ids = _block_ids(cpu_name, sides[cpu_name], "CPU", num_cpu_blocks)
        factor = self.block_size_factor
        runs = [GpuRun(gpu_ids.size)] if gpu_runs is None else _runs(gpu_runs, factor)
        in_runs = sum(run.blocks for run in runs)
        if in_runs != gpu_ids.size:
            raise ValueError(
                f"gpu_runs hold {in_runs} GPU blocks but {gpu_name} has {gpu_ids.size}"
            )
        spans = [-(-(run.blocks + run.offset) // factor) if run.blocks else 0 for run in runs]
        if cpu_ids.size != sum(spans):
            starts = ", ".join(str(run.offset) for run in runs)
            raise ValueError(
                f"{gpu_name} has {gpu_ids.size} GPU blocks from row {starts} but "
                f"{cpu_name} has {cpu_ids.size} CPU blocks; with block_size_factor "
                f"{factor} that must be {sum(spans)} CPU blocks"
            )
        dst_medium, dst_ids = ("CPU", cpu_ids) if to_cpu else ("GPU", gpu_ids)
        _check_distinct(dst_medium, dst_ids)
        firsts = np.cumsum([0, *spans[:-1]])
        cpu_rows = np.concatenate(
            [
                _cpu_rows(cpu_ids[first : first + span], run, factor)
                for run, span, first in zip(runs, spans, firsts, strict=True)
            ]
        )
        src_rows, dst_rows = (gpu_ids, cpu_rows) if to_cpu else (cpu_rows, gpu_ids)
        return TransferPlan(
            direction,
            torch.from_numpy(src_rows),
            torch.from_numpy(dst_rows),
            cpu_ids.size,
            gpu_ids.size * self.bytes_per_gpu_block,
        )


def _runs(gpu_runs: Sequence[GpuRun], factor: int) -> list[GpuRun]:
    """The runs as given, each checked: (blocks, offset) or (blocks,), a block count, an
    offset inside a CPU block."""
    try:
        runs = [GpuRun(*run) for run in gpu_runs]
    except TypeError:
        raise ValueError(
            f"gpu_runs must be a sequence of GpuRun(blocks, offset), got {shown_repr(gpu_runs)}"
        ) from None
    for run in runs:
        if type(run.blocks) is not int or run.blocks < 0:
            raise ValueError(f"a GPU run's blocks must be a count, got {run.blocks!r}")
        if type(run.offset) is not int or not 0 <= run.offset < factor:
            raise ValueError(
                f"a GPU run's offset must be a row of a CPU block, from 0 to {factor - 1} "
                f"with block_size_factor {factor}, got {run.offset!r}"
            )
    return runs


def _cpu_rows(cpu_ids: np.ndarray, run: GpuRun, factor: int) -> np.ndarray:
    """The CPU rows one run's GPU blocks fill: from its offset on, through its CPU blocks."""
    positions = np.arange(run.offset, run.offset + run.blocks)
    return cpu_ids[positions // factor] * factor + positions % factor


_E = TypeVar("_E", bound=enum.StrEnum)


def _member(enum_cls: type[_E], value: _E | str, what: str) -> _E:
    """The enum member for a value, or a ValueError listing the accepted ones."""
    try:
        return enum_cls(value)
    except ValueError:
        known = ", ".join(repr(str(member)) for member in enum_cls)
        raise ValueError(f"unknown {what} {value!r}; expected one of {known}") from None


def _check_layers(tensors: tuple[torch.Tensor, ...], order: KVOrder) -> None:
    """Every layer a tensor of the order's rank and K/V size, no dimension empty, all alike."""
    if not tensors:
        raise ValueError("a KV layout needs at least one layer tensor")
    for layer, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"layer {layer} is a {type(tensor).__name__}, not a torch.Tensor")
        shape = tuple(tensor.shape)
        kv_dim = order.kv_dim
        wrong_kv = kv_dim is not None and tensor.ndim > kv_dim and shape[kv_dim] != KV_DIM_SIZE
        if tensor.ndim != order.rank or wrong_kv or 0 in shape:
            raise ValueError(
                f"layer {layer} has shape {shape}; the {order} order needs "
                f"{order.shape_text}, no dimension empty"
            )
        first = tensors[0]
        for what, mine, theirs in (
            ("shape", shape, tuple(first.shape)),
            ("dtype", tensor.dtype, first.dtype),
            ("device", tensor.device, first.device),
        ):
            if mine != theirs:
                raise ValueError(
                    f"layer {layer} has {what} {mine} but layer 0 has {theirs}; "
                    "every layer must match"
                )


def _block_ids(name: str, blocks: Sequence[int], medium: str, limit: int) -> np.ndarray:
    """The ids as a fresh int64 array, each in [0, limit).

    numpy, not torch: numpy checks a handful of ids far faster, and small
    jobs are the common case.
    The array is always a copy, so the caller may reuse its sequence.
    """
    if isinstance(blocks, torch.Tensor):
        blocks = blocks.numpy(force=True)
    try:
        ids = np.array(blocks)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} must be a sequence of int block ids: {exc}") from None
    if ids.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of block ids, got {ids.ndim} dims")
    if ids.size == 0:
        raise ValueError(f"{name} is empty; a job must move at least one block")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold int block ids, got {ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        raise ValueError(f"{name} has negative {medium} block id {low}")
    if high >= limit:
        raise ValueError(
            f"{name} has {medium} block id {high}, out of range: "
            f"the {medium} side has {limit} blocks (ids 0 to {limit - 1})"
        )
    return ids.astype(np.int64, copy=False)


def _check_distinct(medium: str, dst_ids: np.ndarray) -> None:
    ordered = np.sort(dst_ids)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size:
        raise ValueError(f"dst_blocks names {medium} block {int(repeated[0])} more than once")
