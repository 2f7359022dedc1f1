"""The CUDA transfer backend: byte-exact round trips, stream ordering, asynchrony, failures.

Every test but one needs a CUDA device (marked ``gpu``, skipped without
one). The one that runs everywhere checks that construction without CUDA
fails clearly. A per-test mark, not ``pytestmark``, because a module-level
skip would skip that test too.

Ordering is tested against a busy compute stream: ``torch.cuda._sleep``
spins the current stream for a fixed number of GPU cycles, so work queued
after it runs late, and a backend that ignored the stream would copy stale
bytes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch

from offload.transfer import Direction, KVLayout, KVOrder, TransferResult, host_tier
from offload.transfer import cuda_backend as cuda_backend_module
from offload.transfer.cuda_backend import CUDATransferBackend
from tests.support import kv_caches
from tests.support.kv_caches import blocks, random_bits

GPU_TO_CPU, CPU_TO_GPU = Direction.GPU_TO_CPU, Direction.CPU_TO_GPU
HAS_CUDA = torch.cuda.is_available()
CUDA_GEOMETRY = (16, 4, 64)
"""The per-block geometry of the layouts here: larger than the CPU tests', closer to a model's."""
BUSY_CYCLES = 2_000_000_000
"""About a second of a spinning kernel on a 1.5-2 GHz GPU: far longer than any
copy here, so a copy that did not wait for it would visibly run first."""

_F = TypeVar("_F", bound=Callable[..., object])


def gpu(test: _F) -> _F:
    """Mark a test as needing CUDA and skip it without a device."""
    skipped = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(test)
    return pytest.mark.gpu(skipped)


def make_layout(**kwargs: Any) -> KVLayout:
    """A CUDA layout of realistic geometry, unless told otherwise."""
    kwargs.setdefault("geometry", CUDA_GEOMETRY)
    kwargs.setdefault("device", "cuda")
    return kv_caches.make_layout(**kwargs)


def finish(backend: CUDATransferBackend, job_id: int) -> TransferResult:
    """The job's result from ``poll``; a minute at most, so a hung job fails the test."""
    return kv_caches.finish(backend, job_id, timeout=60)


def busy_current_stream() -> None:
    """Keep the current (compute) stream busy for about a second, without the host waiting."""
    torch.cuda._sleep(BUSY_CYCLES)


STAGED = "staged"
COPY_PATHS = ["zero_copy", STAGED]


