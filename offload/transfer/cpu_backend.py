"""The transfer backend over plain CPU tensors: runs, and is tested, without a GPU.

Its "GPU" cache is ordinary CPU tensors, so the whole path the connector
drives (validate, queue, copy off-thread, report through ``poll``) runs on
any machine. One worker thread copies jobs in submission order (expedited
loads ahead of the rest), so ``poll`` reports them in that order; torch
releases the GIL inside its copies, so the caller keeps running while a job
copies.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from offload.transfer.backend import TransferBackend
from offload.transfer.job import Direction, GpuRun, TransferResult
from offload.transfer.job_book import DEFAULT_MAX_JOBS, JobBook, job_result
from offload.transfer.job_queue import JobQueue
from offload.transfer.layout import KVLayout, TransferPlan

JobHook = Callable[[int], None]

STAGE_BYTES = 4 << 20
"""Rows gathered per step: big enough that per-op overhead vanishes, small
enough that the scatter reads them back from cache."""

WIDE_DTYPES = (torch.complex128, torch.int64, torch.int32, torch.int16)
"""Element types to move rows as, widest first: torch's CPU index kernels
copy element by element, so wider elements mean fewer copies. Moving bits
between same-typed tensors never changes them."""


@dataclass(frozen=True, slots=True)
class _Job:
    job_id: int
    plan: TransferPlan
    submitted: float
    """``time.perf_counter`` at submit, so a result's seconds include queueing."""


class CPUTransferBackend(TransferBackend):
    """Copies KV blocks between CPU-resident "GPU" tensors and the CPU tier.

    A job is a gather (``index_select``) of its source rows into a staging
    buffer and a scatter (``index_copy_``) into its destination rows, per
    plane (layer, and K or V where they are apart) and per STAGE_BYTES of
    rows, never per block: a Python step per block would cost more than
    the copy itself for small blocks.
    """

    def __init__(
        self,
        layout: KVLayout,
        num_cpu_blocks: int,
        *,
        on_job_start: JobHook | None = None,
        max_jobs: int = DEFAULT_MAX_JOBS,
    ) -> None:
        """Allocate the CPU tier and start the worker.

        ``on_job_start`` runs on the worker thread with each job's id just
        before the job copies: a seam for tracing, and the way tests hold
        the worker still without mocking the copy. An exception it raises
        fails that job only. ``max_jobs``: jobs held at once, in flight or
        not yet polled (``JobBook``).
        """
        device = layout.gpu_tensors[0].device
        if device.type != "cpu":
            raise ValueError(f"CPUTransferBackend needs CPU tensors as its GPU side, got {device}")
        self.layout = layout
        self.num_cpu_blocks = num_cpu_blocks
        self.cpu_tensors = layout.allocate_cpu_tensors(num_cpu_blocks)
        self._gpu_rows, self._cpu_rows = layout.wide_rows(self.cpu_tensors, WIDE_DTYPES)
        self._stage = _stage_for(self._gpu_rows[0])
        self._on_job_start = on_job_start
        self._jobs: JobQueue[_Job | None] = JobQueue()
        self._book = JobBook(max_jobs)
        self.stats = self._book.stats
        self._worker = threading.Thread(target=self._run, name="kvscope-transfer", daemon=True)
        self._worker.start()
        # Closed at exit if still open (no shutdown hook ran): the daemon worker, left in a
        # copy while the interpreter tore down, aborted the process now and then (SIGABRT,
        # "terminate called without an active exception"). Queued jobs finish first.
        atexit.register(self.close)

    def submit(
        self,
        direction: Direction | str,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        gpu_runs: Sequence[GpuRun] | None = None,
        *,
        expedited: bool = False,
    ) -> int:
        submitted = time.perf_counter()
        plan = self.layout.plan(direction, src_blocks, dst_blocks, self.num_cpu_blocks, gpu_runs)
        return self._book.open(
            plan.direction,
            lambda job_id: self._jobs.put(_Job(job_id, plan, submitted), expedited),
        )

    def poll(self) -> list[TransferResult]:
        return self._book.poll()

    def wait(self, job_id: int, timeout: float | None = None) -> TransferResult:
        """Block until a job finishes and return its result; ``poll`` still reports it.

        Leaving the result for ``poll`` keeps ``poll`` the one place the
        connector learns of completions, so waiting (in a benchmark, a test,
        or a shutdown path) never hides a job from it.
        """
        return self._book.wait(job_id, timeout)

    def close(self) -> None:
        # The stop mark goes after every queued job: they all run first.
        self._book.close(lambda: self._jobs.put(None))
        self._worker.join()  # every caller returns only once the work is done
        atexit.unregister(self.close)  # nor keep this backend alive until exit

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._book.finish(self._execute(job))

    def _execute(self, job: _Job) -> TransferResult:
        """Run one job; any exception becomes a failed result, so the worker lives on."""
        started = time.perf_counter()
        try:
            if self._on_job_start is not None:
                self._on_job_start(job.job_id)
            self._copy(job.plan)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            copied = time.perf_counter() - started
            return job_result(
                job.job_id, job.plan, job.submitted, copied, success=False, error=error
            )
        copied = time.perf_counter() - started
        return job_result(job.job_id, job.plan, job.submitted, copied, success=True, error=None)

    def _copy(self, plan: TransferPlan) -> None:
        gpu, cpu = self._gpu_rows, self._cpu_rows
        sources, targets = (gpu, cpu) if plan.direction is Direction.GPU_TO_CPU else (cpu, gpu)
        step = self._stage.shape[0]
        for start in range(0, plan.src_rows.numel(), step):
            src_rows = plan.src_rows[start : start + step]
            dst_rows = plan.dst_rows[start : start + step]
            staged = self._stage[: src_rows.numel()]
            for source, target in zip(sources, targets, strict=True):
                torch.index_select(source, 0, src_rows, out=staged)
                target.index_copy_(0, dst_rows, staged)


def _stage_for(rows: torch.Tensor) -> torch.Tensor:
    """The worker's staging buffer: STAGE_BYTES of rows (at least one), allocated once."""
    row_elements = rows.shape[1]
    rows_per_step = max(1, STAGE_BYTES // (row_elements * rows.itemsize))
    return torch.empty((rows_per_step, row_elements), dtype=rows.dtype)
