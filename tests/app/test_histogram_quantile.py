"""Transfer-latency quantiles of an interval, from two cumulative histogram snapshots."""

from __future__ import annotations

import math
import random
import sys

import pytest

from app.state.histogram_quantile import increase, quantile
from app.state.worker_stats import WorkerStats
from offload.telemetry import metrics as m
from offload.telemetry.histogram import Histogram
from offload.transfer.transfer_stats import DURATION_BUCKETS_S
from offload.wire.stats_frame import HistogramSnapshot, StatsFrame, WorkerConfig


def _frame(ts: float, **by_direction: Histogram) -> StatsFrame:
    snapshot = m.Snapshot()
    for direction, histogram in by_direction.items():
        snapshot.add_histogram(m.TRANSFER_DURATION_SECONDS, histogram, direction=direction)
    return StatsFrame(
        ts=ts,
        engine_id="e0",
        rank=0,
        config=WorkerConfig(policy="lru", capacity_blocks=8, block_size=16),
        histograms=snapshot.histograms,
    )


def test_interpolates_inside_the_bucket_like_prometheus() -> None:
    bounds = [0.1, 0.2, float("inf")]
    assert quantile(0.5, bounds, [10, 20, 20]) == pytest.approx(0.1)
    assert quantile(0.99, bounds, [10, 20, 20]) == pytest.approx(0.198)
    assert quantile(0.5, bounds, [0, 0, 4]) == 0.2  # in the +Inf bucket: its lower bound


def test_a_quantile_lies_in_the_bucket_of_the_true_one() -> None:
    histogram = Histogram(DURATION_BUCKETS_S)
    values = sorted(random.Random(7).lognormvariate(-7, 1.5) for _ in range(5000))
    for value in values:
        histogram.observe(value)
    bounds = [*histogram.bounds, float("inf")]
    for q in (0.5, 0.9, 0.99):
        true = values[int(q * len(values)) - 1]
        at = next(i for i, bound in enumerate(bounds) if true <= bound)
        lower = bounds[at - 1] if at else 0.0
        assert lower <= quantile(q, bounds, histogram.cumulative()) <= bounds[at]


def test_only_what_was_observed_between_two_frames_counts() -> None:
    fast, slow = Histogram(DURATION_BUCKETS_S), Histogram(DURATION_BUCKETS_S)
    for _ in range(100):
        fast.observe(1e-4)
    first = _frame(1.0, gpu_to_cpu=fast)
    for _ in range(100):
        fast.observe(0.5)  # the second interval is slow, the first was fast
    stats = WorkerStats.between(first, _frame(2.0, gpu_to_cpu=fast, cpu_to_gpu=slow))
    assert set(stats.transfer_latency_s) == {("gpu_to_cpu", "0.5"), ("gpu_to_cpu", "0.99")}
    assert stats.transfer_latency_s["gpu_to_cpu", "0.5"] > 0.1  # not the fast jobs before
    assert WorkerStats.between(None, first).transfer_latency_s == {}  # no interval yet


def test_a_restart_or_new_buckets_give_no_quantile() -> None:
    before, after = Histogram(DURATION_BUCKETS_S), Histogram(DURATION_BUCKETS_S)
    for _ in range(5):
        before.observe(0.01)
    after.observe(0.01)  # fewer than before: the worker restarted
    older, newer = (_frame(t, gpu_to_cpu=h).histograms[0] for t, h in ((1, before), (2, after)))
    assert increase(older, newer) is None
    assert increase(newer, newer) is None  # nothing observed in between
    other = _frame(3, gpu_to_cpu=Histogram([0.5, 1.0])).histograms[0]
    assert increase(older, other) is None


def test_bounds_as_far_apart_as_floats_go_give_a_quantile_inside_the_bucket() -> None:
    # A worker's bounds are any finite ascending floats: the width of a bucket from the
    # lowest to the highest passes the largest float, and a quantile interpolated across it
    # was infinite, a latency the history then kept and the API showed as no sample (null).
    most = sys.float_info.max
    bounds = [-most, most, float("inf")]
    for q in (0.5, 0.99):
        assert -most <= quantile(q, bounds, [1, 3, 3]) <= most, q
    before, after = (
        HistogramSnapshot(
            name=m.TRANSFER_DURATION_SECONDS.name,
            labels={"direction": "gpu_to_cpu"},
            buckets=bounds,
            counts=[0, count, count],
            sum=0.0,
            count=count,
        )
        for count in (1, 3)
    )
    config = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)
    first, second = (
        StatsFrame(ts=ts, engine_id="e0", rank=0, config=config, histograms=[histogram])
        for ts, histogram in ((1.0, before), (2.0, after))
    )
    latency = WorkerStats.between(first, second).transfer_latency_s
    assert latency and all(math.isfinite(seconds) for seconds in latency.values()), latency
