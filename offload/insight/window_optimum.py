"""The distance to the optimum, live: a clairvoyant cache over the last references of a sample.

The offline optimum (offload/sim/optimum.py: farthest next use with bypass)
needs the future, so a live answer can only be had over a stretch of the
past: the last ``max_refs`` sampled references. Over that window both the
optimum and the tier's own policy are replayed from an empty tier of the
tier's size scaled by the rate (as the curve's shadow tiers are), and the
tier's hits over the optimum's say how much of the reachable hit ratio its
policy gets. Both start empty, so the comparison is fair: on a prefix-closed
stream (vLLM's hash chains; a spatial sample of one keeps each sampled
block's nearest sampled ancestor fixed, so it is prefix-closed too) no
policy replayed from empty beats the optimum from empty. A stream whose
block ids recur behind other prefixes breaks more than that: both replays
then count a sampled block as hit behind unsampled blocks a lookup stopped
at, each by its own amount, so the sidecar withholds their quotient where
the sample shows it (prefix_check.py).

Why the window is ``WINDOW_CAPACITIES`` times the scaled capacity: a window
cut out of a running stream starts cold, where the live tier was full.
Starting empty costs the optimum at most one miss per block the full tier
held: a cold cache can do what the warm one did, missing each such block
once, at its first use (on a prefix-closed stream every block after a first
use in a request is a first use too, so a broken prefix costs no more). That
is at most ``capacity`` references of the window, ``1 / WINDOW_CAPACITIES``
of its hit ratio; LRU likewise (it holds what the warm one holds once
``capacity`` distinct blocks have been used), and a policy with more state
converges as it refills. The window's end costs
nothing: the optimum over the window is exact for the window's hits, which
is all it is compared on. A longer window lowers the bias and is slower to
follow a change of workload; memory and each recomputation grow with it
(linearly, and by a log factor for the optimum's heap). Sixteen puts the
worst-case start-up bias at about six points, and the common case far below
it (a block the tier held is only lost if the window uses it before anything
evicts it). ``MIN_WINDOW_REFS`` keeps a tiny tier's window large enough for a
ratio to mean something. None of these depend on a trace.

The efficiency states its own standard error (``uncertainty.quotient_error``):
below rate 1 the window's hits depend on which blocks the sample drew, and
both replays see the same ones, so the error pairs them block by block, from
each sampled block's misses in either replay (a prefix hit is a request's
leading blocks, so each replay's per-request hits say which references hit).

The window is kept as whole requests (a request longer than the window is
cut to its head, a chain's head being a chain, which then stands for its
share of the request's blocks). It is first computed once half
full (its start-up bias then at most ``2 / WINDOW_CAPACITIES``) and holding
at least ``MIN_WINDOW_REFS``, then again each time half its references are
new (``due``): never more than half a window stale, and two replays of the
window per window of references. The
replays run wherever the caller runs ``compute``, with no lock held.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import compress
from operator import lt
from typing import Final

from offload.base import BlockHash
from offload.cpu.policies.registry import policy_names
from offload.insight.estimator import adjusted_ratio
from offload.insight.sampling import check_rate
from offload.insight.shadow import ShadowTiers
from offload.insight.uncertainty import quotient_error
from offload.sim.optimum import offline_runs

WINDOW_CAPACITIES: Final = 16
"""The window, in scaled capacities' worth of sampled references (see the module's text)."""
MIN_WINDOW_REFS: Final = 512
"""The smallest window, in sampled references: a ratio over fewer is mostly noise (a
proportion's standard error over 512 references is at most ~2.2 points)."""
PACE_EVERY: Final = 64
"""Requests of the policy's replay between two calls of ``compute``'s ``pace``; the
optimum calls it every ``offload.sim.optimum.PROGRESS_EVERY`` requests."""


def scaled_capacity(capacity: int, rate: float) -> int:
    """The tier's size on the sample, in whole blocks (at least one), as shadow tiers take it."""
    return max(1, round(check_rate(rate) * capacity))


def window_refs(capacity: int, rate: float) -> int:
    """The window, in sampled references, for a tier of ``capacity`` blocks sampled at ``rate``."""
    return max(MIN_WINDOW_REFS, WINDOW_CAPACITIES * scaled_capacity(capacity, rate))


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One computation: the window's references and what each cache hit on them.

    ``optimum_hits`` and ``tier_hits`` count prefix hits on the sample; the
    ratios correct them for the sample's size as the curve does (SHARDS-adj),
    so they read as the full stream's and compare with the curve's points.
    """

    policy: str
    capacity: int
    """The scaled capacity both caches had, in sampled blocks."""
    rate: float
    refs: int
    """Sampled references in the window."""
    block_refs: int
    """Block references (sampled or not) the window's requests stood for."""
    optimum_hits: int
    tier_hits: int
    seconds: float
    """The CPU time the two replays and the error took (the thread's: waits for ``pace``
    left out)."""
    efficiency_error: float | None
    """The standard error of ``efficiency`` (0..1) from the blocks the sample drew
    (``uncertainty.quotient_error``); None where there is no efficiency, 0 at rate 1."""

    @property
    def optimum_ratio(self) -> float:
        return adjusted_ratio(self.optimum_hits, self.refs, self.block_refs, self.rate)

    @property
    def tier_ratio(self) -> float:
        return adjusted_ratio(self.tier_hits, self.refs, self.block_refs, self.rate)

    @property
    def efficiency(self) -> float | None:
        """The tier's hit ratio over the optimum's (0..1); None when the optimum hits nothing
        on the sample (its ratio is then the sample-size correction alone, the tier's too,
        and their quotient says nothing)."""
        optimum = self.optimum_ratio
        return self.tier_ratio / optimum if self.optimum_hits and optimum > 0 else None


class WindowOptimum:
    """The last ``max_refs`` sampled references of one stream, and their replays on demand.

    ``record`` is O(1) per request (amortized); ``compute`` is O(window) and
    belongs off the hot path. Memory: at most ``max_refs`` hash references
    (and the hashes they keep alive), plus, during ``compute``, the
    optimum's per-reference tables and one tier of ``capacity`` blocks.
    """

    def __init__(self, capacity: int, rate: float, policy: str) -> None:
        if policy not in policy_names():
            raise ValueError(f"unknown cache policy {policy!r}; known: {', '.join(policy_names())}")
        self.rate = check_rate(rate)
        self.policy = policy
        self.capacity = scaled_capacity(capacity, rate)
        self.max_refs = window_refs(capacity, rate)
        self._requests: deque[tuple[Sequence[BlockHash], int]] = deque()
        self.refs = 0
        """Sampled references held (at most ``max_refs``)."""
        self.block_refs = 0
        """Block references the held requests stand for."""
        self.fresh = 0
        """Sampled references recorded since the last ``take``."""

    def record(
        self,
        sampled: Sequence[Sequence[BlockHash]],
        block_refs: Sequence[int],
        unsampled: int = 0,
    ) -> None:
        """Requests in order, each its sampled blocks in prompt order (``sampled``) and how
        many blocks it had in all (``block_refs``); then ``unsampled`` block references of
        requests with none sampled.

        Requests with nothing sampled count their blocks with the newest request (or with
        nothing before the window's first request: they precede it). A whole frame at a
        time, in C-level passes over it, since this runs on the ingest thread. The window
        holds the sampled lists as given (not copied): they must not change after.
        """
        lengths = list(map(len, sampled))
        if any(map(lt, block_refs, lengths)):
            raise ValueError("a request cannot have more sampled blocks than blocks")
        kept = list(compress(zip(sampled, block_refs, strict=True), lengths))
        others = unsampled + sum(block_refs) - sum(compress(block_refs, lengths))
        cut = self.max_refs
        if max(lengths, default=0) > cut:  # a request longer than the window: its head
            # The head stands for its share of the request's blocks: the whole request's
            # count would read the blocks cut off as hits (the ratios' sample-size
            # correction counts references beyond the sampled ones as hits).
            kept = [(s[:cut], r * cut // len(s)) if len(s) > cut else (s, r) for s, r in kept]
            lengths = [min(n, cut) for n in lengths]
        window = self._requests
        window.extend(kept)
        if not window:
            return  # nothing sampled yet: these blocks precede the window
        kept_blocks = sum(r for _, r in kept)
        if others:
            head, head_blocks = window[-1]
            window[-1] = (head, head_blocks + others)
        fresh = sum(lengths)
        self.fresh += fresh
        refs, blocks = self.refs + fresh, self.block_refs + others + kept_blocks
        popleft = window.popleft
        while refs > cut:
            old, old_blocks = popleft()
            refs -= len(old)
            blocks -= old_blocks
        self.refs, self.block_refs = refs, blocks

    def due(self) -> bool:
        """Whether the window is at least half full, holds ``MIN_WINDOW_REFS``, and half of
        it is new since the last ``take``."""
        return (
            2 * self.refs >= self.max_refs
            and self.refs >= MIN_WINDOW_REFS
            and 2 * self.fresh >= self.refs
        )

    def take(self) -> tuple[list[Sequence[BlockHash]], int]:
        """The window as it is now (its requests' sampled blocks, its block references)."""
        self.fresh = 0
        return [sampled for sampled, _ in self._requests], self.block_refs

    def compute(
        self,
        requests: Sequence[Sequence[BlockHash]],
        block_refs: int,
        pace: Callable[[], None] | None = None,
    ) -> WindowResult:
        """The optimum and the tier's policy over ``requests`` (from ``take``), both from empty.

        ``pace`` is called between steps, so a caller on a CPU budget can wait
        inside a long computation. On a stream that is not prefix-closed the
        optimum's schedule is feasible but may not be the best (optimum.py);
        the better of it and the policy's own is then the closest known bound,
        so the efficiency never passes 1.
        """
        start = time.thread_time()
        tier = ShadowTiers([self.policy], [self.capacity])
        tier_runs: list[int] = []
        tier_hits = 0
        for index, sampled in enumerate(requests, start=1):
            tier.add(sampled)
            (hits,) = tier.hits(self.policy)
            tier_runs.append(hits - tier_hits)
            tier_hits = hits
            if pace is not None and index % PACE_EVERY == 0:
                pace()
        progress = None if pace is None else lambda _done: pace()
        optimum_runs = offline_runs(requests, self.capacity, progress)
        if sum(optimum_runs) < tier_hits:
            optimum_runs = tier_runs
        refs = sum(map(len, requests))
        partial = WindowResult(
            self.policy,
            self.capacity,
            self.rate,
            refs,
            block_refs,
            sum(optimum_runs),
            tier_hits,
            0.0,
            None,
        )
        efficiency = partial.efficiency
        error = None
        if efficiency is not None:
            expected = self.rate * block_refs
            error = quotient_error(
                _misses(requests, tier_runs),
                _misses(requests, optimum_runs),
                efficiency,
                self.rate,
                partial.optimum_hits + expected - refs,
            )
        return replace(partial, seconds=time.thread_time() - start, efficiency_error=error)


def _misses(requests: Sequence[Sequence[BlockHash]], runs: Sequence[int]) -> Counter[BlockHash]:
    """Each block's misses over ``requests``, of which each hit its first ``runs`` blocks."""
    misses: Counter[BlockHash] = Counter()
    for sampled, run in zip(requests, runs, strict=True):
        misses.update(sampled[run:])
    return misses
