"""The sidecar's history: bounded memory, exact down-sampling, the route's schema, real ingest.

Samples carry their own timestamps (a fake clock), so nothing here depends on
how fast the machine is; the end-to-end test polls the ingest thread's history
for up to 15 s and asserts only on what arrived.
"""

from __future__ import annotations

import sys
import time
import tracemalloc

import httpx
import pytest

from app.api import create_app
from app.ingest import Ingestor
from app.settings import PublisherEndpoints, SidecarSettings
from app.state.history import DEFAULT_MAX_LABEL_SETS, History, Reading, SeriesKey, TierSpec
from app.state.sidecar import SidecarState
from app.state.worker_stats import WorkerStats
from offload.base import OffloadingEvent
from offload.telemetry import metrics as m
from offload.telemetry.histogram import Histogram
from offload.transfer.transfer_stats import DURATION_BUCKETS_S
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import HistogramSnapshot, StatsFrame, WorkerConfig
from tests.app.test_ingest import connected, stored
from tests.support.http_app import AUTH, LISTEN, TOKEN, in_process, serving, sidecar_app
from tests.support.polling import WAIT_S, wait_for, wait_until

pytestmark = pytest.mark.timeout(120)

OCCUPANCY = SeriesKey("p", "blocks", (("medium", "CPU"),))
LOADS = SeriesKey("p", "loads")


def gauge(value: float, key: SeriesKey = OCCUPANCY) -> Reading:
    return Reading(key, "gauge", value)


def counter(value: float, key: SeriesKey = LOADS) -> Reading:
    return Reading(key, "counter", value)


def test_points_and_memory_stay_bounded_over_a_long_run() -> None:
    tiers = (TierSpec(1, 60), TierSpec(10, 36))
    history = History(max_series=50, tiers=tiers, max_label_sets=60)
    assert history.max_bytes == 8 * 51 * 96
    tracemalloc.start()
    try:
        for second in range(20_000):  # far past both retentions
            readings = [gauge(second % 7, SeriesKey("p", "g", (("i", str(i)),))) for i in range(60)]
            history.add(float(second), readings)
            if second == 1000:
                settled, _ = tracemalloc.get_traced_memory()
        grown = tracemalloc.get_traced_memory()[0] - settled
    finally:
        tracemalloc.stop()
    assert history.series == 50
    assert history.refused == 10 * 20_000
    assert history.bytes == history.max_bytes
    fine = history.window(0, 1)
    coarse = history.window(0, 10)
    assert len(fine.times) == 60 and len(coarse.times) == 36
    assert fine.times == [float(s) for s in range(19_939, 19_999)]
    assert coarse.times == [float(s) for s in range(19_630, 19_990, 10)]
    assert all(len(values) == 60 for _, _, values in fine.series)
    assert grown < 64 * 1024  # the rings were full at 1,000 s: nothing grows after


@pytest.mark.parametrize(("max_media", "kept"), [(2, DEFAULT_MAX_LABEL_SETS), (40, 40)])
def test_a_publishers_metric_keeps_a_series_per_medium_and_never_fewer_than_the_default(
    max_media: int, kept: int
) -> None:
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"], max_media=max_media)
    history = SidecarState.from_settings(settings).history
    media = [gauge(1.0, SeriesKey("p", "blocks", (("medium", f"m{i}"),))) for i in range(50)]
    history.add(0.0, media)
    assert (history.series, history.refused) == (kept, 50 - kept)


def test_gauges_average_and_counters_keep_the_last_value() -> None:
    history = History(tiers=(TierSpec(1, 100), TierSpec(10, 100)))
    for second in range(25):
        readings = [gauge(second), counter(second * second)]
        if second >= 12:
            readings = readings[1:]  # the gauge stops: no value, not zero
        history.add(100.0 + second + 0.5, readings)
    coarse = history.window(0, 10)
    assert coarse.times == [100.0, 110.0]  # 120 is still being filled
    by_key = {key: (kind, values) for key, kind, values in coarse.series}
    assert by_key[OCCUPANCY] == ("gauge", [4.5, 10.5])  # mean of 0..9, of 10 and 11
    assert by_key[LOADS] == ("counter", [81.0, 361.0])  # 9², 19²
    fine = history.window(110.0, 1)
    assert fine.times == [float(s) for s in range(110, 124)]
    fine_by_key = {key: values for key, _, values in fine.series}
    assert fine_by_key[OCCUPANCY] == [10.0, 11.0] + [None] * 12
    assert fine_by_key[LOADS] == [float(s * s) for s in range(10, 24)]


