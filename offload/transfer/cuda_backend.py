"""The transfer backend over a real CUDA KV cache and a pinned host tier.

A stream and a host worker per direction, an event recorded on the caller's
stream at ``submit`` that the job's copies wait on, and index kernels that
reach the pinned tier through its device mapping (bounded pinned staging
where the tier is pageable): docs/ARCHITECTURE.md ("Transfer backend") says
why each is there. Importing this module needs no CUDA; constructing the
backend does.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from offload.transfer import host_tier
from offload.transfer.backend import TransferBackend
from offload.transfer.job import Direction, GpuRun, TransferResult
from offload.transfer.job_book import DEFAULT_MAX_JOBS, JobBook, job_result
from offload.transfer.job_queue import JobQueue
from offload.transfer.layout import KVLayout, TransferPlan

logger = logging.getLogger(__name__)

JobHook = Callable[[int], None]

STAGE_BYTES = 32 << 20
"""Bytes of rows (all planes together) one chunk moves, per direction and side:
large enough that a chunk's copy dwarfs its launch and event overheads."""

ROW_DTYPES = (torch.int64, torch.int32, torch.int16)
"""Element types to move rows as, widest first: the index kernels (device and host)
copy element by element, so wider elements mean fewer copies. Moving bits
between same-typed tensors never changes them."""


@dataclass(slots=True)
class _Job:
    job_id: int
    plan: TransferPlan
    submitted: float
    """``time.perf_counter`` at submit, so a result's seconds include queueing."""
    ready: torch.cuda.Event
    """Recorded on the caller's stream at submit: the job's copies wait on it."""


@dataclass(slots=True)
class _Lane:
    """One direction's stream, worker thread, job queue and staging buffers."""

    direction: Direction
    stream: torch.cuda.Stream
    device_stage: torch.Tensor
    host_stages: tuple[torch.Tensor, ...]
    """Where the tier is pageable, two pinned buffers used in turn, so the host
    fills or drains one while the DMA engine reads or writes the other; none
    where kernels reach the tier directly."""
    jobs: JobQueue[_Job | None] = field(default_factory=JobQueue)
    """Submission order, expedited loads ahead of the rest."""
    worker: threading.Thread | None = None


