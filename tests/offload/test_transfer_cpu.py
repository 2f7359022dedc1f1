"""The CPU transfer backend: byte-exact round trips, asynchrony, and refusals.

Nothing here is timed. Asynchrony is shown with a gate the worker blocks on
(the backend's own ``on_job_start`` hook), so every assertion holds however
slow or fast the machine is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from offload.transfer import (
    CPUTransferBackend,
    Direction,
    GpuRun,
    KVLayout,
    KVOrder,
    TransferResult,
)
from offload.transfer import cpu_backend as cpu_backend_module
from offload.transfer.job_book import DEFAULT_MAX_JOBS, BackendFullError
from offload.transfer.transfer_stats import TransferStats
from tests.support import kv_caches
from tests.support.kv_caches import blocks, finish, make_layout, random_bits

GPU_TO_CPU, CPU_TO_GPU = Direction.GPU_TO_CPU, Direction.CPU_TO_GPU


@contextmanager
def gated(
    layout: KVLayout,
    num_cpu_blocks: int,
    held: Callable[[int], bool] = lambda _: True,
    max_jobs: int = DEFAULT_MAX_JOBS,
) -> Iterator[tuple[CPUTransferBackend, threading.Event, threading.Event]]:
    """A backend whose worker, on starting a held job, reports it and waits for the gate.

    The gate always opens on the way out, so a failing assertion fails the
    test instead of leaving ``close`` waiting for a worker that never moves.
    """
    started, gate = threading.Event(), threading.Event()

    def hold(job_id: int) -> None:
        if held(job_id):
            started.set()
            gate.wait()

    backend = CPUTransferBackend(layout, num_cpu_blocks, on_job_start=hold, max_jobs=max_jobs)
    try:
        yield backend, started, gate
    finally:
        gate.set()
        backend.close()


def round_trip(layout: KVLayout, num_cpu_blocks: int, num_blocks: int, seed: int) -> None:
    kv_caches.round_trip(layout, CPUTransferBackend, num_cpu_blocks, num_blocks, seed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("factor", [1, 2, 4])
@pytest.mark.parametrize("order", list(KVOrder))
@pytest.mark.parametrize("num_layers", [1, 3])
def test_round_trip_is_byte_exact(
    num_layers: int, order: KVOrder, factor: int, dtype: torch.dtype
) -> None:
    layout = make_layout(num_layers, order, factor, dtype, num_gpu_blocks=8 * factor + 3)
    round_trip(layout, num_cpu_blocks=6, num_blocks=3, seed=factor + num_layers)


@pytest.mark.parametrize(
    ("dtype", "geometry"),
    [
        (torch.float16, (1, 1, 3)),  # 6-byte rows: moved as int16
        (torch.uint8, (1, 1, 5)),  # 5-byte rows: moved byte by byte
        (torch.float32, (3, 1, 2)),  # 24-byte rows: moved as int64
    ],
)
def test_round_trip_rows_of_any_width(dtype: torch.dtype, geometry: tuple[int, int, int]) -> None:
    for order in KVOrder:
        round_trip(make_layout(2, order, 2, dtype, 20, geometry), 5, 4, seed=7)


def test_round_trip_in_many_staging_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job larger than the staging buffer is moved in steps, the last one partial."""
    layout = make_layout(2, KVOrder.KV_FIRST, 4, torch.float16, num_gpu_blocks=64)
    row_bytes = 4 * 2 * 8 * 2  # block_size * heads * head_dim * itemsize, K or V
    monkeypatch.setattr(cpu_backend_module, "STAGE_BYTES", 3 * row_bytes)
    round_trip(layout, num_cpu_blocks=10, num_blocks=7, seed=3)


def test_round_trip_kv_first_view_of_blocks_first_memory() -> None:
    """vLLM may hand out K/V-first views of blocks-first allocations; rows stay contiguous."""
    memory = [random_bits((24, 2, 4, 2, 8), torch.bfloat16, seed) for seed in range(2)]
    layout = KVLayout([m.transpose(0, 1) for m in memory], 2, KVOrder.KV_FIRST)
    round_trip(layout, num_cpu_blocks=4, num_blocks=4, seed=11)


