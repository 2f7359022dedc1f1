"""KV caches for the transfer backend tests: random layer tensors, layouts, block bytes.

The same helpers serve the CPU and the CUDA backend's tests; where they
differ it is only in the device the "GPU" cache lives on (``device``) and
the geometry the tests pick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from offload.transfer import (
    CPUTransferBackend,
    CUDATransferBackend,
    Direction,
    GpuRun,
    KVLayout,
    KVOrder,
    TransferResult,
)

Backend = TypeVar("Backend", CPUTransferBackend, CUDATransferBackend)


def random_bits(shape: Sequence[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A CPU tensor of random bytes: every bit pattern, NaNs included, must survive."""
    generator = torch.Generator().manual_seed(seed)
    numel = torch.Size(shape).numel()
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).view(*shape)


def gpu_shape(order: KVOrder, num_blocks: int, geometry: tuple[int, int, int]) -> tuple[int, ...]:
    if order is KVOrder.BLOCK_BYTES:  # K and V of a block, flattened into one row
        return (num_blocks, 2 * torch.Size(geometry).numel())
    leading = (2, num_blocks) if order is KVOrder.KV_FIRST else (num_blocks, 2)
    return (*leading, *geometry)


def make_layout(
    num_layers: int = 2,
    order: KVOrder = KVOrder.KV_FIRST,
    factor: int = 1,
    dtype: torch.dtype = torch.float16,
    num_gpu_blocks: int = 32,
    geometry: tuple[int, int, int] = (4, 2, 8),
    seed: int = 0,
    device: str = "cpu",
) -> KVLayout:
    """A layout over random layer tensors on ``device``, seeded per layer."""
    shape = gpu_shape(order, num_gpu_blocks, geometry)
    tensors = [random_bits(shape, dtype, seed + layer).to(device) for layer in range(num_layers)]
    return KVLayout(tensors, factor, order)


def blocks(tensor: torch.Tensor, order: KVOrder, rows: Sequence[int]) -> torch.Tensor:
    """The bytes of the given block rows, in order, on the CPU, for exact comparison."""
    index = torch.tensor(rows, dtype=torch.long, device=tensor.device)
    picked = tensor.index_select(order.block_dim, index)
    return picked.contiguous().view(torch.uint8).cpu()


def cpu_rows(cpu_blocks: Sequence[int], factor: int) -> list[int]:
    """The spec: CPU block c holds rows c*factor .. c*factor + factor - 1."""
    return [block * factor + sub for block in cpu_blocks for sub in range(factor)]


def finish(
    backend: CPUTransferBackend | CUDATransferBackend, job_id: int, timeout: float | None = None
) -> TransferResult:
    """The job's result, taken from ``poll`` as the connector would take it."""
    backend.wait(job_id, timeout)
    results = {result.job_id: result for result in backend.poll()}
    return results[job_id]


def round_trip(
    layout: KVLayout,
    open_backend: Callable[[KVLayout, int], Backend],
    num_cpu_blocks: int,
    num_blocks: int,
    seed: int,
    timeout: float | None = None,
) -> None:
    """Store scattered GPU blocks, wipe the GPU, load into other GPU blocks; compare bytes.

    ``open_backend(layout, num_cpu_blocks)`` makes the backend; ``timeout``
    bounds each wait for a job.
    """
    factor, order = layout.block_size_factor, layout.order
    generator = torch.Generator().manual_seed(seed)
    gpu_perm = torch.randperm(layout.num_gpu_blocks, generator=generator).tolist()
    stored_from = gpu_perm[: num_blocks * factor]
    loaded_into = gpu_perm[num_blocks * factor : 2 * num_blocks * factor]
    cpu_blocks = torch.randperm(num_cpu_blocks, generator=generator)[:num_blocks].tolist()
    originals = [blocks(t, order, stored_from) for t in layout.gpu_tensors]
    with open_backend(layout, num_cpu_blocks) as backend:
        store = finish(
            backend, backend.submit(Direction.GPU_TO_CPU, stored_from, cpu_blocks), timeout
        )
        for cpu, original in zip(backend.cpu_tensors, originals, strict=True):
            assert torch.equal(blocks(cpu, order, cpu_rows(cpu_blocks, factor)), original)
        for tensor in layout.gpu_tensors:
            tensor.zero_()  # with CUDA, unsynchronised on the compute stream: the load follows it
        load = finish(
            backend, backend.submit(Direction.CPU_TO_GPU, cpu_blocks, loaded_into), timeout
        )
    untouched = sorted(set(range(layout.num_gpu_blocks)) - set(loaded_into))
    for tensor, original in zip(layout.gpu_tensors, originals, strict=True):
        assert torch.equal(blocks(tensor, order, loaded_into), original)
        assert not blocks(tensor, order, untouched).any()
    for result, direction in ((store, Direction.GPU_TO_CPU), (load, Direction.CPU_TO_GPU)):
        assert result.success and result.error is None
        assert result.direction is direction
        assert result.num_blocks == num_blocks
        assert result.bytes == num_blocks * layout.bytes_per_cpu_block


def offset_round_trip(
    layout: KVLayout, open_backend: Callable[[KVLayout, int], Backend], timeout: float | None = None
) -> None:
    """Jobs that start and end inside CPU blocks (``layout``: factor 4, 16 GPU blocks): the
    GPU blocks of each run fill CPU rows from the run's offset on, and no other row moves."""
    factor, order = layout.block_size_factor, layout.order
    assert (factor, layout.num_gpu_blocks) == (4, 16)
    with open_backend(layout, 4) as backend:
        before = [tensor.clone() for tensor in backend.cpu_tensors]
        # GPU blocks 3..7 into rows 2, 3 of CPU block 1 and rows 0..2 of CPU block 3
        job = backend.submit(Direction.GPU_TO_CPU, [3, 4, 5, 6, 7], [1, 3], [GpuRun(5, 2)])
        stored = finish(backend, job, timeout)
        assert stored.success and stored.bytes == 5 * layout.bytes_per_gpu_block
        rows = [1 * factor + 2, 1 * factor + 3, 3 * factor, 3 * factor + 1, 3 * factor + 2]
        untouched = sorted(set(range(4 * factor)) - set(rows))
        for gpu, cpu, old in zip(layout.gpu_tensors, backend.cpu_tensors, before, strict=True):
            assert torch.equal(blocks(cpu, order, rows), blocks(gpu, order, [3, 4, 5, 6, 7]))
            assert torch.equal(blocks(cpu, order, untouched), blocks(old, order, untouched))
        # and back, from row 3 of CPU block 1 on, into GPU blocks 12..15; then as two runs
        # (two KV cache groups): row 2 of CPU block 1 into 8, rows 0 and 1 of 3 into 9, 10
        job = backend.submit(Direction.CPU_TO_GPU, [1, 3], [12, 13, 14, 15], [GpuRun(4, 3)])
        assert finish(backend, job, timeout).success
        runs = [GpuRun(1, 2), GpuRun(2, 0)]
        job = backend.submit(Direction.CPU_TO_GPU, [1, 3], [8, 9, 10], runs)
        assert finish(backend, job, timeout).success
    for gpu in layout.gpu_tensors:
        assert torch.equal(blocks(gpu, order, [12, 13, 14, 15]), blocks(gpu, order, [4, 5, 6, 7]))
        assert torch.equal(blocks(gpu, order, [8, 9, 10]), blocks(gpu, order, [3, 5, 6]))
