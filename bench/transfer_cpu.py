"""CPU transfer backend throughput, beside a flat-copy bound taken in the same run.

Run from the repository root: .venv/bin/python -m bench.transfer_cpu [--quick]
One JSON line per (direction, offloaded block size, blocks per job):
backend_gbps is a job's bytes over its submit-to-finish time as the caller
sees it (queueing and the thread hand-off included), in GB/s (1e9 bytes/s);
bound_gbps is one ``tensor.copy_`` of a flat buffer of the same bytes, the
best any scattered copy could do on this machine; ratio is backend / bound.
Each figure is the best of several runs, so a noisy neighbour hurts neither
side. Block ids are shuffled, as a real cache's are.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator
from functools import partial

import torch

from bench.tooling.common import emit
from offload.transfer import CPUTransferBackend, Direction, KVLayout

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
BLOCK_BYTES = (64 * KIB, 256 * KIB, MIB, 4 * MIB)
BATCHES = (1, 16, 128, 1024)
QUICK_BLOCK_BYTES, QUICK_BATCHES = (64 * KIB, MIB), (1, 16)
MAX_JOB_BYTES = 3 * GIB // 2
"""Bigger jobs are skipped: the run holds four times a job's bytes (the GPU and
the CPU side, the bound's source and target) at once, and must fit in RAM."""
REPEAT_BYTES = 512 * MIB
"""Runs per figure aim at this many bytes moved, between MIN and MAX_REPEAT runs,
so small jobs get many samples and the whole default sweep stays under a minute."""
MIN_REPEAT, MAX_REPEAT, QUICK_REPEAT = 3, 100, 10
BOUND = "bound"

NUM_LAYERS = 2
GPU_GEOMETRY = (16, 8, 64)
"""Tokens per GPU block, KV heads, head dim: with float16 K and V over two
layers, a GPU block is 64 KiB, so block_size_factor = block bytes / 64 KiB."""
DTYPE = torch.float16
GPU_BLOCK_BYTES = NUM_LAYERS * 2 * math.prod(GPU_GEOMETRY) * DTYPE.itemsize  # 2: K and V


def seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def best_seconds(block_bytes: int, blocks: int, repeat: int) -> dict[str, float]:
    """Best time of the flat-copy bound and of a ``blocks``-block job each way.

    Runs are interleaved (bound, store, load, bound, ...) so that all three
    figures are taken over the same stretch of a possibly shared machine.
    """
    num_bytes = block_bytes * blocks
    source = torch.ones(num_bytes, dtype=torch.uint8)
    target = torch.zeros(num_bytes, dtype=torch.uint8)
    factor = block_bytes // GPU_BLOCK_BYTES
    num_gpu_blocks = blocks * factor
    gpu = [torch.ones(2, num_gpu_blocks, *GPU_GEOMETRY, dtype=DTYPE) for _ in range(NUM_LAYERS)]
    generator = torch.Generator().manual_seed(0)
    gpu_ids = torch.randperm(num_gpu_blocks, generator=generator).tolist()
    cpu_ids = torch.randperm(blocks, generator=generator).tolist()
    with CPUTransferBackend(KVLayout(gpu, factor), blocks) as backend:

        def job(direction: Direction, src: list[int], dst: list[int]) -> None:
            result = backend.wait(backend.submit(direction, src, dst))
            backend.poll()  # drained, so results do not pile up
            if not result.success:
                raise RuntimeError(f"{direction} job failed: {result.error}")

        runs = {
            BOUND: partial(target.copy_, source),
            Direction.GPU_TO_CPU: partial(job, Direction.GPU_TO_CPU, gpu_ids, cpu_ids),
            Direction.CPU_TO_GPU: partial(job, Direction.CPU_TO_GPU, cpu_ids, gpu_ids),
        }
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(repeat):
            for name, run in runs.items():
                best[name] = min(best[name], seconds(run))
    return best


def sweep(quick: bool) -> Iterator[tuple[int, int]]:
    """(block bytes, blocks per job) pairs, small first, too-big jobs left out."""
    sizes, batches = (QUICK_BLOCK_BYTES, QUICK_BATCHES) if quick else (BLOCK_BYTES, BATCHES)
    for block_bytes in sizes:
        for blocks in batches:
            if block_bytes * blocks <= MAX_JOB_BYTES:
                yield block_bytes, blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny sweep, few runs each")
    args = parser.parse_args()
    for block_bytes, blocks in sweep(args.quick):
        num_bytes = block_bytes * blocks
        repeat = QUICK_REPEAT if args.quick else REPEAT_BYTES // num_bytes
        best = best_seconds(block_bytes, blocks, min(max(repeat, MIN_REPEAT), MAX_REPEAT))
        bound_gbps = num_bytes / best[BOUND] / 1e9
        for direction in Direction:
            backend_gbps = num_bytes / best[direction] / 1e9
            emit(
                {
                    "bench": "transfer_cpu",
                    "direction": str(direction),
                    "block_bytes": block_bytes,
                    "blocks": blocks,
                    "backend_gbps": round(backend_gbps, 3),
                    "bound_gbps": round(bound_gbps, 3),
                    "ratio": round(backend_gbps / bound_gbps, 3),
                }
            )


if __name__ == "__main__":
    main()
