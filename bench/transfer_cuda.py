"""CUDA transfer backend throughput, beside a pinned-copy bound and vLLM's Triton swap kernel.

Run from the repository root on a machine with a CUDA device:
    .venv/bin/python -m bench.transfer_cuda [--repeat N] [--budget-gib G] [--no-peer]
                                            [--sizes KIB ...] [--batches N ...] [--layers L]
                                            [--canonical]
Without CUDA it exits with status 2 and one line on stderr.

One JSON line per (direction, offloaded block size, blocks per job), bench
"transfer_cuda": backend_gbps is a job of that many shuffled (non-contiguous)
blocks through ``CUDATransferBackend``, submit to ``wait``, with the device
synchronised before and after, in GB/s (1e9 bytes/s); bound_gbps is one
``copy_`` of a contiguous buffer of the same bytes between pinned host memory
and the device (non_blocking, on a side stream), the best any scattered copy
could do on this machine; ratio is backend / bound, target_ratio the goal
(0.90 for blocks of 1 MiB or more, 0.70 for 64 KiB, none set in between).
peer_gbps is vLLM 0.33.0's Triton swap kernel moving the same rows between
the same tensors (``vllm/v1/kv_offload/cpu/swap_blocks_triton.py``, loaded
from the vLLM wheel at run time, never copied here), vs_peer backend / peer.
Every figure is the median of --repeat runs, interleaved (bound, backend,
peer, ...) so all are taken over the same stretch of a possibly shared
machine; each side's first run is a warm-up that also checks the copied bytes.
Each line names the GPU cache it ran on (layers, and layout: kv_first, or
canonical for vLLM 0.33's one page tensor) and whether the backend ran
zero_copy.

One more line, bench "transfer_cuda_latency": the load of one request's worth
of blocks (32 blocks of 1 MiB), submit until ``poll`` reports it, median. The
caller sleeps between polls, as an engine between steps does: a caller
spinning in Python would hold the GIL that the backend's worker needs.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from bench.tooling.common import count, emit
from bench.tooling.peer_env import VLLM_VERSION
from bench.tooling.vllm_wheel import load_member, stand_in
from offload.transfer import CUDATransferBackend, Direction, KVLayout, KVOrder, TransferPlan

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
BLOCK_BYTES = (64 * KIB, 256 * KIB, MIB, 4 * MIB)
BATCHES = (1, 8, 32, 128, 1024)
DEFAULT_REPEAT = 20
DEFAULT_BUDGET_GIB = 10.0
"""Each side (GPU memory, pinned host memory) holds twice a job's bytes at once
(the cache or tier, and the bound's buffer); configurations over the budget are skipped."""
LATENCY_BLOCK_BYTES, LATENCY_BLOCKS = MIB, 32
POLL_INTERVAL_S = 50e-6
BOUND, BACKEND, PEER = "bound", "backend", "peer"

DEFAULT_LAYERS = 2
GPU_GEOMETRY = (16, 8, 64)
"""Tokens per GPU block, KV heads, head dim: with float16 K and V, a 16 KiB page
per layer and K or V. Over the default two layers a GPU block is 64 KiB, so
block_size_factor = block bytes / 64 KiB, as in bench.transfer_cpu; a model's
dozens of layers (``--layers``) mean as many more pages, and kernel launches, per block."""
DTYPE = torch.float16
LAYER_BLOCK_BYTES = 2 * math.prod(GPU_GEOMETRY) * DTYPE.itemsize  # 2: K and V


@dataclass(frozen=True)
class CacheShape:
    """The GPU cache a run copies from and to: per-layer tensors, K and V apart, or the one
    int8 tensor of whole pages that vLLM 0.33 hands its offloading worker (``--canonical``)."""

    layers: int
    canonical: bool

    @property
    def gpu_block_bytes(self) -> int:
        return self.layers * LAYER_BLOCK_BYTES

    def layout(self, num_gpu_blocks: int, factor: int) -> KVLayout:
        """A cache of random bytes, on the device."""

        def random_bytes(numel: int) -> torch.Tensor:
            return torch.randint(0, 256, (numel,), dtype=torch.uint8).cuda()

        if self.canonical:
            page = random_bytes(num_gpu_blocks * self.gpu_block_bytes).view(torch.int8)
            return KVLayout([page.view(num_gpu_blocks, -1)], factor, KVOrder.BLOCK_BYTES)
        tensors = [
            random_bytes(num_gpu_blocks * LAYER_BLOCK_BYTES)
            .view(DTYPE)
            .view(2, num_gpu_blocks, *GPU_GEOMETRY)
            for _ in range(self.layers)
        ]
        return KVLayout(tensors, factor)

    def fields(self) -> dict[str, Any]:
        return {"layers": self.layers, "layout": "canonical" if self.canonical else "kv_first"}


PEER_MEMBER = "vllm/v1/kv_offload/cpu/swap_blocks_triton.py"
PEER_MAX_CHUNK = 8192
"""vLLM's gpu_worker._select_swap_blocks_fn: bytes_per_chunk = min(next_pow2(page), 8192)."""


def target_ratio(block_bytes: int) -> float | None:
    if block_bytes >= MIB:
        return 0.90
    if block_bytes <= 64 * KIB:
        return 0.70
    return None


# -- vLLM's Triton kernel, from the wheel -----------------------------------------------


def _no_cpp_swap(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("vLLM's C++ swap_blocks_batch is compiled code, not loaded here")


def load_peer() -> ModuleType:
    """vLLM 0.33.0's swap_blocks_triton module, run from the wheel's own source.

    Its two vLLM imports get stand-ins while it loads: ``vllm.triton_utils``
    is the real triton, ``vllm._custom_ops`` (the C++ path vLLM takes for
    small or large batches) a stub that raises, never reached because
    ``peer_copy`` only ever runs the Triton kernel.
    """
    import triton  # the CUDA build of torch brings it
    import triton.language as tl

    ops = stand_in("vllm._custom_ops", swap_blocks_batch=_no_cpp_swap)
    stand_ins = {
        "vllm": stand_in("vllm", _custom_ops=ops),
        "vllm._custom_ops": ops,
        "vllm.triton_utils": stand_in("vllm.triton_utils", triton=triton, tl=tl),
    }
    module = load_member(PEER_MEMBER, "vllm_0_33_swap_blocks_triton", stand_ins)
    for name in ("_swap_blocks_kernel", "swap_blocks_batch", "NUM_SMS", "MIN_N", "THRESHOLD_BYTES"):
        if not hasattr(module, name):
            raise ImportError(f"{PEER_MEMBER} of vLLM {VLLM_VERSION} has no {name}")
    return module


class PeerJob:
    """One job's copy descriptors, built as vLLM's worker builds them: a (src, dst, bytes)
    per page, the page here being one GPU block of one layer's K or V (16 KiB).

    The descriptors sit in pinned int64 tensors before the timed region, as
    vLLM's reused descriptor buffers do; their upload is part of each run.
    """

    def __init__(
        self,
        kernel: ModuleType,
        src_rows: list[torch.Tensor],
        dst_rows: list[torch.Tensor],
        plan: TransferPlan,
    ) -> None:
        row_bytes = src_rows[0].shape[1] * src_rows[0].element_size()
        src = [r.data_ptr() + plan.src_rows * row_bytes for r in src_rows]
        dst = [r.data_ptr() + plan.dst_rows * row_bytes for r in dst_rows]
        self.src = torch.cat(src).to(torch.int64).pin_memory()
        self.dst = torch.cat(dst).to(torch.int64).pin_memory()
        self.n = self.src.numel()
        self.sizes = torch.full((self.n,), row_bytes, dtype=torch.int64).pin_memory()
        self.chunk = min(1 << (row_bytes - 1).bit_length(), PEER_MAX_CHUNK)
        self.kernel = kernel
        self.stream = torch.cuda.Stream()

    def __call__(self) -> None:
        k = self.kernel
        with torch.cuda.stream(self.stream):
            if self.n >= k.MIN_N:  # vLLM's own entry point
                k.swap_blocks_batch(self.src, self.dst, self.sizes, bytes_per_chunk=self.chunk)
            else:  # its C++ fallback is not loadable: the same launch the entry point makes
                k._swap_blocks_kernel[(min(k.NUM_SMS, self.n),)](
                    self.src.to("cuda", non_blocking=True),
                    self.dst.to("cuda", non_blocking=True),
                    self.sizes.to("cuda", non_blocking=True),
                    self.n,
                    BYTES_PER_CHUNK=self.chunk,
                )


# -- measuring ----------------------------------------------------------------------------


def synced_seconds(run: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _bytes(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    return [r.view(torch.uint8) for r in rows]


def check_copy(
    what: str, plan: TransferPlan, src_rows: list[torch.Tensor], dst_rows: list[torch.Tensor]
) -> None:
    """Every destination row holds its source row's bytes; raises otherwise."""
    torch.cuda.synchronize()
    src_idx, dst_idx = plan.src_rows, plan.dst_rows
    for plane, (src, dst) in enumerate(zip(_bytes(src_rows), _bytes(dst_rows), strict=True)):
        want = src[src_idx.to(src.device)].cpu()
        got = dst[dst_idx.to(dst.device)].cpu()
        if not torch.equal(want, got):
            raise RuntimeError(f"{what} {plan.direction}: plane {plane} copied wrong bytes")


class Fixture:
    """A GPU cache of random bytes, the backend with its pinned tier, and shuffled ids."""

    def __init__(self, block_bytes: int, blocks: int, cache: CacheShape) -> None:
        factor = block_bytes // cache.gpu_block_bytes
        num_gpu_blocks = blocks * factor
        self.layout = cache.layout(num_gpu_blocks, factor)
        self.backend = CUDATransferBackend(self.layout, blocks)
        generator = torch.Generator().manual_seed(0)
        self.gpu_ids = torch.randperm(num_gpu_blocks, generator=generator).tolist()
        self.cpu_ids = torch.randperm(blocks, generator=generator).tolist()
        self.gpu_rows = self.layout.rows(self.layout.gpu_tensors)
        self.cpu_rows = self.layout.rows(self.backend.cpu_tensors)
        self.blocks = blocks

    def ids(self, direction: Direction) -> tuple[list[int], list[int]]:
        if direction is Direction.GPU_TO_CPU:
            return self.gpu_ids, self.cpu_ids
        return self.cpu_ids, self.gpu_ids

    def sides(self, direction: Direction) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if direction is Direction.GPU_TO_CPU:
            return self.gpu_rows, self.cpu_rows
        return self.cpu_rows, self.gpu_rows

    def plan(self, direction: Direction) -> TransferPlan:
        return self.layout.plan(direction, *self.ids(direction), self.blocks)

    def job(self, direction: Direction) -> None:
        backend = self.backend
        result = backend.wait(backend.submit(direction, *self.ids(direction)))
        backend.poll()  # drained, so results do not pile up
        if not result.success:
            raise RuntimeError(f"{direction} job failed: {result.error}")

    def close(self) -> None:
        self.backend.close()


def _clear(rows: list[torch.Tensor]) -> None:
    for r in rows:
        r.zero_()


def describe_peer(job: PeerJob, direction: Direction, info: dict[str, Any]) -> None:
    """What the peer ran, and which path vLLM itself would take for this job.

    vLLM's worker runs the Triton kernel only for loads of at least MIN_N
    descriptors of pages under THRESHOLD_BYTES; otherwise its C++ DMA path.
    """
    k = job.kernel
    page = int(job.sizes[0])
    triton_in_vllm = (
        direction is Direction.CPU_TO_GPU and job.n >= k.MIN_N and page < k.THRESHOLD_BYTES
    )
    info.update(
        peer_descriptors=job.n,
        peer_bytes_per_chunk=job.chunk,
        peer_vllm_path="triton" if triton_in_vllm else "cpp_dma",
    )


def median_seconds(
    fixture: Fixture,
    direction: Direction,
    num_bytes: int,
    repeat: int,
    peer: ModuleType | None,
    info: dict[str, Any],
) -> dict[str, float]:
    """Median seconds of the bound, the backend's job and the peer kernel, one direction."""
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    target, source = (host, device) if direction is Direction.GPU_TO_CPU else (device, host)

    def bound() -> None:
        with torch.cuda.stream(side):
            target.copy_(source, non_blocking=True)

    plan = fixture.plan(direction)
    src_rows, dst_rows = fixture.sides(direction)
    runs: dict[str, Callable[[], object]] = {
        BOUND: bound,
        BACKEND: lambda: fixture.job(direction),
    }
    if peer is not None:
        runs[PEER] = peer_job = PeerJob(peer, src_rows, dst_rows, plan)
        describe_peer(peer_job, direction, info)
    # Warm-up (Triton compiles here), each copy checked on a cleared destination.
    synced_seconds(bound)
    for name in (BACKEND, PEER):
        if name in runs:
            _clear(dst_rows)
            synced_seconds(runs[name])
            check_copy(name, plan, src_rows, dst_rows)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            times[name].append(synced_seconds(run))
    return {name: statistics.median(values) for name, values in times.items()}


def load_latency(repeat: int, peer: ModuleType | None, cache: CacheShape) -> dict[str, Any]:
    """One request's load (32 blocks of 1 MiB, or of one GPU block where that is larger):
    submit until poll reports it, median seconds."""
    block_bytes = max(LATENCY_BLOCK_BYTES, cache.gpu_block_bytes)
    fixture = Fixture(block_bytes, LATENCY_BLOCKS, cache)
    direction = Direction.CPU_TO_GPU
    try:
        backend = fixture.backend
        fixture.job(direction)  # warm-up
        samples = []
        for _ in range(repeat):
            torch.cuda.synchronize()
            start = time.perf_counter()
            job_id = backend.submit(direction, *fixture.ids(direction))
            results = backend.poll()
            while not any(r.job_id == job_id for r in results):
                time.sleep(POLL_INTERVAL_S)
                results = backend.poll()
            samples.append(time.perf_counter() - start)
            if not all(r.success for r in results):
                raise RuntimeError(f"latency job failed: {[r.error for r in results]}")
        row: dict[str, Any] = {
            "bench": "transfer_cuda_latency",
            "direction": str(direction),
            "block_bytes": block_bytes,
            "blocks": LATENCY_BLOCKS,
            **cache.fields(),
            "median_s": round(statistics.median(samples), 7),
            "min_s": round(min(samples), 7),
            "max_s": round(max(samples), 7),
        }
        if peer is not None:
            src_rows, dst_rows = fixture.sides(direction)
            run = PeerJob(peer, src_rows, dst_rows, fixture.plan(direction))
            synced_seconds(run)
            peer_s = statistics.median(synced_seconds(run) for _ in range(repeat))
            row["peer_median_s"] = round(peer_s, 7)
        return row
    finally:
        fixture.close()


def release() -> None:
    """Hand cached device and pinned memory back between configurations."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    empty_host_cache = getattr(torch.accelerator, "empty_host_cache", None)
    if empty_host_cache is not None:
        with contextlib.suppress(Exception):
            empty_host_cache()


def sweep(sizes: list[int], batches: list[int], budget: float) -> Iterator[tuple[int, int]]:
    """(block bytes, blocks per job) pairs, small first; over-budget ones named on stderr."""
    for block_bytes in sizes:
        for blocks in batches:
            need = 2 * block_bytes * blocks
            if need > budget:
                print(
                    f"skipped {block_bytes // KIB} KiB x {blocks}: needs {need / GIB:.1f} GiB "
                    f"per side, over --budget-gib {budget / GIB:g}",
                    file=sys.stderr,
                )
                continue
            yield block_bytes, blocks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=count, default=DEFAULT_REPEAT, help="timed runs per figure"
    )
    parser.add_argument(
        "--budget-gib",
        type=float,
        default=DEFAULT_BUDGET_GIB,
        help="GiB each side (GPU, pinned host) may hold: twice a job's bytes",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip vLLM's Triton kernel")
    parser.add_argument(
        "--sizes",
        type=count,
        nargs="+",
        metavar="KIB",
        default=[b // KIB for b in BLOCK_BYTES],
        help="offloaded block sizes, KiB",
    )
    parser.add_argument(
        "--batches",
        type=count,
        nargs="+",
        metavar="N",
        default=list(BATCHES),
        help="blocks per job",
    )
    parser.add_argument(
        "--layers",
        type=count,
        default=DEFAULT_LAYERS,
        help="layers of the GPU cache (K and V apart: two pages of 16 KiB each per block)",
    )
    parser.add_argument(
        "--canonical",
        action="store_true",
        help="the GPU cache as one int8 tensor of whole pages, as vLLM 0.33 hands it over",
    )
    args = parser.parse_args(argv)
    if not (math.isfinite(args.budget_gib) and args.budget_gib > 0):
        parser.error(f"--budget-gib must be a number of GiB above 0, got {args.budget_gib}")
    gpu_block_kib = args.layers * LAYER_BLOCK_BYTES // KIB
    for size in args.sizes:
        if size % gpu_block_kib:
            parser.error(
                f"--sizes: {size} KiB is not a multiple of the GPU block, {gpu_block_kib} KiB "
                f"over {args.layers} layers"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.transfer_cuda needs a CUDA device, and torch sees none", file=sys.stderr)
        return 2
    peer: ModuleType | None = None
    if not args.no_peer:
        try:
            peer = load_peer()
        except Exception as exc:  # any failure only drops the peer column
            print(f"vLLM peer unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
    print(
        "targets: ratio >= 0.90 for blocks >= 1 MiB, >= 0.70 for 64 KiB; "
        "vs_peer is backend / vLLM Triton kernel",
        file=sys.stderr,
    )
    cache = CacheShape(args.layers, args.canonical)
    budget = args.budget_gib * GIB
    for block_bytes, blocks in sweep([s * KIB for s in args.sizes], args.batches, budget):
        num_bytes = block_bytes * blocks
        fixture = Fixture(block_bytes, blocks, cache)
        try:
            for direction in Direction:
                info: dict[str, Any] = {}
                med = median_seconds(fixture, direction, num_bytes, args.repeat, peer, info)
                backend_gbps = num_bytes / med[BACKEND] / 1e9
                bound_gbps = num_bytes / med[BOUND] / 1e9
                ratio = backend_gbps / bound_gbps
                target = target_ratio(block_bytes)
                row: dict[str, Any] = {
                    "bench": "transfer_cuda",
                    "direction": str(direction),
                    "block_bytes": block_bytes,
                    "blocks": blocks,
                    **cache.fields(),
                    "repeat": args.repeat,
                    "backend_gbps": round(backend_gbps, 3),
                    "bound_gbps": round(bound_gbps, 3),
                    "ratio": round(ratio, 3),
                    "target_ratio": target,
                    "meets_target": None if target is None else ratio >= target,
                    "zero_copy": fixture.backend.zero_copy,
                }
                if PEER in med:
                    peer_gbps = num_bytes / med[PEER] / 1e9
                    row["peer_gbps"] = round(peer_gbps, 3)
                    row["peer_ratio"] = round(peer_gbps / bound_gbps, 3)
                    row["vs_peer"] = round(backend_gbps / peer_gbps, 3)
                    row.update(info)
                emit(row)
        finally:
            fixture.close()
            del fixture
            release()
    emit(load_latency(args.repeat, peer, cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
