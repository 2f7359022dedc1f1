"""Worker-side transfer backends: move KV blocks between the GPU cache and the CPU tier.

``backend`` is the interface every backend implements, ``layout`` the cache
geometry they share, ``cpu_backend`` the implementation that needs no GPU,
``cuda_backend`` the one over a CUDA cache (importable without CUDA),
``job_book`` the job ids, in-flight jobs and unpolled results both keep;
``rank_accounting`` tells the scheduler side when a job is done on every
tensor-parallel rank.
"""

from offload.transfer.backend import TransferBackend
from offload.transfer.cpu_backend import CPUTransferBackend
from offload.transfer.cuda_backend import CUDATransferBackend
from offload.transfer.job import Direction, GpuRun, TransferResult
from offload.transfer.layout import KVLayout, KVOrder, TransferPlan
from offload.transfer.rank_accounting import JobOutcome, RankAccounting

__all__ = [
    "CPUTransferBackend",
    "CUDATransferBackend",
    "Direction",
    "GpuRun",
    "JobOutcome",
    "KVLayout",
    "KVOrder",
    "RankAccounting",
    "TransferBackend",
    "TransferPlan",
    "TransferResult",
]