class CUDATransferBackend(TransferBackend):
    """Copies KV blocks between a CUDA KV cache and a pinned CPU tier on two streams.

    Every job is one gather and one scatter per plane (layer, and K or V
    where they are apart) and per chunk of rows, never a Python step per
    block. ``submit`` validates (``KVLayout.plan``), records the ordering
    event on the current stream and returns; the copy runs on the
    direction's stream, driven by that direction's worker thread.
    ``zero_copy`` says whether the kernels read and write the pinned tier
    in place (the normal case) or go through host staging (a pageable tier).
    """

    def __init__(
        self,
        layout: KVLayout,
        num_cpu_blocks: int,
        *,
        allow_pageable: bool = False,
        on_job_start: JobHook | None = None,
        max_jobs: int = DEFAULT_MAX_JOBS,
    ) -> None:
        """Allocate the pinned CPU tier, the streams and staging, and start the workers.

        ``allow_pageable`` lets the tier fall back to pageable host memory
        when pinning it fails (``pageable_fallback`` then says so); without
        it such a failure raises. ``on_job_start`` runs on a worker thread
        with each job's id just before the job copies, as in
        ``CPUTransferBackend``: an exception it raises fails that job only.
        ``max_jobs``: jobs held at once, in flight or not yet polled (``JobBook``).
        """
        if not torch.cuda.is_available():
            raise RuntimeError(
                "CUDATransferBackend needs a CUDA device, and torch sees none "
                "(torch.cuda.is_available() is False); use CPUTransferBackend without a GPU"
            )
        device = layout.gpu_tensors[0].device
        if device.type != "cuda":
            raise ValueError(
                f"CUDATransferBackend needs CUDA tensors as its GPU side, got {device}"
            )
        self.layout = layout
        self.device = device
        self.num_cpu_blocks = num_cpu_blocks
        with torch.cuda.device(device):  # pinned in the context the tier is mapped into
            tier, pageable = host_tier.allocate(layout, num_cpu_blocks, allow_pageable)
        self.pageable_fallback = pageable
        self.cpu_tensors = list(tier.unbind(0))  # one per layer, views of the one allocation
        # Both sides share the element type: rows move between them (or their stages) as is.
        self._gpu_rows, self._cpu_rows = layout.wide_rows(self.cpu_tensors, ROW_DTYPES)
        self._tier_on_device = (
            None
            if self.pageable_fallback
            else host_tier.device_view(host_tier.planes(tier, self._cpu_rows), device)
        )
        if not self.zero_copy and not self.pageable_fallback:
            logger.warning(
                "the pinned CPU tier is not mapped into %s's address space; "
                "transfers go through host staging",
                device,
            )
        self._on_job_start = on_job_start
        self._book = JobBook(max_jobs)
        self.stats = self._book.stats
        self._queued: dict[int, torch.cuda.Event] = {}
        """Completion events of jobs whose device work is all queued but not yet finished;
        guarded by the book's lock (``self._book.changed``)."""
        self._lanes = {d: self._make_lane(d) for d in Direction}
        for lane in self._lanes.values():
            lane.worker = threading.Thread(
                target=self._run, args=(lane,), name=f"kvscope-cuda-{lane.direction}", daemon=True
            )
            lane.worker.start()
        atexit.register(self.close)  # as CPUTransferBackend does, and why

    @property
    def zero_copy(self) -> bool:
        """Whether the kernels read and write the pinned tier in place (its device view)."""
        return self._tier_on_device is not None

    # -- the TransferBackend interface ---------------------------------------------------

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
        # Recorded on the caller's thread, whose current stream is the compute stream the
        # job must follow; the worker's stream waits on it before touching any GPU row.
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        jobs = self._lanes[plan.direction].jobs
        return self._book.open(
            plan.direction, lambda job_id: jobs.put(_Job(job_id, plan, submitted, ready), expedited)
        )

    def poll(self) -> list[TransferResult]:
        """Jobs finished since the last poll; each is complete on the device. Never blocks."""
        return self._book.poll()

    def close(self) -> None:
        self._book.close(self._stop_lanes)
        for lane in self._lanes.values():
            if lane.worker is not None:
                lane.worker.join()
        atexit.unregister(self.close)
        for lane in self._lanes.values():
            try:
                lane.stream.synchronize()  # a failed job may have left work queued
            except RuntimeError as exc:  # a broken CUDA context: nothing left to release
                logger.warning("transfer stream %s failed to synchronise: %s", lane.direction, exc)

    def _stop_lanes(self) -> None:
        for lane in self._lanes.values():
            lane.jobs.put(None)  # after every queued job: they all run first

    # -- waiting -------------------------------------------------------------------------

    def wait(self, job_id: int, timeout: float | None = None) -> TransferResult:
        """Block the host until a job finishes and return its result; ``poll`` still reports it."""
        return self._book.wait(job_id, timeout)

    def stream_wait(self, job_id: int, timeout: float | None = None) -> None:
        """Make the current stream wait for a job's copies, without waiting for them here.

        Work queued on the current stream afterwards (a forward pass reading
        loaded blocks) runs only once the job's copies are done. The host
        waits only until the job's device work is all queued: a load's host
        gather runs on its worker before its last DMA can be queued, so for
        a job of many chunks that is most of the copy. A job already
        finished (polled or not) needs no wait, so this returns at once.
        Whether the job succeeded, ``poll`` says.
        """
        book = self._book
        with book.changed:
            if not book.was_submitted(job_id):
                raise ValueError(f"job {job_id} was never submitted")
            if not book.changed.wait_for(
                lambda: job_id in self._queued or not book.in_flight(job_id), timeout
            ):
                raise TimeoutError(f"job {job_id} was not queued on the device within {timeout} s")
            done = self._queued.get(job_id)
        if done is not None:
            # The event was recorded before it was published, so this waits on the job's
            # own copies (waiting on a never-recorded event would wait on nothing).
            torch.cuda.current_stream(self.device).wait_event(done)

    # -- construction --------------------------------------------------------------------

    def _make_lane(self, direction: Direction) -> _Lane:
        rows = self._gpu_rows[0]
        planes, row_elements = len(self._gpu_rows), rows.shape[1]
        rows_per_chunk = max(1, STAGE_BYTES // (planes * row_elements * rows.itemsize))
        numel = rows_per_chunk * planes * row_elements
        host_stages = (
            ()
            if self.zero_copy
            else (self._host_stage(numel, rows.dtype), self._host_stage(numel, rows.dtype))
        )
        stream = torch.cuda.Stream(self.device)
        # Allocated on the lane's stream, the only one that ever uses it, so the caching
        # allocator ties the block to that stream.
        with torch.cuda.stream(stream):
            device_stage = torch.empty(numel, dtype=rows.dtype, device=self.device)
        return _Lane(direction, stream, device_stage, host_stages)

    def _host_stage(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        try:
            return torch.empty(numel, dtype=dtype, pin_memory=True)
        except RuntimeError:
            if not self.pageable_fallback:
                raise
            return torch.empty(numel, dtype=dtype)  # correct, only slower

    # -- the workers ---------------------------------------------------------------------

    def _run(self, lane: _Lane) -> None:
        with torch.cuda.device(self.device):
            while (job := lane.jobs.get()) is not None:
                self._book.finish(self._execute(lane, job), self._forget_queued)

    def _forget_queued(self, job_id: int) -> None:
        self._queued.pop(job_id, None)  # under the book's lock, as the job leaves flight

    def _execute(self, lane: _Lane, job: _Job) -> TransferResult:
        """Run one job to completion; any exception fails it alone and the worker lives on."""
        started = time.perf_counter()
        try:
            if self._on_job_start is not None:
                self._on_job_start(job.job_id)
            with torch.cuda.stream(lane.stream):
                # Nothing of this job touches a GPU row before the caller's earlier work.
                lane.stream.wait_event(job.ready)
                # Timed from here, as vLLM's own handler times a copy: once the stream may
                # start it, not while it waits for the caller's work or another job.
                begun = torch.cuda.Event(enable_timing=True)
                begun.record(lane.stream)
                if self._tier_on_device is not None:
                    self._copy_in_place(lane, job, self._tier_on_device)
                elif job.plan.direction is Direction.GPU_TO_CPU:
                    self._store(lane, job)
                else:
                    self._load(lane, job)
        except Exception as exc:
            # Drain what the failed job queued, so the next job reuses staging safely; if
            # that fails too, the job's own error is the one to report.
            with contextlib.suppress(Exception):
                lane.stream.synchronize()
            error = f"{type(exc).__name__}: {exc}"
            copied = time.perf_counter() - started
            return job_result(
                job.job_id, job.plan, job.submitted, copied, success=False, error=error
            )
        copied = self._device_seconds(job.job_id, begun)
        if copied is None:
            copied = time.perf_counter() - started
        return job_result(job.job_id, job.plan, job.submitted, copied, success=True, error=None)

    def _device_seconds(self, job_id: int, begun: torch.cuda.Event) -> float | None:
        """The stream's time from ``begun`` to the job's last copy, once both are done."""
        with self._book.changed:
            last = self._queued.get(job_id)
        if last is None:
            return None
        try:
            return begun.elapsed_time(last) / 1000
        except RuntimeError:  # an event the driver could not time: the host's clock instead
            return None

    def _copy_in_place(self, lane: _Lane, job: _Job, tier: torch.Tensor) -> None:
        """Source rows -> device stage (gather) -> destination rows (scatter), on the device.

        The tier's device view lets both kernels run on the lane's stream
        whichever side the tier is on: the host never touches a row, and
        nothing waits until the job's last kernel is queued.
        """
        plan = job.plan
        to_cpu = plan.direction is Direction.GPU_TO_CPU
        src_idx = plan.src_rows.to(self.device, non_blocking=True)  # queued on lane.stream
        dst_idx = plan.dst_rows.to(self.device, non_blocking=True)
        for start, count in _chunks(plan, lane, self._gpu_rows):
            # Free to overwrite: its earlier readers are queued before this on the same stream.
            stage = _stage_view(lane.device_stage, self._gpu_rows, count)
            chunk = slice(start, start + count)
            _move_rows(to_cpu, self._gpu_rows, tier, stage, src_idx[chunk], dst_idx[chunk])
        done = torch.cuda.Event(blocking=True, enable_timing=True)
        done.record(lane.stream)
        self._publish_if_last(job, done, plan.src_rows.numel())
        # Once it fires, a store's rows are visible to the host and a load's to every stream.
        done.synchronize()

    def _store(self, lane: _Lane, job: _Job) -> None:
        """GPU rows -> device stage (gather) -> pinned stage (DMA) -> CPU tier (host scatter).

        Chunk i+1's gather and DMA are queued before the host scatters chunk
        i, so the DMA engine fills one pinned stage while the host drains the
        other.
        """
        plan = job.plan
        gpu_idx = plan.src_rows.to(self.device, non_blocking=True)  # queued on lane.stream
        cpu_idx = plan.dst_rows
        undrained: tuple[torch.cuda.Event, torch.Tensor, torch.Tensor] | None = None
        for number, (start, count) in enumerate(_chunks(plan, lane, self._gpu_rows)):
            # Its device stage is free: its last reader, the previous chunk's DMA, was
            # queued on this same stream. Its pinned stage is free: the chunk that last
            # used it (two back) was scattered on the host before this DMA is queued.
            device_stage = _stage_view(lane.device_stage, self._gpu_rows, count)
            host_stage = _stage_view(lane.host_stages[number % 2], self._gpu_rows, count)
            for plane, source in enumerate(self._gpu_rows):
                torch.index_select(
                    source, 0, gpu_idx[start : start + count], out=device_stage[plane]
                )
            host_stage.copy_(device_stage, non_blocking=True)
            copied = torch.cuda.Event(blocking=True, enable_timing=True)
            copied.record(lane.stream)
            self._publish_if_last(job, copied, start + count)
            if undrained is not None:
                self._drain(*undrained)
            undrained = (copied, host_stage, cpu_idx[start : start + count])
        if undrained is not None:
            self._drain(*undrained)

    def _drain(
        self, copied: torch.cuda.Event, host_stage: torch.Tensor, rows: torch.Tensor
    ) -> None:
        """Scatter a store chunk from its pinned stage into the tier, once its DMA is done."""
        # Returns once the device's writes into the pinned stage are visible to the host.
        copied.synchronize()
        for plane, target in enumerate(self._cpu_rows):
            target.index_copy_(0, rows, host_stage[plane])

    def _load(self, lane: _Lane, job: _Job) -> None:
        """CPU tier -> pinned stage (host gather) -> device stage (DMA) -> GPU rows (scatter).

        The host gathers chunk i+1 into one pinned stage while chunk i's DMA
        reads the other.
        """
        plan = job.plan
        gpu_idx = plan.dst_rows.to(self.device, non_blocking=True)  # queued on lane.stream
        cpu_idx = plan.src_rows
        # Per pinned stage, the event after the DMA that last read it in this job.
        read: list[torch.cuda.Event | None] = [None, None]
        done: torch.cuda.Event | None = None
        for number, (start, count) in enumerate(_chunks(plan, lane, self._gpu_rows)):
            slot = number % 2
            if (last_read := read[slot]) is not None:
                last_read.synchronize()  # the gather below overwrites what that DMA read
            device_stage = _stage_view(lane.device_stage, self._gpu_rows, count)
            host_stage = _stage_view(lane.host_stages[slot], self._gpu_rows, count)
            rows = cpu_idx[start : start + count]
            for plane, source in enumerate(self._cpu_rows):
                torch.index_select(source, 0, rows, out=host_stage[plane])
            # Queued after the previous chunk's scatter on this stream, so the device
            # stage it overwrites has been read.
            device_stage.copy_(host_stage, non_blocking=True)
            read[slot] = torch.cuda.Event(blocking=True)
            read[slot].record(lane.stream)
            for plane, target in enumerate(self._gpu_rows):
                target.index_copy_(0, gpu_idx[start : start + count], device_stage[plane])
            done = torch.cuda.Event(blocking=True, enable_timing=True)
            done.record(lane.stream)
            self._publish_if_last(job, done, start + count)
        if done is not None:
            # After the last scatter, and so after every copy of the job (one stream):
            # once it fires the loaded rows are in the GPU cache and both stages are free.
            done.synchronize()

    def _publish_if_last(self, job: _Job, event: torch.cuda.Event, end: int) -> None:
        """Once the job's last chunk is queued, let ``stream_wait`` wait on its final event."""
        if end >= job.plan.src_rows.numel():
            with self._book.changed:
                self._queued[job.job_id] = event
                self._book.changed.notify_all()


def _move_rows(
    to_cpu: bool,
    gpu_rows: list[torch.Tensor],
    tier: torch.Tensor,
    stage: torch.Tensor,
    src_rows: torch.Tensor,
    dst_rows: torch.Tensor,
) -> None:
    """Move one chunk of rows through ``stage`` (planes, rows, row), on the tensors' device.

    The tier's side is one kernel for every plane at once, since its planes
    lie evenly strided in one allocation (``host_tier.planes``); over the bus,
    where kernel boundaries cost the most, that is the only kernel. The
    GPU's layers are separate tensors, one kernel each, in device memory.
    """
    if to_cpu:
        for plane, source in enumerate(gpu_rows):
            torch.index_select(source, 0, src_rows, out=stage[plane])
        tier.index_copy_(1, dst_rows, stage)
    else:
        torch.index_select(tier, 1, src_rows, out=stage)
        for plane, target in enumerate(gpu_rows):
            target.index_copy_(0, dst_rows, stage[plane])


def _chunks(plan: TransferPlan, lane: _Lane, planes: list[torch.Tensor]) -> list[tuple[int, int]]:
    """(first row, row count) of each chunk of a job: as many rows as the stage holds."""
    per_chunk = lane.device_stage.numel() // (len(planes) * planes[0].shape[1])
    total = plan.src_rows.numel()
    return [(start, min(per_chunk, total - start)) for start in range(0, total, per_chunk)]


def _stage_view(stage: torch.Tensor, planes: list[torch.Tensor], count: int) -> torch.Tensor:
    """The first ``count`` rows of every plane, as one contiguous (planes, count, row) view."""
    row_elements = planes[0].shape[1]
    return stage[: len(planes) * count * row_elements].view(len(planes), count, row_elements)