@pytest.fixture(params=COPY_PATHS)
def copy_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test over both copy paths: index kernels on the device-mapped tier, and
    host staging, forced by refusing the mapping as a platform without one would."""
    if request.param == STAGED:
        monkeypatch.setattr(host_tier, "device_view", lambda *_: None)
    return request.param


def round_trip(
    layout: KVLayout, num_cpu_blocks: int, num_blocks: int, seed: int, copy_path: str
) -> None:
    def pinned_backend(layout: KVLayout, num_cpu_blocks: int) -> CUDATransferBackend:
        """A backend whose CPU tier is all pinned, as it must be where pinning works."""
        backend = CUDATransferBackend(layout, num_cpu_blocks)
        assert not backend.pageable_fallback
        assert all(cpu.is_pinned() for cpu in backend.cpu_tensors)
        assert backend.zero_copy is (copy_path != STAGED)
        return backend

    kv_caches.round_trip(layout, pinned_backend, num_cpu_blocks, num_blocks, seed, timeout=60)


# -- everywhere ------------------------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal without CUDA")
def test_construction_without_cuda_is_refused_clearly() -> None:
    layout = make_layout(device="cpu", num_gpu_blocks=4, geometry=(2, 1, 4))
    with pytest.raises(RuntimeError, match=r"needs a CUDA device.*is_available\(\) is False"):
        CUDATransferBackend(layout, 4)


@pytest.mark.parametrize("order", list(KVOrder))
@pytest.mark.parametrize(
    ("dtype", "geometry", "factor"),
    [(torch.float16, (4, 2, 8), 1), (torch.float16, (4, 2, 8), 2), (torch.uint8, (1, 1, 3), 2)],
)
def test_the_zero_copy_kernels_move_every_plane_exactly(
    order: KVOrder, dtype: torch.dtype, geometry: tuple[int, int, int], factor: int
) -> None:
    """The kernels the zero-copy path runs, here on CPU tensors: a store then a load through
    the tier's one (planes, rows, row) view, in chunks of a staging buffer."""
    layout = kv_caches.make_layout(
        num_layers=3, order=order, factor=factor, dtype=dtype, geometry=geometry, seed=5
    )
    num_cpu_blocks, num_blocks = 6, 4
    tier = host_tier.zeros(layout.cpu_shape(num_cpu_blocks), dtype, layout.num_layers, pin=False)
    layers = list(tier.unbind(0))
    gpu_rows, cpu_rows = layout.wide_rows(layers, cuda_backend_module.ROW_DTYPES)
    planes = host_tier.planes(tier, cpu_rows)
    assert planes.shape[0] == len(cpu_rows)
    for plane, rows in zip(planes, cpu_rows, strict=True):
        assert (plane.data_ptr(), plane.shape, plane.stride()) == (
            rows.data_ptr(),
            rows.shape,
            rows.stride(),
        )
    stage = torch.empty(len(gpu_rows) * 3 * gpu_rows[0].shape[1], dtype=gpu_rows[0].dtype)

    def move(direction: Direction, src: list[int], dst: list[int]) -> None:
        plan = layout.plan(direction, src, dst, num_cpu_blocks)
        for start in range(0, plan.src_rows.numel(), 3):  # chunks of three rows, one partial
            count = min(3, plan.src_rows.numel() - start)
            chunk = slice(start, start + count)
            cuda_backend_module._move_rows(
                direction is GPU_TO_CPU,
                gpu_rows,
                planes,
                cuda_backend_module._stage_view(stage, gpu_rows, count),
                plan.src_rows[chunk],
                plan.dst_rows[chunk],
            )

    gpu_from = [7, 1, 12, 4, 9, 0, 15, 3][: num_blocks * factor]
    gpu_into = [20, 31, 18, 25, 22, 29, 17, 26][: num_blocks * factor]
    cpu_blocks = [5, 0, 3, 2]
    order_of = layout.order
    originals = [blocks(t, order_of, gpu_from) for t in layout.gpu_tensors]
    move(GPU_TO_CPU, gpu_from, cpu_blocks)
    for layer, original in zip(layers, originals, strict=True):
        assert torch.equal(
            blocks(layer, order_of, kv_caches.cpu_rows(cpu_blocks, factor)), original
        )
    assert not blocks(layers[0], order_of, kv_caches.cpu_rows([1, 4], factor)).any()
    move(CPU_TO_GPU, cpu_blocks, gpu_into)
    for tensor, original in zip(layout.gpu_tensors, originals, strict=True):
        assert torch.equal(blocks(tensor, order_of, gpu_into), original)


# -- on a GPU --------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.uint8])
@pytest.mark.parametrize("factor", [1, 4])
@pytest.mark.parametrize("order", list(KVOrder))
def test_round_trip_is_byte_exact(
    order: KVOrder, factor: int, dtype: torch.dtype, copy_path: str
) -> None:
    layout = make_layout(num_layers=3, order=order, factor=factor, dtype=dtype, seed=factor)
    round_trip(layout, num_cpu_blocks=8, num_blocks=3, seed=1, copy_path=copy_path)


@gpu
@pytest.mark.parametrize("order", list(KVOrder))
def test_a_job_may_start_and_end_inside_a_cpu_block(order: KVOrder, copy_path: str) -> None:
    layout = make_layout(order=order, factor=4, num_gpu_blocks=16)
    kv_caches.offset_round_trip(layout, CUDATransferBackend, timeout=60)


