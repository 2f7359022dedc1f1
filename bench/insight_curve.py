"""How fast the sidecar side builds a curve, against 1,000,000 block events/s, and its memory.

Run from the repository root: .venv/bin/python -m bench.insight_curve [--rate R] [--current C]
The bundled trace is sampled first (the worker's part, not timed here), then
replayed into a ``CurveEstimator``: the LRU stack alone, and the whole
estimator (the stack plus every other registered policy's shadow tiers).
Each figure is the best of three rounds: sampled block events per second
the builder took, and the block references of the full stream those stand
for (the worker's rate). Memory: hashes held against the stated bound, and
the estimator's bytes as tracemalloc counts them. Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

from bench.tooling.common import count, sampling_rate, trace
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler

BUDGET_EVENTS_PER_S = 1_000_000
ROUNDS = 3


def _build(
    sampled: list[tuple[list[int], int]], current: int, rate: float, policies: list[str] | None
) -> tuple[float, CurveEstimator]:
    estimator = CurveEstimator(current, rate, policies)
    record = estimator.record
    start = time.perf_counter()
    for blocks, refs in sampled:
        record(blocks, refs)
    return time.perf_counter() - start, estimator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate", type=sampling_rate, default=DEFAULT_RATE,
        help=f"sampling rate, above 0 and at most 1 (default {DEFAULT_RATE})",
    )  # fmt: skip
    parser.add_argument("--current", type=count, default=2000)
    args = parser.parse_args()
    _, requests = trace()
    sampler = SpatialSampler(args.rate)
    sampled = [(sampler.sample(request), len(request)) for request in requests]
    events = sum(len(blocks) for blocks, _ in sampled)
    refs = sum(map(len, requests))
    for name, policies in (("lru stack", ["lru"]), ("stack + shadows", None)):
        seconds = min(_build(sampled, args.current, args.rate, policies)[0] for _ in range(ROUNDS))
        tracemalloc.start()
        _, estimator = _build(sampled, args.current, args.rate, policies)
        held_bytes, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(json.dumps({
            "bench": "insight_curve", "builder": name, "policies": estimator.policies,
            "rate": args.rate, "current": args.current,
            "sampled_events": events, "block_refs": refs,
            "sampled_events_per_s": round(events / seconds),
            "stream_refs_per_s": round(refs / seconds),
            "sampled_events_share_of_budget": round(events / seconds / BUDGET_EVENTS_PER_S, 3),
            "stream_refs_share_of_budget": round(refs / seconds / BUDGET_EVENTS_PER_S, 3),
            "held_blocks": estimator.held_blocks, "max_held_blocks": estimator.max_held_blocks,
            "traced_bytes": held_bytes,
        }))  # fmt: skip


if __name__ == "__main__":
    main()
