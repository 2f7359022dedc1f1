"""vLLM 0.33's ``OffloadingWorker`` on kvscope's transfer backends.

vLLM names jobs by its own ids and blocks by ``GPULoadStoreSpec`` and
``CPULoadStoreSpec``; a kvscope backend takes GPU and CPU block ids and
numbers its own jobs. This maps one onto the other: CUDA streams when the
caches are on a GPU, the CPU backend otherwise, every job counted in the
backend's transfer stats like any other kvscope transfer.
"""

from __future__ import annotations

import logging
import threading

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from offload.shown import shown
from offload.transfer.backend import TransferBackend
from offload.transfer.cpu_backend import CPUTransferBackend
from offload.transfer.job import Direction, GpuRun
from offload.transfer.job import TransferResult as BackendResult
from offload.transfer.job_book import BackendClosedError
from offload.transfer.layout import KVLayout
from offload.wire.log_limit import LogLimiter

_log = LogLimiter(logging.getLogger(__name__))


def build_backend(
    kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int
) -> TransferBackend:
    """The backend for where the caches live: CUDA streams on a GPU, threads on a CPU."""
    layout = KVLayout.from_canonical(kv_caches, blocks_per_chunk)
    if layout.gpu_tensors[0].device.type == "cuda":
        from offload.transfer.cuda_backend import CUDATransferBackend

        return CUDATransferBackend(layout, num_chunks)
    return CPUTransferBackend(layout, num_chunks)


class KVScopeWorker(OffloadingWorker):
    """Moves chunks between vLLM's KV caches and kvscope's CPU tier."""

    def __init__(self, backend: TransferBackend) -> None:
        self.backend = backend
        self.rejected_jobs = 0
        """Jobs refused at submit (bad specs, an id already in flight, a full backend); vLLM
        is told with False."""
        self._vllm_ids: dict[int, int] = {}
        """The backend's job id -> vLLM's, for every job not yet reported."""
        self._in_flight: set[int] = set()
        """vLLM's ids of those jobs: each is reported once, so an id in use is refused."""
        self._lock = threading.Lock()
        """Guards both maps. A job is mapped in the same step that submits it, so a
        ``get_finished`` on another thread can never poll it unmapped and drop it: vLLM
        would wait on it forever, and its id would stay refused as in flight."""

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._submit(job_id, Direction.GPU_TO_CPU, src_spec, dst_spec)

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        return self._submit(job_id, Direction.CPU_TO_GPU, src_spec, dst_spec, expedited)

    def get_finished(self) -> list[TransferResult]:
        finished = []
        with self._lock:
            polled = [(self._vllm_ids.pop(r.job_id, None), r) for r in self.backend.poll()]
            self._in_flight.difference_update(j for j, _ in polled if j is not None)
        for job_id, result in polled:
            if job_id is None:  # submitted on the backend by someone else: not vLLM's
                continue
            if not result.success:
                self._report_failure(job_id, result)
            # vLLM adds the time to its transfer-time metric, its own handler's copy time.
            seconds = result.seconds if result.copy_seconds is None else result.copy_seconds
            finished.append(TransferResult(job_id, result.success, result.bytes, seconds))
        return finished

    def wait(self, job_ids: set[int]) -> None:
        with self._lock:
            ours = [own for own, theirs in self._vllm_ids.items() if theirs in job_ids]
        for own in ours:
            try:
                self.backend.wait(own)
            except (ValueError, RuntimeError):
                # The backend no longer holds it: a get_finished on another thread took it
                # since, so it is done. Were it still ours, something else went wrong.
                with self._lock:
                    if own in self._vllm_ids:
                        raise

    def shutdown(self) -> None:
        self.backend.close()

    def _submit(
        self,
        job_id: int,
        direction: Direction,
        src: LoadStoreSpec,
        dst: LoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        gpu, cpu = (src, dst) if direction is Direction.GPU_TO_CPU else (dst, src)
        if not isinstance(gpu, GPULoadStoreSpec) or not isinstance(cpu, CPULoadStoreSpec):
            return self._refuse(job_id, "specs are not GPU and CPU block ids")
        with self._lock:  # an id checked, submitted and mapped in one step
            return self._submit_unique(job_id, direction, gpu, cpu, expedited)

    def _submit_unique(
        self,
        job_id: int,
        direction: Direction,
        gpu: GPULoadStoreSpec,
        cpu: CPULoadStoreSpec,
        expedited: bool,
    ) -> bool:
        """``_submit`` past the spec types, with ``_lock`` held."""
        if job_id in self._in_flight:
            return self._refuse(job_id, "a job of this id is in flight")
        src_ids, dst_ids = (
            (gpu.block_ids, cpu.block_ids)
            if direction is Direction.GPU_TO_CPU
            else (cpu.block_ids, gpu.block_ids)
        )
        # Per KV cache group, vLLM names where its first GPU block lies in the request: a
        # group's blocks may start inside a chunk (a load after a GPU prefix-cache hit) and
        # end inside one. Every canonical tensor's row of a block moves, as for one group.
        factor = self.backend.layout.block_size_factor
        try:
            runs = [
                GpuRun(size, index % factor)
                for size, index in zip(gpu.group_sizes, gpu.block_indices, strict=True)
            ]
            own = self.backend.submit(
                direction, src_ids.tolist(), dst_ids.tolist(), runs, expedited=expedited
            )
        except (ValueError, TypeError, BackendClosedError) as exc:  # bad specs, full, closed
            return self._refuse(job_id, str(exc))
        self._vllm_ids[own] = job_id
        self._in_flight.add(job_id)
        return True

    def _report_failure(self, job_id: int, result: BackendResult) -> None:
        """Log why a job failed: vLLM's connector asserts each result's success with no
        message, so without this line the engine stopped and the cause was lost."""
        _log.log(
            logging.ERROR,
            "failed",
            f"kvscope {result.direction.value} job {job_id} ({result.num_blocks} chunk(s)) "
            f"failed: {shown(result.error)}",
        )

    def _refuse(self, job_id: int, why: str) -> bool:
        """Tell vLLM False (its connector then stops the engine: it asserts every job runs),
        having said why; a CUDA error is not a refusal and reaches vLLM as itself."""
        self.rejected_jobs += 1
        _log.log(logging.ERROR, "refused", f"kvscope job {job_id} refused: {shown(why)}")
        return False
