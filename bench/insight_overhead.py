"""The worker's cost of insight (miss attribution and sampling), per block reference,
against the 30 ns budget.

Run from the repository root:
.venv/bin/python -m bench.insight_overhead [--rate R] [--pairs N]
The headline pairs two replays of the bundled trace chunk by chunk, the
leading side alternating from chunk to chunk and, in pairs of rounds, from
round to round (bench.tooling.pairing: A B B A, so neither side gains from
running second; events on in both): the canonical replay as the worker runs
it, with miss attribution and the sample (each request into the worker's
sample buffer, a frame taken and encoded when due, checked once per request
as the worker does once per step), against the same replay with attribution
off and no sampler. The stored events' parents are in both: they are the
events' own cost (bench.telemetry_overhead).

Everything runs on the calling thread, so it is timed by the thread's CPU
clock, not the wall's: on a shared host the wall clock also counts the time
the thread waits while a neighbour runs, which lands on one side of a pair
and not the other. The headline is the median of the pairs' differences,
printed with a 95% interval for that median, and the same for the ratio of
the two replays: two runs whose intervals overlap did not tell their
figures apart.

Beside it, each the best of several rounds: the sampling test alone
(``SpatialSampler.sample``) with int hashes and with the same hashes as
vLLM's 36-byte keys, and, in the same loop, a bare copy of each request's
hashes and the cheapest test a comprehension can make (the interpreter's
floors, so a loaded machine shows as both growing). Which form of the test,
the recorder and the attribution ran (C, or Python where no compiler built
them), and whether the recorder ran the test's selection in C, are printed
with the figures, and the headline per request too (the trace's requests
average 24 blocks). Prints one JSON line; never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from functools import partial
from hashlib import sha256
from statistics import median

from bench.tooling.common import count, sampling_rate, trace
from bench.tooling.pairing import (
    Round,
    abba_pairs,
    median_interval,
    pair_difference,
    pair_ratio,
    paired_round,
)
from offload.base import BlockHash
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.miss_attribution import MissAttribution, PyMissAttribution
from offload.insight.sampling import DEFAULT_RATE, PySampleTest, SampleTest, SpatialSampler
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE
from offload.sim.workload import run_request
from offload.wire.sample_frame import encode_sample_frame
from offload.wire.sample_recorder import PySampleRecorder, SampleRecorder
from offload.worker_telemetry import WorkerTelemetry

BUDGET_NS = 30.0
CAPACITY = 2000
ROUNDS = 7
"""Rounds of the best-of figures beside the headline."""
PAIRS = 12
"""Pairs of rounds behind the headline: the fewest whose median's 95% interval leaves out
the two highest and lowest pairs."""
CHUNK = 32
CLOCK = time.thread_time


def _sampling_alone(sampler: SpatialSampler, requests: Sequence[Sequence[BlockHash]]) -> float:
    sample = sampler.sample
    start = CLOCK()
    for request in requests:
        sample(request)
    return CLOCK() - start


def _copy_alone(requests: list[list[int]]) -> float:
    """The same loop copying each request's hashes: the interpreter's floor, for scale."""
    start = CLOCK()
    for request in requests:
        [h for h in request]  # the measured work: one comprehension per request
    return CLOCK() - start


def _compare_alone(requests: list[list[int]], threshold: int) -> float:
    """The same loop keeping the hashes below a threshold: the cheapest per-hash test."""
    start = CLOCK()
    for request in requests:
        [h for h in request if h < threshold]  # the measured work
    return CLOCK() - start


def _as_vllm_keys(requests: list[list[int]]) -> list[list[bytes]]:
    """The hashes as vLLM 0.33's OffloadKeys: a 32-byte digest, then 4 bytes of group index."""
    return [[sha256(h.to_bytes(8, "little")).digest() + bytes(4) for h in r] for r in requests]


