"""The sampled hit-ratio curve against the exact sweep, per rate, seed and capacity.

Run from the repository root: .venv/bin/python -m bench.insight_accuracy
[--rates 0.01,0.02,0.05,0.1,0.2] [--seeds 8] [--current 2000] [--shares 0.03125,0.25]
[--policies lru,arc]
[TRACE ...]
The bundled trace, then each TRACE, under the policies the sidecar simulates by default
(``--policies``). One JSON line per (trace, tier, rate, policy,
capacity): the exact hit ratio (a full canonical replay), the sampled estimate's worst
and mean error over the seeds, in points, and the share of seeds whose error the
estimate's own stated error (offload/insight/uncertainty.py) covers; then one line per
(trace, tier, rate) with the worst error and the share covered over the capacities a
verdict may rest on (at least ``MIN_SCALED_BLOCKS`` sampled blocks), and the same for
the doubling and halving differences at the tier, with the capacity verdicts they make
against those a 1-point resolution alone made (``_said``); and, on the bundled trace, the stack
model's own gap (rate 1) to the ``lru`` replay. ``--shares`` sets the tier to each
share of a trace's distinct blocks instead of ``--current``. The default rate
(offload/insight/sampling.py) is the lowest whose worst error on the bundled trace stays
within the 2-point target.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from app.settings import INSIGHT_POLICIES
from app.state.insight_verdicts import MIN_SCALED_BLOCKS, SAMPLED_RESOLUTION_POINTS
from bench.tooling.common import TRACES_HELP, count, named_traces, sampling_rate, trace
from offload.decimal_text import fractional_number
from offload.insight.curve import HitRatioCurve, scaled_capacities
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import SpatialSampler
from offload.insight.sweep import sweep, sweep_curve, sweep_policies
from offload.insight.uncertainty import difference_error
from offload.shown import shown

TARGET_POINTS = 2.0


def _rates(text: str) -> list[float]:
    """Comma-separated sampling rates: one out of (0, 1] ended the run in a traceback once
    the exact sweep had run."""
    return [sampling_rate(part.strip()) for part in text.split(",")]


def _shares(text: str) -> list[float]:
    """Comma-separated shares of a trace's distinct blocks, each above 0 (0 made a tier of
    one block)."""
    shares = []
    for part in text.split(","):
        try:
            share = fractional_number(part.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"a share must be {exc}, got {shown(repr(part), 60)}"
            ) from None
        if not 0 < share < math.inf:
            raise argparse.ArgumentTypeError(f"a share must be above 0, got {share}")
        shares.append(share)
    return shares


def _policies(text: str) -> list[str]:
    """Policy names the sweep knows: another ended the run in a traceback once the exact
    sweep had run."""
    known = sweep_policies()
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in known:
            raise argparse.ArgumentTypeError(
                f"unknown policy {shown(repr(name), 60)} (choose from {', '.join(known)})"
            )
    return names


def _stack_gap(requests: list[list[int]], current: int, exact: HitRatioCurve) -> list[float]:
    """The LRU stack at rate 1 against the ``lru`` replay, in points per capacity."""
    stack = CurveEstimator(current, 1.0, ["lru"])
    for request in requests:
        stack.record(request, len(request))
    pairs = zip(stack.curve().hit_ratios["lru"], exact.hit_ratios["lru"], strict=True)
    return [round(100 * (s - e), 3) for s, e in pairs]


def _differences(
    estimator: CurveEstimator, estimate: HitRatioCurve, exact: HitRatioCurve, policy: str
) -> list[tuple[float, float, float]]:
    """Halving and doubling the tier under ``policy``: (estimate, error, stated error) in
    points, for each whose both ends hold at least ``MIN_SCALED_BLOCKS`` sampled blocks."""
    assert estimate.current is not None
    here = estimate.capacities.index(estimate.current)
    by_size = estimator.capacity_errors(estimate)[policy]
    found = []
    for other in (here - 1, here + 1):
        if not 0 <= other < len(estimate.capacities):
            continue
        if min(estimate.capacities[other], estimate.current) * estimator.rate < MIN_SCALED_BLOCKS:
            continue
        guess = estimate.hit_ratios[policy][other] - estimate.hit_ratios[policy][here]
        truth = exact.hit_ratios[policy][other] - exact.hit_ratios[policy][here]
        stated = difference_error(
            guess,
            by_size[other],
            by_size[here],
            estimator.rate,
            estimator.rate * estimator.block_refs,
        )
        found.append((100 * guess, 100 * (guess - truth), 100 * stated))
    return found


def _said(differences: list[tuple[float, float, float]]) -> dict[str, int]:
    """The capacity verdicts the differences make: how many say a change (beyond the
    1-point resolution and their stated error), how many a 1-point resolution alone would
    say, and how many of each are off by more than what they claim (their stated error, at
    least a point; a point)."""
    floor = SAMPLED_RESOLUTION_POINTS
    said = [(e, s) for g, e, s in differences if abs(g) >= max(floor, s)]
    at_a_point = [e for g, e, _ in differences if abs(g) >= floor]
    return {
        "said": len(said),
        "said_off": sum(abs(e) > max(floor, s) for e, s in said),
        "said_at_a_point": len(at_a_point),
        "said_at_a_point_off": sum(abs(e) > floor for e in at_a_point),
    }


def _tiers(args: argparse.Namespace, requests: list[list[int]]) -> list[int]:
    """The tier sizes a trace runs at: ``--current``, or each of ``--shares`` of its distinct
    blocks."""
    if not args.shares:
        return [args.current]
    distinct = len({block for request in requests for block in request})
    return [max(1, round(share * distinct)) for share in args.shares]


def _run(name: str, requests: list[list[int]], current: int, args: argparse.Namespace) -> None:
    capacities = scaled_capacities(current)
    policies = args.policies
    exact = sweep_curve(sweep(requests, policies, capacities))
    if name == "bundled":
        gap = _stack_gap(requests, current, exact)
        print(json.dumps({"bench": "insight_accuracy", "stack_model_gap_points": gap,
                          "capacities": list(capacities)}))  # fmt: skip
    for rate in args.rates:
        errors = {p: [[] for _ in capacities] for p in policies}
        covered = {p: [0] * len(capacities) for p in policies}
        differences: list[tuple[float, float, float]] = []
        for seed in range(args.seeds):
            sampler = SpatialSampler(rate, seed)
            estimator = CurveEstimator(current, rate, policies)
            for request in requests:
                estimator.record(sampler.sample(request), len(request))
            estimate = estimator.curve()
            stated = estimator.errors(estimate)
            for policy in policies:
                for index, truth in enumerate(exact.hit_ratios[policy]):
                    error = 100 * (estimate.hit_ratios[policy][index] - truth)
                    errors[policy][index].append(error)
                    covered[policy][index] += abs(error) <= 100 * stated[policy][index]
                differences += _differences(estimator, estimate, exact, policy)
        worst, resolved, resolved_covered = 0.0, 0, 0
        for policy in policies:
            for index, capacity in enumerate(capacities):
                found = errors[policy][index]
                worst_here = max(map(abs, found))
                if rate * capacity >= MIN_SCALED_BLOCKS:
                    worst = max(worst, worst_here)
                    resolved += len(found)
                    resolved_covered += covered[policy][index]
                print(json.dumps({
                    "trace": name, "current": current, "rate": rate, "policy": policy,
                    "capacity": capacity, "exact": round(exact.hit_ratios[policy][index], 5),
                    "worst_error_points": round(worst_here, 3),
                    "mean_error_points": round(sum(found) / len(found), 3),
                    "covered": round(covered[policy][index] / len(found), 3),
                }))  # fmt: skip
        print(json.dumps({
            "trace": name, "current": current, "rate": rate, "seeds": args.seeds,
            "worst_error_points": round(worst, 3), "within_target": worst <= TARGET_POINTS,
            "covered": round(resolved_covered / resolved, 3) if resolved else None,
            "differences": len(differences),
            "differences_covered": round(
                sum(abs(e) <= s for _, e, s in differences) / len(differences), 3
            ) if differences else None,
            **_said(differences),
        }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, help=TRACES_HELP)
    parser.add_argument(
        "--rates", type=_rates, default=[0.01, 0.02, 0.05, 0.1, 0.2],
        help="sampling rates, comma-separated (default 0.01,0.02,0.05,0.1,0.2)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=count, default=8, help="sampler seeds per rate (default 8)")
    parser.add_argument(
        "--current", type=count, default=2000,
        help="the tier's size in blocks (default 2000; --shares sets it instead)",
    )  # fmt: skip
    parser.add_argument(
        "--policies", type=_policies, default=list(INSIGHT_POLICIES),
        help=f"policies, comma-separated (default {','.join(INSIGHT_POLICIES)})",
    )  # fmt: skip
    parser.add_argument(
        "--shares", type=_shares, default=[],
        help="tiers as shares of distinct blocks, comma-separated",
    )  # fmt: skip
    args = parser.parse_args()
    traces = [("bundled", trace()[1])]
    traces += [(str(path), requests) for path, requests in named_traces(parser, args.traces)]
    for name, requests in traces:
        for current in _tiers(args, requests):
            _run(name, requests, current, args)


if __name__ == "__main__":
    main()