def test_two_samples_in_one_bucket_and_a_clock_that_goes_back() -> None:
    history = History(tiers=(TierSpec(1, 10),))
    history.add(5.1, [gauge(1), counter(1)])
    history.add(5.9, [gauge(3), counter(2)])
    history.add(4.0, [gauge(100), counter(100)])  # went back: dropped
    history.add(6.0, [gauge(0)])
    history.add(7.0, [])
    window = history.window(0)
    assert window.times == [5.0, 6.0]
    values = {key: v for key, _, v in window.series}
    assert values == {OCCUPANCY: [2.0, 0.0], LOADS: [2.0, None]}


def test_the_finest_tier_that_holds_since_is_chosen() -> None:
    history = History(tiers=(TierSpec(1, 5), TierSpec(10, 10)))
    for second in range(30):
        history.add(float(second), [gauge(1.0)])
    assert history.window(26).resolution_s == 1
    assert history.window(0).resolution_s == 10  # the 1 s ring lost second 0
    with pytest.raises(ValueError, match="offered: 1, 10"):
        history.window(0, 5)


def test_the_route_serves_the_history_behind_the_token() -> None:
    app, state = sidecar_app(token=TOKEN)
    for second in range(3):
        state.history.add(1000.0 + second, [gauge(2.0 * second), counter(second)])
    with in_process(app) as http:
        assert http.get("/api/v1/history").status_code == 401
        body = http.get("/api/v1/history", headers=AUTH, params={"since": 1001}).json()
        assert body == {
            "resolution_s": 1,
            "resolutions_s": [1, 10],
            "retention_s": [900, 21_600],
            "times": [1001.0],
            "series": [
                {
                    "publisher": "p",
                    "metric": "blocks",
                    "labels": {"medium": "CPU"},
                    "kind": "gauge",
                    "values": [2.0],
                },
                {
                    "publisher": "p",
                    "metric": "loads",
                    "labels": {},
                    "kind": "counter",
                    "values": [1.0],
                },
            ],
            "max_series": 512,
            "refused": 0,
        }
        other = http.get("/api/v1/history", headers=AUTH, params={"publisher": "q"}).json()
        assert other["series"] == [] and len(other["times"]) == 2
        bad = http.get("/api/v1/history", headers=AUTH, params={"resolution": 3})
        assert (bad.status_code, bad.json()) == (
            422,
            {
                "detail": [
                    {
                        "type": "enum",
                        "loc": ["query", "resolution"],
                        "msg": "Input should be one of the resolutions kept, in seconds: 1, 10",
                        "input": 3,
                        "ctx": {"expected": "1, 10"},
                    }
                ]
            },
        )
        huge = http.get("/api/v1/history", headers=AUTH, params={"resolution": "9" * 4300})
        assert huge.status_code == 400 and "more than 20" in huge.json()["detail"][0]["msg"]
        assert len(huge.text) < 600, "the 400 echoed the whole resolution"
        for since in ("nan", "inf", "-inf"):  # answered with no points before
            refused = http.get("/api/v1/history", headers=AUTH, params={"since": since})
            assert refused.status_code == 400, since  # no number in its form
            assert refused.json()["detail"][0]["loc"] == ["query", "since"]
        refused = http.get("/api/v1/history", headers=AUTH, params={"since": "1e400"})
        assert refused.status_code == 422  # in its form, but past any double: not finite
        assert refused.json()["detail"][0]["loc"] == ["query", "since"]
        schema = http.get("/openapi.json", headers=AUTH).json()
        ok = schema["paths"]["/api/v1/history"]["get"]["responses"]["200"]
        assert ok["content"]["application/json"]["schema"]["$ref"].endswith("/HistoryResponse")
        metrics = http.get("/metrics", headers=AUTH).text
        assert f"kvscope_sidecar_history_bytes {8.0 * 3 * 2}" in metrics  # 2 points, 1 + 2 rings


