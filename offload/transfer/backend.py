"""The contract between the offloading connector and whatever moves the bytes.

The connector hands a backend block ids and later asks what has finished; it
never waits on a copy itself, because the worker's forward pass must keep
running while KV blocks stream to and from the CPU tier. Every backend (the
CPU one here, a CUDA-stream one later) implements this interface unchanged,
so the connector and the tests do not care which one runs.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from offload.base import Closeable
from offload.transfer.job import Direction, GpuRun, TransferResult
from offload.transfer.layout import KVLayout
from offload.transfer.transfer_stats import TransferStats


class TransferBackend(Closeable):
    """Moves KV blocks between the GPU cache and the CPU tier, asynchronously.

    Bad input raises before anything is queued, so a caller's bug never
    corrupts jobs already in flight; a failure while copying is reported as
    an unsuccessful ``TransferResult`` instead, because by then the caller
    has moved on and only ``poll`` can tell it.

    Every backend counts its jobs in ``stats`` (submitted on submit, finished
    with their outcome, bytes and duration when they end), which is how the
    transfer metrics and spans see every backend alike.
    """

    stats: TransferStats
    layout: KVLayout

    @abstractmethod
    def submit(
        self,
        direction: Direction,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        gpu_runs: Sequence[GpuRun] | None = None,
        *,
        expedited: bool = False,
    ) -> int:
        """Queue a copy and return its job id without waiting for the copy.

        An ``expedited`` job (a load the engine waits on within its step) goes
        ahead of every queued job of its worker that is not.

        ``src_blocks`` and ``dst_blocks`` are in units of the source and the
        destination medium's blocks: one CPU block holds ``block_size_factor``
        GPU blocks. The GPU side comes in ``gpu_runs`` (None: one run of
        every GPU block from row 0), each filling CPU blocks of its own in
        order from its ``offset`` in the first: a run may start inside a CPU
        block, as a load after a GPU prefix-cache hit does, and end inside
        one, so it takes ceil((blocks + offset) / block_size_factor) of them.
        """

    @abstractmethod
    def poll(self) -> list[TransferResult]:
        """Jobs finished since the last poll, in completion order; never blocks."""

    @abstractmethod
    def wait(self, job_id: int, timeout: float | None = None) -> TransferResult:
        """Block until a job finishes and return its result; ``poll`` still reports it."""

    @abstractmethod
    def close(self) -> None:
        """Finish the jobs in flight and release threads and streams; idempotent."""
