"""The exact offline sweep: every (policy, capacity) replayed on the whole trace.

This is the ground truth a sampled curve is held to, and what ``kvscope
replay`` prints: each registered policy through the canonical workload on a
fresh manager, and ``opt``, the offline optimum (offload/sim/optimum.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from offload.base import BlockHash
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import OPTIMUM, policy_names
from offload.insight.curve import HitRatioCurve
from offload.sim.optimum import offline_hits
from offload.sim.workload import WorkloadResult, run_workload

OPT = OPTIMUM
"""The offline optimum, by the name a sweep takes beside the registered policies."""
CHUNK_REQUESTS = 256
"""Requests per canonical-workload call between two progress reports."""

Progress = Callable[[int], None]
"""Called with the requests replayed since the last call."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    policy: str
    capacity: int
    result: WorkloadResult


def sweep_policies() -> list[str]:
    """The names a sweep takes: every registered policy, then ``opt``."""
    return [*policy_names(), OPT]


def check_sweep(policies: Sequence[str], capacities: Sequence[int]) -> None:
    """A ValueError naming the first unknown policy or capacity below one block."""
    known = sweep_policies()
    for policy in policies:
        if policy not in known:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(known)}")
    for capacity in capacities:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a whole number of blocks >= 1, got {capacity!r}")


def replay_point(
    requests: Sequence[Sequence[BlockHash]],
    policy: str,
    capacity: int,
    block_size: int = 1,
    progress: Progress | None = None,
) -> WorkloadResult:
    """One (policy, capacity): the canonical workload chunk by chunk, or the optimum."""
    check_sweep([policy], [capacity])
    if policy == OPT:
        start = time.perf_counter()
        hits = offline_hits(requests, capacity, progress)
        seconds = time.perf_counter() - start
        return WorkloadResult(len(requests), sum(map(len, requests)), hits, seconds)
    manager = CPUOffloadingManager(block_size, capacity, policy, enable_events=True)
    hits = block_refs = 0
    seconds = 0.0
    for first in range(0, len(requests), CHUNK_REQUESTS):
        chunk = requests[first : first + CHUNK_REQUESTS]
        part = run_workload(manager, chunk)
        hits += part.hits
        block_refs += part.block_refs
        seconds += part.seconds
        if progress is not None:
            progress(len(chunk))
    return WorkloadResult(len(requests), block_refs, hits, seconds)


def sweep(
    requests: Sequence[Sequence[BlockHash]],
    policies: Sequence[str],
    capacities: Sequence[int],
    block_size: int = 1,
    progress: Progress | None = None,
) -> list[SweepPoint]:
    """Every (policy, capacity), policy by policy, each capacity ascending."""
    check_sweep(policies, capacities)
    return [
        SweepPoint(policy, capacity, replay_point(requests, policy, capacity, block_size, progress))
        for policy in policies
        for capacity in sorted(capacities)
    ]


def sweep_curve(points: Sequence[SweepPoint], current: int | None = None) -> HitRatioCurve:
    """The sweep as a curve: hit ratio per policy at each capacity swept."""
    capacities = tuple(sorted({point.capacity for point in points}))
    ratios: dict[str, list[float]] = {}
    for point in points:
        series = ratios.setdefault(point.policy, [0.0] * len(capacities))
        series[capacities.index(point.capacity)] = point.result.hit_ratio
    return HitRatioCurve(capacities, {p: tuple(r) for p, r in ratios.items()}, current)