def test_history_fills_from_a_real_ingest() -> None:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        settings = SidecarSettings(connect=[publisher.endpoint], token=TOKEN)
        state = SidecarState.from_settings(settings)
        heard = state.publishers[publisher.endpoint]
        ingestor = Ingestor(state)
        ingestor.start()
        try:
            transfers = Histogram(DURATION_BUCKETS_S)

            def probe() -> bool:  # ZMQ's slow joiner: frames before the subscription are lost
                transfers.observe(0.002)  # a job between every two frames: a latency each time
                publisher.publish_stats(_frame(loads=7, transfers=transfers))
                return heard.stats_frames > 1

            wait_until(probe, "the sidecar receives the publisher")
            publisher.publish_events([OffloadingEvent([1, 2, 3], 16, "CPU", False)])
            wait_until(lambda: state.event_log.last_id == 1, "the stores are ingested")

            def sampled() -> bool:  # a 1 s point closes once a sample falls past it
                kept = {k.metric for k, _, _ in state.history.window(0, 1, heard.name).series}
                wanted = {"loads", "blocks", "dead_write_blocks", "miss_blocks"}
                wanted.add("transfer_latency_s")
                return wanted <= kept

            wait_until(sampled, "the ingest thread samples the history")
        finally:
            ingestor.close()
    with in_process(create_app(settings, state)) as http:
        body = http.get("/api/v1/history", headers=AUTH, params={"resolution": 1}).json()
    series = {(s["publisher"], s["metric"], tuple(s["labels"].values())): s for s in body["series"]}
    loads = series[heard.name, "loads", ()]
    assert loads["kind"] == "counter" and 7.0 in loads["values"]
    assert 3.0 in series[heard.name, "blocks", ("CPU",)]["values"]
    assert 5.0 in series[heard.name, "miss_blocks", ("evicted",)]["values"]
    median = series[heard.name, "transfer_latency_s", ("gpu_to_cpu", "0.5")]
    assert median["kind"] == "gauge"
    assert any(v is not None and 0.001 <= v <= 0.0025 for v in median["values"])
    assert (None, "events", ()) in series
    assert len(body["times"]) == len(loads["values"])


NOT_COUNTS = {"last_seq", "rank", "capacity_blocks", "block_size", "publishers", "connections"}
"""Whole numbers /api/v1/stats shows that are no count: a sequence number, the worker's
identity and configuration, and the listen socket's levels (and ``max_*``, its caps)."""


Counts = dict[tuple[str | None, str, tuple[str, ...]], float | None]
"""Values by series: (publisher, metric, label values)."""


def stats_counts(stats: dict) -> Counts:
    """Every count /api/v1/stats shows, as the (publisher, metric, label values) of the history
    series that should keep it."""
    counts: Counts = {}
    for publisher in stats["publishers"]:
        for field, value in publisher.items():
            if field == "replays":
                for outcome, count in value.items():
                    counts[publisher["name"], "replays", (outcome,)] = count
            elif type(value) is int and field not in NOT_COUNTS:
                metric = "dropped_frames" if field == "dropped" else field
                counts[publisher["name"], metric, ()] = value
    for field, value in (stats["listener"] or {}).items():
        if type(value) is int and field not in NOT_COUNTS and not field.startswith("max_"):
            counts[None, f"listener_{field}", ()] = value
    return counts