def _insight_round(rate: float, requests: list[list[int]], insight_leads: bool) -> Round:
    """CPU seconds of the replay without and with insight, paired chunk by chunk."""
    plain = CPUOffloadingManager(
        BUNDLED_TRACE_BLOCK_SIZE, CAPACITY, "lru", enable_events=True, attribute_misses=False
    )
    insight = CPUOffloadingManager(BUNDLED_TRACE_BLOCK_SIZE, CAPACITY, "lru", enable_events=True)
    telemetry = WorkerTelemetry(insight, engine_id="bench", sampler=SpatialSampler(rate))
    samples = telemetry.samples
    assert samples is not None
    record, due = samples.add, samples.due

    def without(chunk: Sequence[Sequence[BlockHash]]) -> None:
        for request in chunk:
            run_request(plain, request)

    def with_insight(chunk: Sequence[Sequence[BlockHash]]) -> None:
        for request in chunk:
            record(request)
            run_request(insight, request)
            if due():  # the worker's check once per step
                frame = samples.take("bench", 0, telemetry.config)
                assert frame is not None
                encode_sample_frame(frame)

    return paired_round(requests, CHUNK, without, with_insight, clock=CLOCK, on_leads=insight_leads)


def _form(implementation: object, python_form: object) -> str:
    """Which form ran: "python" where kvscope was installed without a C compiler, else "C"."""
    return "python" if implementation is python_form else "C"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate", type=sampling_rate, default=DEFAULT_RATE,
        help=f"sampling rate, above 0 and at most 1 (default {DEFAULT_RATE})",
    )  # fmt: skip
    parser.add_argument(
        "--pairs",
        type=count,
        default=PAIRS,
        help="pairs of whole-trace rounds behind the headline, each side leading in one",
    )
    args = parser.parse_args()
    _, requests = trace()
    refs = sum(map(len, requests))
    sampler = SpatialSampler(args.rate)
    keys = _as_vllm_keys(requests)
    alone = min(_sampling_alone(sampler, requests) for _ in range(ROUNDS))
    keys_alone = min(_sampling_alone(sampler, keys) for _ in range(ROUNDS))
    copy = min(_copy_alone(requests) for _ in range(ROUNDS))
    compare = min(_compare_alone(requests, sampler.threshold) for _ in range(ROUNDS))
    pairs = abba_pairs(args.pairs, partial(_insight_round, args.rate, requests))
    rounds = [one for pair in pairs for one in pair]
    without = median(off for off, _ in rounds)
    with_insight = median(on for _, on in rounds)
    alone_ns = 1e9 * alone / refs
    per_pair = sorted(1e9 * pair_difference(pair) / refs for pair in pairs)
    insight_ns = median(per_pair)
    ratios = [pair_ratio(pair) for pair in pairs]
    per_round = sorted(round(1e9 * (on - off) / refs, 1) for off, on in rounds)
    print(json.dumps({
        "bench": "insight_overhead", "rate": args.rate, "block_refs": refs,
        "forms": {
            "attribution": _form(MissAttribution, PyMissAttribution),
            "sampling": _form(SampleTest, PySampleTest),
            "sample_recorder": _form(SampleRecorder, PySampleRecorder),
            "test_in_recorder": SampleRecorder(sampler.sample, 1, 1, 1, 1.0).selects_in_c,
        },
        "insight_ns_per_block": round(insight_ns, 1),
        "insight_ns_per_request": round(insight_ns * refs / len(requests)),
        "insight_ns_per_block_interval": [round(x, 1) for x in median_interval(per_pair)],
        "insight_ns_per_block_pairs": [round(x, 1) for x in per_pair],
        "insight_ns_per_block_rounds": per_round,
        "with_over_without": round(median(ratios), 4),
        "with_over_without_interval": [round(x, 4) for x in median_interval(ratios)],
        "clock": "thread_cpu",
        "budget_ns_per_block": BUDGET_NS,
        "insight_share_of_budget": round(insight_ns / BUDGET_NS, 2),
        "replay_ns_per_block": round(1e9 * without / refs, 1),
        "replay_with_insight_ns_per_block": round(1e9 * with_insight / refs, 1),
        "sampling_ns_per_block": round(alone_ns, 1),
        "sampling_vllm_keys_ns_per_block": round(1e9 * keys_alone / refs, 1),
        "copy_ns_per_block": round(1e9 * copy / refs, 1),
        "one_comparison_ns_per_block": round(1e9 * compare / refs, 1),
        "sampling_over_copy": round(alone / copy, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
