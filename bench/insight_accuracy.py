"""The sampled hit-ratio curve against the exact sweep, per rate, seed and capacity.

Run from the repository root: .venv/bin/python -m bench.insight_accuracy
[--rates 0.01,0.02,0.05,0.1,0.2] [--seeds 8] [--current 2000]
One JSON line per (rate, policy, capacity): the exact hit ratio (a full
canonical replay), the sampled estimate's worst and mean error over the
seeds, in points; then one line per rate with its worst error anywhere, and
the stack model's own gap (rate 1) to the ``lru`` replay. The default rate
(offload/insight/sampling.py) is the lowest whose worst error stays within
the 2-point target.
"""

from __future__ import annotations

import argparse
import json

from bench.tooling.common import count, trace
from offload.cpu.policies.registry import policy_names
from offload.insight.curve import scaled_capacities
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import SpatialSampler
from offload.insight.sweep import sweep, sweep_curve

TARGET_POINTS = 2.0


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=_floats, default=[0.01, 0.02, 0.05, 0.1, 0.2])
    parser.add_argument("--seeds", type=count, default=8)
    parser.add_argument("--current", type=count, default=2000)
    args = parser.parse_args()
    _, requests = trace()
    capacities = scaled_capacities(args.current)
    policies = policy_names()
    exact = sweep_curve(sweep(requests, policies, capacities))
    stack = CurveEstimator(args.current, 1.0, ["lru"])
    for request in requests:
        stack.record(request, len(request))
    gap = [
        100 * (s - e)
        for s, e in zip(stack.curve().hit_ratios["lru"], exact.hit_ratios["lru"], strict=True)
    ]
    print(json.dumps({"bench": "insight_accuracy", "stack_model_gap_points":
                      [round(g, 3) for g in gap], "capacities": list(capacities)}))  # fmt: skip
    for rate in args.rates:
        errors: dict[str, list[list[float]]] = {p: [[] for _ in capacities] for p in policies}
        for seed in range(args.seeds):
            sampler = SpatialSampler(rate, seed)
            estimator = CurveEstimator(args.current, rate, policies)
            for request in requests:
                estimator.record(sampler.sample(request), len(request))
            estimate = estimator.curve()
            for policy in policies:
                pairs = zip(estimate.hit_ratios[policy], exact.hit_ratios[policy], strict=True)
                for index, (guess, truth) in enumerate(pairs):
                    errors[policy][index].append(100 * (guess - truth))
        worst = 0.0
        for policy in policies:
            for index, capacity in enumerate(capacities):
                found = errors[policy][index]
                worst_here = max(map(abs, found))
                worst = max(worst, worst_here)
                print(json.dumps({
                    "rate": rate, "policy": policy, "capacity": capacity,
                    "exact": round(exact.hit_ratios[policy][index], 5),
                    "worst_error_points": round(worst_here, 3),
                    "mean_error_points": round(sum(found) / len(found), 3),
                }))  # fmt: skip
        print(json.dumps({"rate": rate, "seeds": args.seeds, "worst_error_points": round(worst, 3),
                          "within_target": worst <= TARGET_POINTS}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