def test_the_history_keeps_every_count_the_stats_show() -> None:
    """Each count of a publisher and of the listen socket that /api/v1/stats shows has a
    series in /api/v1/history that comes to the same value (``family_changes``, ``replayed``
    and the replays by outcome were shown there, and on /metrics, and kept in none)."""
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        for sent, hashes in enumerate(((1, 2), (3,)), 1):  # before the sidecar: replayed
            publisher.publish_events([stored(*hashes)])
            wait_until(lambda sent=sent: publisher.batches_published == sent, "a batch sent")
        endpoints = PublisherEndpoints(publisher.endpoint, publisher.replay_endpoint)
        settings = SidecarSettings(
            connect=[endpoints.endpoint], replay=[endpoints.replay_endpoint], listen=[LISTEN],
            token=TOKEN,
        )  # fmt: skip
        state = SidecarState.from_settings(settings)
        ingestor = Ingestor(state)
        ingestor.start()
        try:
            connected(ingestor, publisher)
            publisher.publish_events([stored(4)])
            heard = state.publishers[publisher.endpoint]
            wait_until(lambda: heard.replays["complete"] == 1, "the replay is applied")
            with (
                serving(create_app(settings, state)) as url,
                httpx.Client(base_url=url, headers=AUTH, timeout=WAIT_S) as http,
            ):

                def read() -> tuple[Counts, Counts]:
                    """The stats' counts, and the latest point of each history counter."""
                    stats = stats_counts(http.get("/api/v1/stats").json())
                    history = http.get("/api/v1/history", params={"resolution": 1}).json()
                    return stats, {
                        (s["publisher"], s["metric"], tuple(s["labels"].values())): next(
                            (v for v in reversed(s["values"]) if v is not None), None
                        )
                        for s in history["series"]
                        if s["kind"] == "counter"
                    }

                # nothing is published now: the history's latest points come to the stats'
                stats, history = wait_for(
                    read, lambda got: all(got[1].get(k) == v for k, v in got[0].items()),
                    "the history keeps every count the stats show",
                )  # fmt: skip
        finally:
            ingestor.close()
    assert (
        stats[heard.name, "replayed", ()] == 2 and stats[heard.name, "replays", ("complete",)] == 1
    )
    assert (heard.name, "family_changes", ()) in history
    assert (None, "listener_stream_move_resets", ()) in history


def _frame(loads: int, transfers: Histogram) -> StatsFrame:
    snapshot = m.Snapshot()
    snapshot.add(m.LOAD_BLOCKS_TOTAL, loads, medium="CPU")
    snapshot.add(m.DEAD_WRITE_BLOCKS_TOTAL, 2, medium="CPU", policy="lru")
    snapshot.add(m.LOOKUP_MISS_BLOCKS_TOTAL, 5, medium="CPU", reason="evicted")
    snapshot.add_histogram(m.TRANSFER_DURATION_SECONDS, transfers, direction="gpu_to_cpu")
    return StatsFrame(
        ts=time.time(),
        engine_id="e0",
        rank=0,
        config=WorkerConfig(policy="lru", capacity_blocks=8, block_size=16),
        counters=snapshot.counters,
        histograms=snapshot.histograms,
    )


def test_a_workers_latency_quantile_past_any_latency_is_left_out_not_kept_as_no_sample() -> None:
    # A worker's bucket bounds are any finite floats; a quantile near the largest float
    # stood in the history, where the mean of two of them in one point passed it: a point
    # kept as infinite, which the API showed as no sample (null).
    most = sys.float_info.max
    frames = [
        StatsFrame(
            ts=ts,
            engine_id="e0",
            rank=0,
            config=WorkerConfig(policy="lru", capacity_blocks=8, block_size=16),
            histograms=[
                HistogramSnapshot(
                    name=m.TRANSFER_DURATION_SECONDS.name,
                    labels={"direction": "gpu_to_cpu"},
                    buckets=[most / 2, most, float("inf")],
                    counts=[0, count, count],
                    sum=0.0,
                    count=count,
                )
            ],
        )
        for ts, count in ((1.0, 1), (2.0, 3))
    ]
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"])
    state = SidecarState.from_settings(settings)
    publisher = state.publishers["tcp://127.0.0.1:1"]
    publisher.worker = WorkerStats.between(*frames)
    for at in (100.2, 100.6, 101.5):  # two samples in the point of second 100
        state.sample_history(at)
    window = state.history.window(0, 1)
    latency = [values for key, _, values in window.series if key.metric == "transfer_latency_s"]
    assert latency == []  # no series of a number no transfer takes
