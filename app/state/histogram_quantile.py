"""Quantiles of what a cumulative histogram observed between two of its snapshots.

A worker ships its histograms as running totals (Prometheus-style cumulative
buckets), so a quantile of "the last interval" is a quantile of the
difference of two snapshots. It is estimated the way Prometheus'
``histogram_quantile`` does, so the page and a PromQL query over the same
interval agree: linear interpolation inside the bucket that holds the rank,
the lower bound of the top (``+Inf``) bucket when the rank falls there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from offload.wire.stats_frame import HistogramSnapshot


def increase(before: HistogramSnapshot | None, after: HistogramSnapshot) -> list[int] | None:
    """Cumulative bucket counts observed from ``before`` to ``after``.

    None when nothing can be said: the bucket bounds changed or a count went
    down (the worker restarted between the two), or nothing was observed.
    """
    if before is None:
        counts = list(after.counts)
    elif before.buckets != after.buckets:
        return None
    else:
        counts = [now - then for now, then in zip(after.counts, before.counts, strict=True)]
        if any(count < 0 for count in counts):
            return None
    return counts if counts and counts[-1] > 0 else None


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float:
    """The q-quantile (0 <= q <= 1) of observations in cumulative ``counts`` over ``bounds``.

    ``bounds`` ascend and end with ``math.inf``; ``counts[-1]`` is the total,
    which must be positive (``increase`` returns None otherwise).
    """
    rank = q * counts[-1]
    below, lower = 0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank and cumulative > below:
            if math.isinf(bound):
                return lower
            share = (rank - below) / (cumulative - below)
            # A mean of the bounds, weighted: their difference may pass the largest float.
            return lower * (1 - share) + bound * share
        below, lower = cumulative, bound
    return lower