def distinct_ids(count: int, limit: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, limit - 1), min_size=count, max_size=count, unique=True)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_valid_job_matches_a_block_by_block_reference(data: st.DataObject) -> None:
    order = data.draw(st.sampled_from(list(KVOrder)))
    factor = data.draw(st.integers(1, 3))
    num_cpu_blocks = data.draw(st.integers(1, 6))
    layout = make_layout(2, order, factor, torch.float16, num_gpu_blocks=12, geometry=(2, 1, 4))
    num_blocks = data.draw(st.integers(1, min(num_cpu_blocks, 12 // factor)))
    gpu_ids = data.draw(distinct_ids(num_blocks * factor, 12))
    cpu_ids = data.draw(distinct_ids(num_blocks, num_cpu_blocks))
    direction = data.draw(st.sampled_from(list(Direction)))
    with CPUTransferBackend(layout, num_cpu_blocks) as backend:
        for seed, cpu in enumerate(backend.cpu_tensors):
            cpu.copy_(random_bits(cpu.shape, cpu.dtype, 100 + seed))
        expected_gpu = [t.clone() for t in layout.gpu_tensors]
        expected_cpu = [t.clone() for t in backend.cpu_tensors]
        src, dst = (gpu_ids, cpu_ids) if direction is GPU_TO_CPU else (cpu_ids, gpu_ids)
        assert finish(backend, backend.submit(direction, src, dst)).success
    dim = order.block_dim
    for layer in range(layout.num_layers):
        for i, cpu_block in enumerate(cpu_ids):
            for sub in range(factor):
                gpu_row = expected_gpu[layer].select(dim, gpu_ids[i * factor + sub])
                cpu_row = expected_cpu[layer].select(dim, cpu_block * factor + sub)
                if direction is GPU_TO_CPU:
                    cpu_row.copy_(gpu_row)
                else:
                    gpu_row.copy_(cpu_row)
        for actual, expected in (
            (layout.gpu_tensors[layer], expected_gpu[layer]),
            (backend.cpu_tensors[layer], expected_cpu[layer]),
        ):
            assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8))


def test_geometry_and_bytes_per_block() -> None:
    layout = make_layout(3, KVOrder.BLOCKS_FIRST, 4, torch.bfloat16, 16, geometry=(16, 2, 8))
    per_layer = 2 * 16 * 2 * 8 * 2  # K and V, tokens, heads, head_dim, bytes
    assert (layout.num_layers, layout.num_gpu_blocks, layout.block_size_factor) == (3, 16, 4)
    assert (layout.gpu_block_size, layout.num_heads, layout.head_dim) == (16, 2, 8)
    assert layout.bytes_per_gpu_block == 3 * per_layer
    assert layout.bytes_per_cpu_block == 4 * 3 * per_layer
    with CPUTransferBackend(layout, 5) as backend:
        assert [tuple(t.shape) for t in backend.cpu_tensors] == [(20, 2, 16, 2, 8)] * 3
        assert all(t.dtype == torch.bfloat16 and not t.any() for t in backend.cpu_tensors)
    kv_first = make_layout(1, KVOrder.KV_FIRST, 2, torch.float32, 16, geometry=(4, 2, 8))
    assert kv_first.cpu_shape(3) == (2, 6, 4, 2, 8)


def test_many_jobs_complete_in_submission_order() -> None:
    layout = make_layout(num_gpu_blocks=64)
    with CPUTransferBackend(layout, 64) as backend:
        ids = [backend.submit(GPU_TO_CPU, [i], [63 - i]) for i in range(64)]
        assert ids == list(range(64))
        results: list[TransferResult] = []
        while len(results) < len(ids):  # poll never blocks: spin until all have arrived
            results += backend.poll()
        assert [r.job_id for r in results] == ids
        assert all(r.success and r.num_blocks == 1 for r in results)
        assert backend.poll() == []


def test_submit_returns_while_the_worker_is_busy() -> None:
    """Jobs queue behind a running job; nothing is reported or copied until it is let go."""
    layout = make_layout(num_gpu_blocks=8)
    with gated(layout, 8, held=lambda job_id: job_id == 0) as (backend, started, gate):
        first = backend.submit(GPU_TO_CPU, [0, 1], [0, 1])
        started.wait()  # the worker is inside job 0 now, and stays there
        second = backend.submit(GPU_TO_CPU, [2], [2])
        assert backend.poll() == []
        assert not any(t.any() for t in backend.cpu_tensors)  # nothing copied yet
        with pytest.raises(TimeoutError, match=f"job {second} did not finish"):
            backend.wait(second, timeout=0)  # it cannot have: the worker is held
        gate.set()
        backend.wait(second)
        assert [r.job_id for r in backend.poll()] == [first, second]
        for gpu, cpu in zip(layout.gpu_tensors, backend.cpu_tensors, strict=True):
            stored = blocks(cpu, KVOrder.KV_FIRST, [0, 1, 2])
            assert torch.equal(stored, blocks(gpu, KVOrder.KV_FIRST, [0, 1, 2]))


def test_caller_mutating_its_ids_after_submit_changes_nothing() -> None:
    layout = make_layout(num_gpu_blocks=8)
    src, dst = torch.tensor([1, 2]), [3, 4]  # a tensor could be shared, a list is not
    with gated(layout, 8) as (backend, _, gate):
        job = backend.submit(GPU_TO_CPU, src, dst)
        src[:] = torch.tensor([5, 6])
        dst[:] = [0, 7]
        gate.set()
        assert finish(backend, job).success
        for gpu, cpu in zip(layout.gpu_tensors, backend.cpu_tensors, strict=True):
            stored = blocks(cpu, KVOrder.KV_FIRST, [3, 4])
            assert torch.equal(stored, blocks(gpu, KVOrder.KV_FIRST, [1, 2]))
            assert not blocks(cpu, KVOrder.KV_FIRST, [0, 7]).any()


def test_a_failing_job_is_reported_and_the_worker_lives_on() -> None:
    def fail_job_1(job_id: int) -> None:
        if job_id == 1:
            raise OSError("disk on fire")

    layout = make_layout(num_gpu_blocks=8)
    with CPUTransferBackend(layout, 8, on_job_start=fail_job_1) as backend:
        backend.submit(GPU_TO_CPU, [0], [0])
        backend.submit(GPU_TO_CPU, [1], [1])
        last = backend.submit(GPU_TO_CPU, [2], [2])
        backend.wait(last)
        ok, failed, after = backend.poll()
        assert ok.success and after.success
        assert not failed.success and failed.bytes == 0 and failed.num_blocks == 1
        assert failed.error == "OSError: disk on fire"
        assert not blocks(backend.cpu_tensors[0], KVOrder.KV_FIRST, [1]).any()


BAD_JOBS = [
    ("sideways", [0], [0], "unknown direction 'sideways'"),
    (GPU_TO_CPU, [0, 1, 2], [0], "src_blocks has 3 GPU blocks from row 0 but dst_blocks has 1"),
    (CPU_TO_GPU, [0], [0, 1, 2, 3], "dst_blocks has 4 GPU blocks from row 0 but src_blocks has"),
    (GPU_TO_CPU, [0, 1], [0, 1], "with block_size_factor 2 that must be 1 CPU blocks"),
    (GPU_TO_CPU, [0, -1], [0], "src_blocks has negative GPU block id -1"),
    (GPU_TO_CPU, [0, 1], [-3], "dst_blocks has negative CPU block id -3"),
    (GPU_TO_CPU, [0, 16], [0], "src_blocks has GPU block id 16, out of range"),
    (CPU_TO_GPU, [8], [0, 1], "src_blocks has CPU block id 8, out of range"),
    (GPU_TO_CPU, [0, 1, 2, 3], [5, 5], "dst_blocks names CPU block 5 more than once"),
    (CPU_TO_GPU, [1, 2], [3, 4, 3, 6], "dst_blocks names GPU block 3 more than once"),
    (GPU_TO_CPU, [0, 1.5], [0], "src_blocks must hold int block ids"),
    (GPU_TO_CPU, [0, None], [0], "src_blocks must hold int block ids, got object"),
    (GPU_TO_CPU, [[0, 1]], [0], "src_blocks must be a flat sequence"),
    (GPU_TO_CPU, [], [], "src_blocks is empty"),
    (CPU_TO_GPU, [], [0, 1], "src_blocks is empty"),
    (GPU_TO_CPU, [0, 2**70], [0], "src_blocks must hold int block ids, got object"),
]


@pytest.mark.parametrize(("direction", "src", "dst", "message"), BAD_JOBS)
def test_bad_input_raises_before_queueing_and_harms_nothing(
    direction: str, src: list, dst: list, message: str
) -> None:
    layout = make_layout(factor=2, num_gpu_blocks=16)
    with gated(layout, 8) as (backend, _, gate):
        earlier = backend.submit(GPU_TO_CPU, [4, 5, 6, 7], [2, 3])  # held in flight
        with pytest.raises(ValueError, match=message):
            backend.submit(direction, src, dst)
        gate.set()
        assert finish(backend, earlier).success
        later = backend.submit(CPU_TO_GPU, [2, 3], [8, 9, 10, 11])
        assert later == earlier + 1  # the refused job took no id
        assert finish(backend, later).success
        assert backend.poll() == []
    for tensor in layout.gpu_tensors:
        order = KVOrder.KV_FIRST
        assert torch.equal(
            blocks(tensor, order, [8, 9, 10, 11]), blocks(tensor, order, [4, 5, 6, 7])
        )


def test_a_job_may_start_and_end_inside_a_cpu_block() -> None:
    """vLLM's loads after a GPU prefix-cache hit start inside a chunk, and a prompt's last
    chunk may be partly filled (vLLM asserts that every submit succeeds, so a refusal
    stopped the engine)."""
    layout = make_layout(factor=4, num_gpu_blocks=16)
    kv_caches.offset_round_trip(layout, CPUTransferBackend)
    with CPUTransferBackend(layout, 4) as backend:
        for offset in (-1, 4, 1.5):
            with pytest.raises(ValueError, match="offset must be a row of a CPU block"):
                backend.submit(GPU_TO_CPU, [0], [0], [GpuRun(1, offset)])
        with pytest.raises(ValueError, match="that must be 2 CPU blocks"):
            backend.submit(GPU_TO_CPU, [0, 1], [0], [GpuRun(2, 3)])  # rows 3, 4: 2 CPU blocks
        with pytest.raises(ValueError, match="that must be 2 CPU blocks"):
            backend.submit(GPU_TO_CPU, [0, 1], [0], [GpuRun(1), GpuRun(1)])  # a block a run
        with pytest.raises(ValueError, match="gpu_runs hold 3 GPU blocks but src_blocks has 2"):
            backend.submit(GPU_TO_CPU, [0, 1], [0], [GpuRun(3)])
        with pytest.raises(ValueError, match="blocks must be a count"):
            backend.submit(GPU_TO_CPU, [0, 1], [0], [GpuRun(3), GpuRun(-1)])
        for runs in ([2], [(1, 0, 0)], [None], 2):
            with pytest.raises(ValueError, match="gpu_runs must be a sequence of"):
                backend.submit(GPU_TO_CPU, [0, 1], [0], runs)


def shape_error(order: KVOrder) -> str:
    return f"the {order} order needs"


BAD_LAYOUTS = [
    ([], {}, ValueError, "at least one layer tensor"),
    ([torch.zeros(2, 4, 1, 1)], {}, ValueError, shape_error(KVOrder.KV_FIRST)),
    ([torch.zeros(3, 4, 1, 1, 1)], {}, ValueError, shape_error(KVOrder.KV_FIRST)),
    (
        [torch.zeros(4, 3, 1, 1, 1)],
        {"order": "blocks_first"},
        ValueError,
        shape_error(KVOrder.BLOCKS_FIRST),
    ),
    ([torch.zeros(2, 0, 1, 1, 1)], {}, ValueError, "no dimension empty"),
    (
        [torch.zeros(2, 4, 1, 1, 1), torch.zeros(2, 5, 1, 1, 1)],
        {},
        ValueError,
        r"layer 1 has shape \(2, 5, 1, 1, 1\) but layer 0 has \(2, 4, 1, 1, 1\)",
    ),
    (
        [torch.zeros(2, 4, 1, 1, 1), torch.zeros(2, 4, 1, 1, 1, dtype=torch.float16)],
        {},
        ValueError,
        "layer 1 has dtype torch.float16 but layer 0 has torch.float32",
    ),
    ([torch.zeros(2, 4, 1, 1, 1)], {"block_size_factor": 0}, ValueError, "at least 1, got 0"),
    ([torch.zeros(2, 4, 1, 1, 1)], {"block_size_factor": 2.0}, TypeError, "must be an int"),
    ([torch.zeros(2, 4, 1, 1, 1)], {"order": "nhd"}, ValueError, "unknown KV order 'nhd'"),
    ([[0.0]], {}, TypeError, "layer 0 is a list, not a torch.Tensor"),
    (
        [torch.zeros(2, 4, 8, 2, 3).permute(0, 1, 4, 3, 2)],  # HND memory posing as NHD
        {},
        ValueError,
        "a block's bytes are not contiguous",
    ),
]


@pytest.mark.parametrize(("tensors", "kwargs", "error", "message"), BAD_LAYOUTS)
def test_bad_geometry_is_refused(
    tensors: list, kwargs: dict, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        KVLayout(tensors, **kwargs)


def test_bad_backend_construction_is_refused() -> None:
    layout = make_layout()
    with pytest.raises(ValueError, match="num_cpu_blocks must be at least 1, got 0"):
        CPUTransferBackend(layout, 0)
    meta = KVLayout([torch.empty(2, 4, 1, 1, 1, device="meta")])
    with pytest.raises(ValueError, match="needs CPU tensors as its GPU side, got meta"):
        CPUTransferBackend(meta, 4)


def test_close_finishes_in_flight_work_is_idempotent_and_refuses_new_jobs() -> None:
    layout = make_layout(num_gpu_blocks=16)
    backend = CPUTransferBackend(layout, 16)
    ids = [backend.submit(GPU_TO_CPU, [i], [i]) for i in range(16)]
    backend.close()
    backend.close()
    assert [r.job_id for r in backend.poll()] == ids  # all done, none lost
    with pytest.raises(RuntimeError, match="closed"):
        backend.submit(GPU_TO_CPU, [0], [0])
    for gpu, cpu in zip(layout.gpu_tensors, backend.cpu_tensors, strict=True):
        assert torch.equal(gpu.view(torch.uint8), cpu.view(torch.uint8))


def test_context_manager_closes() -> None:
    with CPUTransferBackend(make_layout(), 4) as backend:
        backend.submit(GPU_TO_CPU, [0], [0])
    with pytest.raises(RuntimeError, match="closed"):
        backend.submit(GPU_TO_CPU, [0], [0])
    assert len(backend.poll()) == 1


def test_wait_leaves_the_result_for_poll_and_refuses_unknown_jobs() -> None:
    with CPUTransferBackend(make_layout(), 4) as backend:
        job = backend.submit(GPU_TO_CPU, [1], [1])
        assert backend.wait(job) == backend.wait(job)
        assert [r.job_id for r in backend.poll()] == [job]
        with pytest.raises(ValueError, match=f"job {job} is neither in flight"):
            backend.wait(job)  # already polled
        with pytest.raises(ValueError, match="job 99 is neither in flight"):
            backend.wait(99)


def test_an_expedited_load_goes_ahead_of_every_queued_job_that_is_not() -> None:
    """vLLM marks a load expedited when its step waits on it: behind queued stores it
    waited for all of them."""
    layout = make_layout(num_gpu_blocks=8)
    with gated(layout, 8, held=lambda job_id: job_id == 0) as (backend, started, gate):
        backend.submit(GPU_TO_CPU, [0], [0])
        started.wait()
        stores = [backend.submit(GPU_TO_CPU, [i], [i]) for i in (1, 2, 3)]
        load = backend.submit(CPU_TO_GPU, [0], [4], expedited=True)
        gate.set()
        backend.wait(stores[-1])
        assert [r.job_id for r in backend.poll()] == [0, load, *stores]


def test_a_backend_holding_its_most_jobs_refuses_more_and_counts_them() -> None:
    layout = make_layout(num_gpu_blocks=8)
    with gated(layout, 8, max_jobs=3) as (backend, _, gate):
        jobs = [backend.submit(GPU_TO_CPU, [i], [i]) for i in range(3)]
        with pytest.raises(BackendFullError, match="3 transfer jobs are in flight or finished"):
            backend.submit(GPU_TO_CPU, [3], [3])
        assert backend.stats.directions[GPU_TO_CPU].jobs_refused == 1
        gate.set()
        backend.wait(jobs[-1])
        with pytest.raises(BackendFullError):  # finished, but nobody polled them
            backend.submit(GPU_TO_CPU, [3], [3])
        assert [r.job_id for r in backend.poll()] == jobs
        assert finish(backend, backend.submit(GPU_TO_CPU, [3], [3])).success


def test_a_job_that_cannot_be_counted_is_still_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OpenTelemetry exporter raising inside the job's span killed the worker: the job
    was never reported and ``wait`` on it never returned."""

    def broken(self: TransferStats, result: TransferResult) -> None:
        raise RuntimeError("span exporter down")

    monkeypatch.setattr(TransferStats, "on_finish", broken)
    layout = make_layout(num_gpu_blocks=8)
    with CPUTransferBackend(layout, 8) as backend:
        first = backend.submit(GPU_TO_CPU, [0], [0])
        assert backend.wait(first, timeout=60).success
        assert finish(backend, backend.submit(GPU_TO_CPU, [1], [1])).success


def test_a_result_times_the_copy_apart_from_its_queueing() -> None:
    layout = make_layout(num_gpu_blocks=8)
    with gated(layout, 8, held=lambda job_id: job_id == 0) as (backend, started, gate):
        backend.submit(GPU_TO_CPU, [0], [0])
        started.wait()
        queued = backend.submit(GPU_TO_CPU, [1], [1])
        time.sleep(0.02)  # queued all this while: a copy time counted from submit holds it
        released = time.perf_counter()
        gate.set()
        result = backend.wait(queued)
        waited = time.perf_counter() - released
    # Its worker took it up after the release, so its copy fits in what followed it.
    assert result.copy_seconds is not None and 0 < result.copy_seconds <= waited
