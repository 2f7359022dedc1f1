"""What a publisher's curve and counts say, in plain words and as fields.

Computed by the sidecar, not the page, so every reader (the page, a script,
an alert) gets the same sentence from the same numbers. Each verdict has a
``kind`` and the figures its sentence states, so a program need not parse
the text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from offload.insight.curve import HitRatioCurve
from offload.insight.window_optimum import WindowResult

VerdictKind = Literal["warming_up", "capacity", "policy", "optimum", "admission", "stranded"]

MIN_SAMPLED_REFS: Final = 100
"""Sampled references a simulation needs before its curve is worth a verdict."""
POLICY_POINTS: Final = 0.5
"""A policy that differs from the tier's by less than this (points of hit ratio) is no news."""
NO_CHANGE_POINTS: Final = 0.05
"""A change below this shows as 0.0 points: said as no change instead."""
DEAD_WRITES_WORTH_SAYING: Final = 0.1
"""A share of stores never read from which admission is worth a sentence."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One finding: its sentence and the figures in it.

    ``points``: hit-ratio points gained (negative: lost); ``multiple``: the
    capacity it speaks of, as a multiple of the current one; ``share``: a
    ratio in 0..1 (dead writes, or the tier's hits over the optimum's);
    ``blocks``: a block count (stranded blocks, or the capacity a multiple
    stands for).
    """

    kind: VerdictKind
    text: str
    policy: str | None = None
    multiple: float | None = None
    points: float | None = None
    share: float | None = None
    blocks: int | None = None
    medium: str | None = None


def _points(value: float) -> str:
    return f"~{abs(value):.1f} points"


def curve_verdicts(
    curve: HitRatioCurve | None, policy: str | None, simulated_refs: Mapping[str, int]
) -> list[Verdict]:
    """What the curve says of the tier's size and of its policy."""
    if curve is None or curve.current is None or policy is None:
        return []
    fewest = min(simulated_refs.get(p, 0) for p in curve.policies)
    if fewest < MIN_SAMPLED_REFS:
        return [
            Verdict(
                "warming_up",
                f"the curve rests on {fewest} sampled references so far; its verdicts wait "
                f"for {MIN_SAMPLED_REFS}",
            )
        ]
    found: list[Verdict] = []
    current = curve.current
    if policy in curve.hit_ratios:
        here = curve.at(policy, current)
        for multiple, word in ((2.0, "doubling"), (0.5, "halving")):
            blocks = max(1, round(current * multiple))
            if blocks == current or blocks not in curve.capacities:
                continue
            points = 100 * (curve.at(policy, blocks) - here)
            change = (
                "would not change its hit ratio"
                if abs(points) < NO_CHANGE_POINTS
                else f"would {'add' if points > 0 else 'lose'} {_points(points)} of hit ratio"
            )
            found.append(
                Verdict(
                    "capacity",
                    f"{word} the tier (to {blocks:,} blocks) {change} under {policy}",
                    policy=policy,
                    multiple=multiple,
                    points=points,
                    blocks=blocks,
                )
            )
        for other in curve.policies:
            if other == policy:
                continue
            points = 100 * (curve.at(other, current) - here)
            if abs(points) < POLICY_POINTS:
                text = f"{other} would hit about as {policy} does at this size"
            else:
                verb = "add" if points > 0 else "lose"
                text = f"{other} would {verb} {_points(points)} at this size"
            found.append(Verdict("policy", text, policy=other, multiple=1.0, points=points))
    return found


def optimum_verdict(result: WindowResult | None) -> list[Verdict]:
    """The tier's policy against a clairvoyant cache of the same size, over the window."""
    efficiency = None if result is None else result.efficiency
    if result is None or efficiency is None:
        return []
    return [
        Verdict(
            "optimum",
            f"this tier gets {round(100 * efficiency)}% of the hits a clairvoyant cache of the "
            f"same size would (under {result.policy}, over its last {result.refs:,} sampled "
            "references)",
            policy=result.policy,
            share=efficiency,
        )
    ]


def admission_verdict(dead_write_ratio: float | None) -> list[Verdict]:
    """Stores never read before they left: what admission control would save."""
    if dead_write_ratio is None or dead_write_ratio < DEAD_WRITES_WORTH_SAYING:
        return []
    percent = round(100 * dead_write_ratio)
    return [
        Verdict(
            "admission",
            f"{percent}% of stores are never read: admission would help",
            share=dead_write_ratio,
        )
    ]


def candidate_verdict(hit_ratios: Mapping[str, float], followed: str | None) -> list[Verdict]:
    """Under the gated policy: the admission candidate the tier runs as, against the best
    of its models over the recent window."""
    if followed is None or followed not in hit_ratios:
        return []
    best = max(hit_ratios, key=hit_ratios.__getitem__)
    points = 100 * (hit_ratios[best] - hit_ratios[followed])
    if best == followed or points < POLICY_POINTS:
        text = (
            f"the tier admits as {followed}, at or near the best of its admission candidates "
            "over the recent window"
        )
        return [Verdict("admission", text, points=0.0)]
    text = (
        f"the tier admits as {followed}; admitting as {best} would add {_points(points)} over "
        "the recent window in its model (the tier switches once the lead is beyond chance)"
    )
    return [Verdict("admission", text, points=points)]


def stranded_verdicts(stranded: Mapping[str, int]) -> list[Verdict]:
    """Blocks held where no prefix lookup reaches them: capacity spent on nothing."""
    return [
        Verdict(
            "stranded",
            f"{count:,} blocks on {medium} are stranded: held, but a block before them in "
            "their chain is held nowhere, so no lookup reaches them",
            blocks=count,
            medium=medium,
        )
        for medium, count in stranded.items()
        if count > 0
    ]