@gpu
@pytest.mark.parametrize(
    ("dtype", "geometry"),
    [(torch.uint8, (1, 1, 3)), (torch.float16, (1, 1, 3)), (torch.float32, (3, 1, 1))],
)
def test_round_trip_rows_of_any_width(
    dtype: torch.dtype, geometry: tuple[int, int, int], copy_path: str
) -> None:
    layout = make_layout(dtype=dtype, geometry=geometry)
    round_trip(layout, num_cpu_blocks=8, num_blocks=4, seed=2, copy_path=copy_path)


@gpu
@pytest.mark.parametrize("order", list(KVOrder))
def test_round_trip_in_many_chunks(
    monkeypatch: pytest.MonkeyPatch, order: KVOrder, copy_path: str
) -> None:
    """A stage of a few rows forces many chunks, so every stage reuse is exercised."""
    monkeypatch.setattr(cuda_backend_module, "STAGE_BYTES", 1)  # one row per chunk
    layout = make_layout(order=order, factor=2)
    round_trip(layout, num_cpu_blocks=12, num_blocks=7, seed=3, copy_path=copy_path)
    # Three rows of every plane (4 planes of 8 KiB rows, or 2 of 16 KiB): a last partial chunk.
    monkeypatch.setattr(cuda_backend_module, "STAGE_BYTES", 3 * 4 * 16 * 4 * 64 * 2)
    layout = make_layout(order=order, factor=2)
    round_trip(layout, num_cpu_blocks=12, num_blocks=7, seed=4, copy_path=copy_path)


@gpu
@pytest.mark.usefixtures("copy_path")
def test_store_reads_what_the_compute_stream_wrote_before_submit() -> None:
    """Blocks written by work queued before submit (still running) are what is stored."""
    layout = make_layout(num_gpu_blocks=8)
    with CUDATransferBackend(layout, 8) as backend:
        busy_current_stream()
        for layer, tensor in enumerate(layout.gpu_tensors):
            tensor[:, 2:5].fill_(layer + 7)  # queued behind the busy kernel
        job = backend.submit(GPU_TO_CPU, [2, 3, 4], [5, 6, 7])
        assert finish(backend, job).success
        for layer, cpu in enumerate(backend.cpu_tensors):
            assert (cpu[:, 5:8] == layer + 7).all()
            assert not cpu[:, :5].any()


@gpu
@pytest.mark.usefixtures("copy_path")
def test_load_waits_for_compute_and_stream_wait_orders_readers_after_it() -> None:
    """A load lands after earlier compute work; stream_wait makes later work see it."""
    layout = make_layout(num_gpu_blocks=8)
    with CUDATransferBackend(layout, 8) as backend:
        for layer, cpu in enumerate(backend.cpu_tensors):
            cpu[:, 1].fill_(layer + 3)
        busy_current_stream()
        for tensor in layout.gpu_tensors:
            tensor.zero_()  # queued behind the busy kernel: the load must land after it
        job = backend.submit(CPU_TO_GPU, [1], [6])
        backend.stream_wait(job, timeout=60)
        seen = [tensor[:, 6].clone() for tensor in layout.gpu_tensors]  # on the compute stream
        torch.cuda.current_stream().synchronize()
        assert finish(backend, job).success
        for layer, copy in enumerate(seen):
            assert (copy == layer + 3).all()


@gpu
def test_poll_returns_while_a_job_is_still_running() -> None:
    layout = make_layout(num_gpu_blocks=8)
    with CUDATransferBackend(layout, 8) as backend:
        busy_current_stream()
        job = backend.submit(GPU_TO_CPU, [0, 1], [0, 1])
        polled = backend.poll()
        # poll did not wait for the job: the compute it waits behind is running still
        assert not torch.cuda.current_stream().query()
        assert polled == []  # the store waits behind about a second of compute
        assert finish(backend, job).success


@gpu
def test_a_jobs_copy_time_leaves_out_its_wait_for_the_callers_work() -> None:
    """vLLM adds each job's time to its offload time metric, timed on the stream as its own
    handler times it: the wait for the compute stream is not the copy's."""
    layout = make_layout(num_gpu_blocks=8)
    with CUDATransferBackend(layout, 8) as backend:
        busy_current_stream()  # about a second of compute ahead of the store
        result = finish(backend, backend.submit(GPU_TO_CPU, [0, 1], [0, 1]))
    assert result.success and result.copy_seconds is not None
    assert 0 < result.copy_seconds < result.seconds / 2


