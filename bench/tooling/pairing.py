"""Two sides of a benchmark timed against each other, and how far their difference is known.

A difference of a few percent between two replays is smaller than what a
shared host moves a whole run by, so the two sides are never timed in runs of
their own: the trace is cut into chunks and each chunk is replayed by both
sides back to back, the side that leads alternating from chunk to chunk. A
noisy neighbour, a frequency change or a page-cache hiccup lasts far longer
than a chunk and so lands on both sides alike.

Which side runs first on a chunk still matters: the side that ran the chunk
before it runs its own second chunk in a row with its own state in the
caches, and the other comes to that chunk cold, so within one round the even
chunks favour one side and the odd chunks the other, which cancels only as
far as even and odd chunks weigh alike. ``abba_pairs`` runs rounds in pairs,
the on side leading the first chunk in one round of a pair and the off side
in the other (A B B A), so over a pair every chunk runs in each order once
and the order's effect cancels within each pair, not only on average.

Each pair gives one paired difference; their median and an interval for it
(``median_interval``) say whether a difference is resolved: two figures whose
intervals overlap were not told apart.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from math import comb

from offload.base import BlockHash

Side = Callable[[Sequence[Sequence[BlockHash]]], None]
"""One side of a pair: replays a chunk of requests."""

Clock = Callable[[], float]
"""Seconds from an arbitrary start."""

Round = tuple[float, float]
"""Seconds of the off and the on side over one round."""


def paired_round(
    requests: Sequence[Sequence[BlockHash]],
    chunk: int,
    off: Side,
    on: Side,
    *,
    clock: Clock = time.perf_counter,
    on_leads: bool = True,
) -> Round:
    """Seconds spent by each side over the whole trace, chunk by chunk, order alternating.

    ``on_leads`` says which side runs the first chunk first. ``clock`` is wall
    time unless the caller chooses otherwise: a side whose cost lies partly in
    other threads (a publisher's I/O) needs wall time, while one whose work is
    all on the calling thread is timed more steadily by that thread's CPU time
    (``time.thread_time``), which leaves out the time the thread waits while
    the host runs something else.
    """
    seconds = {off: 0.0, on: 0.0}
    for index, start in enumerate(range(0, len(requests), chunk)):
        part = requests[start : start + chunk]
        for side in (on, off) if (index % 2 == 0) == on_leads else (off, on):
            began = clock()
            side(part)
            seconds[side] += clock() - began
    return seconds[off], seconds[on]


def abba_pairs(pairs: int, run_round: Callable[[bool], Round]) -> list[tuple[Round, Round]]:
    """``pairs`` pairs of rounds (A B B A): in each, the round the on side led, then the other.

    ``run_round(on_leads)`` replays the whole trace once with fresh sides
    (``paired_round``). A round run first and discarded warms the caches and
    the allocator. Each round starts with a full garbage collection: the
    previous round's sides are garbage by then, and the full collection they
    would otherwise trigger inside a round, far longer than a chunk, would
    land on one side alone.
    """
    gc.collect()
    run_round(True)
    done = []
    for _ in range(pairs):
        gc.collect()
        on_led = run_round(True)
        gc.collect()
        done.append((on_led, run_round(False)))
    return done


def pair_difference(pair: tuple[Round, Round]) -> float:
    """A pair's on side less its off side, per round: the order's effect cancelled."""
    (off_a, on_a), (off_b, on_b) = pair
    return (on_a + on_b - off_a - off_b) / 2


def pair_ratio(pair: tuple[Round, Round]) -> float:
    """A pair's on side over its off side."""
    (off_a, on_a), (off_b, on_b) = pair
    return (on_a + on_b) / (off_a + off_b)


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The narrowest pair of order statistics that holds the true median at ``confidence``.

    The count of values below the median is binomial (n, 1/2) whatever the
    values' distribution, so the k-th smallest and k-th largest values bound
    it with probability 1 - 2 P(B < k): no bootstrap's resampling, and no
    assumption that differences are normal, which a host's stalls are not.
    With too few values for ``confidence`` (fewer than 6 at 0.95) the interval
    is the whole range, which then holds the median with less.
    """
    ordered = sorted(values)
    n = len(ordered)
    k = 1
    while k < n // 2 and _below(n, k + 1) <= (1 - confidence) / 2:
        k += 1
    return ordered[k - 1], ordered[n - k]


def _below(n: int, k: int) -> float:
    """P(B < k) for B binomial (n, 1/2): the chance that fewer than k values lie below the
    median."""
    return sum(comb(n, i) for i in range(k)) / 2**n
