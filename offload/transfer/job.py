"""What a transfer job is and what became of it: the words backends and their stats share."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class Direction(enum.StrEnum):
    """Which way a job moves blocks; a string so it logs and serialises as-is."""

    GPU_TO_CPU = "gpu_to_cpu"
    """A store: GPU blocks are offloaded into CPU blocks."""
    CPU_TO_GPU = "cpu_to_gpu"
    """A load: CPU blocks are brought back into GPU blocks."""


class GpuRun(NamedTuple):
    """GPU blocks that are logically contiguous (one KV cache group's blocks of one request),
    and the row of the first CPU block the first of them fills."""

    blocks: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class TransferResult:
    """What became of one submitted job, as ``poll`` reports it."""

    job_id: int
    direction: Direction
    success: bool
    num_blocks: int
    """Offloaded (CPU) blocks in the job: the unit the CPU tier counts in."""
    bytes: int
    """Bytes actually moved: 0 when the job failed, so throughput is never overstated."""
    seconds: float
    """Wall time from submit to finish (``time.perf_counter``), queueing included."""
    error: str | None = None
    """Why the job failed; None on success."""
    copy_seconds: float | None = None
    """The copy alone, queueing left out: the CUDA stream's time from when the job may start
    to its last copy, or the CPU worker's time on it; the transfer time vLLM reports. None
    where unmeasured."""