@gpu
def test_stores_run_while_a_load_is_held() -> None:
    """Each direction has its own worker and stream: a stuck load never delays a store."""
    gate, held = threading.Event(), threading.Event()

    def hold_job_0(job_id: int) -> None:
        if job_id == 0:
            held.set()
            gate.wait()

    layout = make_layout(num_gpu_blocks=8)
    backend = CUDATransferBackend(layout, 8, on_job_start=hold_job_0)
    try:
        load = backend.submit(CPU_TO_GPU, [0], [0])
        assert held.wait(30)
        store = backend.submit(GPU_TO_CPU, [5], [5])
        assert backend.wait(store, timeout=60).success
        assert [result.job_id for result in backend.poll()] == [store]
        gate.set()
        assert finish(backend, load).success
    finally:
        gate.set()
        backend.close()


@gpu
@pytest.mark.usefixtures("copy_path")
def test_concurrent_loads_and_stores_are_all_exact() -> None:
    layout = make_layout(num_layers=2, factor=2, num_gpu_blocks=64, seed=9)
    order = layout.order
    with CUDATransferBackend(layout, 32) as backend:
        # CPU blocks 16..31 hold known bytes, to be loaded while other blocks are stored.
        preset = {c: random_bits((2, 2, 16, 4, 64), torch.float16, 100 + c) for c in range(16, 32)}
        for cpu in backend.cpu_tensors:
            for c, value in preset.items():
                cpu[:, 2 * c : 2 * c + 2] = value
        expected_stores = {
            c: [blocks(t, order, [2 * c, 2 * c + 1]) for t in layout.gpu_tensors] for c in range(16)
        }
        jobs = []
        for c in range(16):
            jobs.append(backend.submit(GPU_TO_CPU, [2 * c, 2 * c + 1], [c]))
            load_into = [32 + 2 * c, 32 + 2 * c + 1]
            jobs.append(backend.submit(CPU_TO_GPU, [16 + c], load_into))
        for job in jobs:
            backend.wait(job, timeout=60)
        results = backend.poll()
    assert sorted(result.job_id for result in results) == jobs
    assert all(result.success for result in results)
    for c, originals in expected_stores.items():
        for cpu, original in zip(backend.cpu_tensors, originals, strict=True):
            assert torch.equal(blocks(cpu, order, [2 * c, 2 * c + 1]), original)
    for c in range(16):
        for tensor in layout.gpu_tensors:
            loaded = tensor[:, 32 + 2 * c : 32 + 2 * c + 2].cpu()
            assert torch.equal(loaded.view(torch.uint8), preset[16 + c].view(torch.uint8))


@gpu
def test_a_failing_job_is_reported_alone_and_counted() -> None:
    def fail_job_1(job_id: int) -> None:
        if job_id == 1:
            raise OSError("disk on fire")

    layout = make_layout(num_gpu_blocks=8)
    with CUDATransferBackend(layout, 8, on_job_start=fail_job_1) as backend:
        backend.submit(GPU_TO_CPU, [0], [0])
        backend.submit(GPU_TO_CPU, [1], [1])
        last = backend.submit(GPU_TO_CPU, [2], [2])
        backend.wait(last, timeout=60)
        ok, failed, after = sorted(backend.poll(), key=lambda result: result.job_id)
        assert ok.success and after.success
        assert not failed.success and failed.bytes == 0 and failed.num_blocks == 1
        assert failed.error == "OSError: disk on fire"
        assert not blocks(backend.cpu_tensors[0], KVOrder.KV_FIRST, [1]).any()
        backend.stream_wait(last)  # finished and polled: nothing to wait for
        backend.stream_wait(1)  # failed: returns too; poll said it failed
        with pytest.raises(ValueError, match="job 99 was never submitted"):
            backend.stream_wait(99)
        stats = backend.stats.directions[GPU_TO_CPU]
        assert (stats.jobs_submitted, stats.jobs_ok, stats.jobs_failed) == (3, 2, 1)
        assert stats.bytes_moved == 2 * layout.bytes_per_cpu_block
        assert (stats.blocks_ok, stats.blocks_failed) == (2, 1)
        load = backend.submit(CPU_TO_GPU, [0], [7])
        assert finish(backend, load).success
        loads = backend.stats.directions[CPU_TO_GPU]
        assert (loads.jobs_submitted, loads.jobs_ok, loads.bytes_moved) == (
            1,
            1,
            layout.bytes_per_cpu_block,
        )


