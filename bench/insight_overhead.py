"""The worker's cost of sampling: ns per block reference, against the 30 ns budget.

Run from the repository root: .venv/bin/python -m bench.insight_overhead [--rate R]
Figures, each the best of several rounds: the sampling test alone over
every request of the bundled trace (``SpatialSampler.sample``, what the
worker adds per request), with int hashes and with the same hashes as
vLLM's 36-byte keys; beside it, in the same loop, a bare copy of each
request's hashes (the interpreter's floor on this machine, so a loaded
machine shows as both growing) and the cheapest test a comprehension can
make, one comparison per hash (the floor of any per-reference test in
CPython); and the canonical replay with the test inline against the same
replay without, chunk by chunk alternating so a noisy neighbour lands on
both alike. Prints one JSON line; never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from hashlib import sha256

from bench.tooling.common import trace
from offload.base import BlockHash
from offload.cpu.manager import CPUOffloadingManager
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE
from offload.sim.workload import run_request

BUDGET_NS = 30.0
ROUNDS = 7
CHUNK = 64


def _sampling_alone(sampler: SpatialSampler, requests: Sequence[Sequence[BlockHash]]) -> float:
    sample = sampler.sample
    start = time.perf_counter()
    for request in requests:
        sample(request)
    return time.perf_counter() - start


def _copy_alone(requests: list[list[int]]) -> float:
    """The same loop copying each request's hashes: the interpreter's floor, for scale."""
    start = time.perf_counter()
    for request in requests:
        [h for h in request]  # the measured work: one comprehension per request
    return time.perf_counter() - start


def _compare_alone(requests: list[list[int]], threshold: int) -> float:
    """The same loop keeping the hashes below a threshold: the cheapest per-hash test."""
    start = time.perf_counter()
    for request in requests:
        [h for h in request if h < threshold]  # the measured work
    return time.perf_counter() - start


def _as_vllm_keys(requests: list[list[int]]) -> list[list[bytes]]:
    """The hashes as vLLM 0.33's OffloadKeys: a 32-byte digest, then 4 bytes of group index."""
    return [[sha256(h.to_bytes(8, "little")).digest() + bytes(4) for h in r] for r in requests]


def _replay_alternating(sampler: SpatialSampler, requests: list[list[int]]) -> tuple[float, float]:
    """Seconds of the replay without and with the test, chunks alternating between two tiers."""
    plain = CPUOffloadingManager(BUNDLED_TRACE_BLOCK_SIZE, 2000, "lru", enable_events=True)
    sampled = CPUOffloadingManager(BUNDLED_TRACE_BLOCK_SIZE, 2000, "lru", enable_events=True)
    sample = sampler.sample
    without = with_test = 0.0
    for first in range(0, len(requests), CHUNK):
        chunk = requests[first : first + CHUNK]
        start = time.perf_counter()
        for request in chunk:
            run_request(plain, request)
        middle = time.perf_counter()
        for request in chunk:
            sample(request)
            run_request(sampled, request)
        without += middle - start
        with_test += time.perf_counter() - middle
    return without, with_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE)
    args = parser.parse_args()
    _, requests = trace()
    refs = sum(map(len, requests))
    sampler = SpatialSampler(args.rate)
    keys = _as_vllm_keys(requests)
    alone = min(_sampling_alone(sampler, requests) for _ in range(ROUNDS))
    keys_alone = min(_sampling_alone(sampler, keys) for _ in range(ROUNDS))
    copy = min(_copy_alone(requests) for _ in range(ROUNDS))
    compare = min(_compare_alone(requests, sampler.threshold) for _ in range(ROUNDS))
    rounds = [_replay_alternating(sampler, requests) for _ in range(3)]
    without = min(r[0] for r in rounds)
    with_test = min(r[1] for r in rounds)
    alone_ns = 1e9 * alone / refs
    inline_ns = 1e9 * (with_test - without) / refs
    print(json.dumps({
        "bench": "insight_overhead", "rate": args.rate, "block_refs": refs,
        "sampling_ns_per_block": round(alone_ns, 1),
        "budget_ns_per_block": BUDGET_NS,
        "sampling_share_of_budget": round(alone_ns / BUDGET_NS, 2),
        "sampling_vllm_keys_ns_per_block": round(1e9 * keys_alone / refs, 1),
        "copy_ns_per_block": round(1e9 * copy / refs, 1),
        "one_comparison_ns_per_block": round(1e9 * compare / refs, 1),
        "sampling_over_copy": round(alone / copy, 2),
        "replay_ns_per_block": round(1e9 * without / refs, 1),
        "replay_with_sampling_ns_per_block": round(1e9 * with_test / refs, 1),
        "inline_difference_ns_per_block": round(inline_ns, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
