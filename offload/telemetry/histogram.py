"""A histogram cheap enough for the hot path: a bisect and two additions.

prometheus-client's Histogram.observe() takes a lock; this one records into
plain lists that the collector reads at scrape time, so recording never
contends with exporting.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

DURATION_BUCKETS_S: tuple[float, ...] = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
"""Microseconds (a manager call) to seconds (a large transfer batch)."""

SIZE_BUCKETS_BYTES: tuple[float, ...] = tuple(float(1 << shift) for shift in range(16, 33, 2))
"""64 KiB (one small block) to 4 GiB (a thousand 4 MiB blocks), by powers of 4."""


class Histogram:
    """Counts per bucket (not cumulative) and the sum of the observations.

    Upper bounds are inclusive, as in Prometheus; values above the last bound
    land in the implicit +Inf bucket. The count of observations is the total
    of the buckets, not a counter of its own, so no reading can disagree
    with them.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram bounds must be strictly increasing, got {bounds!r}")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        """Counts at or below each bound, then the total (the +Inf bucket).

        Taken from one copy of the buckets, made in a single C call, so a
        reader on another thread (a scrape) gets buckets that agree with
        their total while observe() goes on.
        """
        return list(accumulate(self.counts[:]))