@gpu
def test_bad_input_raises_before_queueing_and_harms_nothing() -> None:
    gate = threading.Event()
    layout = make_layout(num_gpu_blocks=8)
    backend = CUDATransferBackend(layout, 8, on_job_start=lambda _: gate.wait())
    try:
        job = backend.submit(GPU_TO_CPU, [1], [3])
        for direction, src, dst in (
            ("sideways", [0], [0]),
            (GPU_TO_CPU, [8], [0]),
            (CPU_TO_GPU, [0], [0, 1]),
            (GPU_TO_CPU, [0, 1], [2, 2]),
        ):
            with pytest.raises(ValueError):
                backend.submit(direction, src, dst)
        gate.set()
        assert finish(backend, job).success
        assert backend.stats.directions[GPU_TO_CPU].jobs_submitted == 1
    finally:
        gate.set()
        backend.close()
    assert torch.equal(
        blocks(backend.cpu_tensors[0], KVOrder.KV_FIRST, [3]),
        blocks(layout.gpu_tensors[0], KVOrder.KV_FIRST, [1]),
    )


@gpu
def test_unpinnable_tier_gives_a_clear_error() -> None:
    layout = make_layout(num_gpu_blocks=4)
    absurd = (1 << 50) // layout.bytes_per_cpu_block  # a pebibyte of host memory
    with pytest.raises(RuntimeError, match=rf"cannot pin .* of host memory for {absurd} CPU"):
        CUDATransferBackend(layout, absurd)


@gpu
def test_allow_pageable_falls_back_and_still_copies_exactly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_zeros = host_tier.zeros

    def no_pinning(*args: object, pin: bool) -> torch.Tensor:
        if pin:
            raise RuntimeError("CUDA error: out of memory")
        return real_zeros(*args, pin=False)

    monkeypatch.setattr(host_tier, "zeros", no_pinning)
    layout = make_layout(num_gpu_blocks=8)
    with pytest.raises(RuntimeError, match="pass allow_pageable=True"):
        CUDATransferBackend(layout, 4)
    with caplog.at_level(logging.WARNING, logger=host_tier.__name__):
        backend = CUDATransferBackend(layout, 4, allow_pageable=True)
    with backend:
        assert backend.pageable_fallback
        assert not backend.cpu_tensors[0].is_pinned()
        assert "falls back to pageable host memory" in caplog.text
        originals = blocks(layout.gpu_tensors[0], KVOrder.KV_FIRST, [2])
        assert finish(backend, backend.submit(GPU_TO_CPU, [2], [1])).success
        assert torch.equal(blocks(backend.cpu_tensors[0], KVOrder.KV_FIRST, [1]), originals)


@gpu
def test_cpu_tensors_are_refused() -> None:
    with pytest.raises(ValueError, match="needs CUDA tensors as its GPU side, got cpu"):
        CUDATransferBackend(make_layout(device="cpu"), 4)


@gpu
def test_close_finishes_in_flight_work_is_idempotent_and_refuses_new_jobs() -> None:
    layout = make_layout(num_gpu_blocks=8)
    backend = CUDATransferBackend(layout, 8)
    busy_current_stream()
    jobs = [backend.submit(GPU_TO_CPU, [b], [b]) for b in range(4)]
    backend.close()
    backend.close()
    assert sorted(result.job_id for result in backend.poll()) == jobs
    with pytest.raises(RuntimeError, match="closed"):
        backend.submit(GPU_TO_CPU, [0], [0])
