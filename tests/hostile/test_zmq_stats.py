"""Stats frames and topics a peer gets wrong are refused and counted (issue 15, item 10).

A frame with NaN or infinite counters, or a negative ``bytes_per_block``,
made /api/v1/stats fail until a good frame came, uncounted; NaN and
infinite timestamps were served as null; a counter named like one of the
sidecar's own metrics printed a family twice and failed the whole scrape;
and in connect mode any topic was applied as KV (the default KV topic, b"",
matches every topic by prefix). Each frame goes over real sockets; the test
then checks the frame was refused and counted and the previous one kept.
"""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from app.decode import decode_stats_payload
from app.settings import IngestConfig, SidecarSettings
from offload.base import OffloadingEvent
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import Snapshot
from offload.wire.stats_frame import HistogramSnapshot, Sample
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, ingesting, kv_payload, wait_connected

pytestmark = pytest.mark.timeout(120)

STATS = b"kvscope.stats"


def frame(**changes: object) -> dict:
    """A stats frame as a peer may write it: plain msgpack, so any value can be sent."""
    base = {
        "version": 1, "ts": 2.0, "engine_id": "e0", "rank": 0,
        "config": {"policy": "lru", "capacity_blocks": 8, "block_size": 16,
                   "bytes_per_block": 4096},
        "counters": [{"name": "kvscope_lookups_total", "labels": {"medium": "CPU"}, "value": 1.0}],
        "gauges": [], "histograms": [],
    }  # fmt: skip
    for key, value in changes.items():
        if key in base["config"]:
            base["config"][key] = value
        else:
            base[key] = value
    return base


def counter(name: str, value: float, **labels: str) -> dict:
    return {"name": name, "labels": labels, "value": value}


BAD_FRAMES = {
    "a NaN counter": frame(counters=[counter("kvscope_lookups_total", math.nan, medium="CPU")]),
    "an infinite counter": frame(counters=[counter("kvscope_lookups_total", math.inf, medium="C")]),
    "a negative counter": frame(counters=[counter("kvscope_lookups_total", -1.0, medium="CPU")]),
    "a NaN ts": frame(ts=math.nan),
    "an infinite ts": frame(ts=math.inf),
    "a negative bytes_per_block": frame(bytes_per_block=-4096),
    "a negative capacity": frame(capacity_blocks=-1),
    "a sidecar metric's name": frame(counters=[counter("kvscope_sidecar_frames_total", 1.0)]),
    "a known metric with other labels": frame(
        counters=[counter("kvscope_lookups_total", 1.0, medium="CPU", other="x")]
    ),
    "a known counter sent as a gauge": frame(
        gauges=[counter("kvscope_lookups_total", 1.0, medium="CPU")]
    ),
    "a label the reader adds": frame(counters=[counter("x_total", 1.0, publisher="p")]),
    "one family with two label sets": frame(
        counters=[counter("x_total", 1.0, a="1"), counter("x_total", 1.0, b="1")]
    ),
    "a counter and a gauge printing one series": frame(
        counters=[counter("y_total", 1.0)], gauges=[counter("y_total", 1.0)]
    ),
    "one series twice": frame(counters=[counter("z_total", 1.0), counter("z_total", 2.0)]),
    "a metric name Prometheus refuses": frame(counters=[counter("a b", 1.0)]),
    "a megabyte engine id": frame(engine_id="e" * 2**20),
    "an engine id with a newline": frame(engine_id="e0\n"),
    "a label value with a newline": frame(counters=[counter("w_total", 1.0, k="v\n")]),
    "a 64-bit rank": frame(rank=2**40),
    "histograms printing their long labels on every bucket's line": frame(
        histograms=[
            {
                "name": f"h{number}",
                "labels": {f"label{k}": "v" * 128 for k in range(16)},
                "buckets": [*map(float, range(255)), math.inf],
                "counts": [0] * 256,
                "sum": 0.0,
                "count": 0,
            }
            for number in range(2)  # 10 KB on the wire, over 1 MiB printed
        ]
    ),
    "a histogram with a NaN bound": frame(
        histograms=[
            {
                "name": "h",
                "labels": {},
                "buckets": [math.nan, math.inf],
                "counts": [0, 0],
                "sum": 0.0,
                "count": 0,
            }
        ]
    ),
}


@pytest.mark.parametrize("payload", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
def test_a_bad_stats_frame_is_refused_counted_and_the_previous_one_kept(payload: dict) -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            good = state.stats
            raw.pub.send_multipart([STATS, b"\0" * 8, msgspec.msgpack.encode(payload)])
            wait_until(lambda: state.malformed == 1, "the frame is counted as malformed")
            assert state.stats == good  # a probe's, equal to the first
            assert state.worker is not None
    finally:
        raw.close()


def test_a_frame_of_another_topic_is_not_applied_as_kv_in_connect_mode() -> None:
    raw = RawPublisher()
    try:
        with ingesting(raw.endpoints) as ingestor:
            state = wait_connected(raw, ingestor)
            batch = kv_payload(OffloadingEvent([7], 16, "CPU", False))
            raw.pub.send_multipart([b"other-topic", (0).to_bytes(8, "big"), batch])
            raw.send(0, kv_payload(OffloadingEvent([8], 16, "CPU", False)))
            wait_until(lambda: state.last_seq == 0, "the KV frame applied")
            assert state.malformed == 1
            with ingestor.state.lock:
                assert ingestor.state.index.get(7) is None
                assert ingestor.state.index.get(8) is not None
    finally:
        raw.close()


def test_the_topics_are_settings_and_a_custom_stats_topic_is_read(monkeypatch) -> None:
    monkeypatch.setenv("KVSCOPE_STATS_TOPIC", "worker.stats")
    monkeypatch.setenv("KVSCOPE_KV_TOPIC", "kv-events")
    config = SidecarSettings(connect=["tcp://127.0.0.1:1"]).ingest_config()
    assert (config.kv_topic, config.stats_topic) == (b"kv-events", b"worker.stats")
    raw = RawPublisher(topic=b"kv-events")
    try:
        with ingesting(raw.endpoints, config=config) as ingestor:
            state = wait_connected(raw, ingestor, stats_topic=b"worker.stats")
            raw.send(0, kv_payload(OffloadingEvent([9], 16, "CPU", False)))
            wait_until(lambda: state.last_seq == 0, "the KV frame applied")
            assert state.malformed == 0
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("env", "complaint"),
    [
        ({"KVSCOPE_STATS_TOPIC": "kv"}, "must differ"),
        ({"KVSCOPE_KV_TOPIC": "a b"}, "not a topic"),
        ({"KVSCOPE_STATS_TOPIC": ""}, "at least 1"),
    ],
)
def test_bad_topic_settings_are_refused_by_name(monkeypatch, env: dict, complaint: str) -> None:
    monkeypatch.setenv("KVSCOPE_KV_TOPIC", "kv")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=complaint):
        SidecarSettings(connect=["tcp://127.0.0.1:1"])


class _Sidecar(Collector):
    """Stands for the sidecar's own families: some of its names, as app/api/metrics.py prints."""

    def collect(self):
        yield CounterMetricFamily("kvscope_sidecar_frames_total", "Frames.", value=1)
        yield GaugeMetricFamily("process_open_fds", "Descriptors.", value=1)
        yield CounterMetricFamily("python_gc_collections", "Collections.", value=1)


SIDECAR_NAMES = {"process_open_fds", "python_gc_collections", "python_gc_collections_total"}
"""Names the sidecar prints beside the workers' families that frames may use (its process's
families), as app/api/metrics.py reserves them."""

names = st.sampled_from(
    ["x", "x_total", "x_count", "x_sum", "x_bucket", "y", "kvscope_lookups_total",
     "kvscope_sidecar_frames_total", "kvscope_sidecar_frames", "process_open_fds",
     "python_gc_collections"]
)  # fmt: skip
labels = st.dictionaries(st.sampled_from(["medium", "a", "le", "engine"]), st.just("v"), max_size=2)
sample = st.fixed_dictionaries({"name": names, "labels": labels, "value": st.floats(0, 10)})
histogram = st.fixed_dictionaries(
    {"name": names, "labels": labels, "buckets": st.just([1.0, math.inf]),
     "counts": st.just([0, 1]), "sum": st.just(1.0), "count": st.just(1)}
)  # fmt: skip


frames = st.fixed_dictionaries(
    {"counters": st.lists(sample, max_size=4), "gauges": st.lists(sample, max_size=3),
     "histograms": st.lists(histogram, max_size=2)}
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames, min_size=1, max_size=2))
def test_every_frame_accepted_prints_a_valid_exposition_beside_the_sidecar(
    parts: list[dict],
) -> None:
    """Whatever names the frames of one or two publishers use, accepted frames never print
    a family or a series twice, nor one the sidecar prints."""
    snapshots = []
    for number, part in enumerate(parts):
        payload = msgspec.msgpack.encode(frame(**part))
        try:
            accepted = decode_stats_payload(payload)
        except ValueError:
            continue
        snapshot = Snapshot(accepted.counters, accepted.gauges, accepted.histograms)
        snapshots.append((snapshot, {"publisher": f"p{number}", "engine": "e0", "rank": "0"}))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshots, reserved=SIDECAR_NAMES))
    registry.register(_Sidecar())
    text = generate_latest(registry).decode()
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps)), text
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(series)), text


def test_ingest_config_defaults_match_the_settings_defaults() -> None:
    settings_config = SidecarSettings(connect=["tcp://127.0.0.1:1"]).ingest_config()
    assert settings_config == IngestConfig()


def test_publishers_that_disagree_about_a_metric_leave_the_exposition_valid() -> None:
    """The first publisher's type and labels shape the family; the other's samples are left out.

    Built from the second publisher's histogram, the family took the first's
    counter values as buckets and the scrape failed; with other labels, the
    samples were silently mislabelled.
    """
    first = Snapshot(counters=[Sample(name="x_new_total", labels={"a": "1"}, value=3.0)])
    as_histogram = HistogramSnapshot(
        name="x_new_total", buckets=[1.0, math.inf], counts=[1, 2], sum=3.0, count=2
    )
    as_other_labels = Sample(name="x_new_total", labels={"b": "2"}, value=5.0)
    second = Snapshot(counters=[as_other_labels], histograms=[as_histogram])
    collector = SnapshotCollector(
        lambda: [(first, {"publisher": "p1"}), (second, {"publisher": "p2"})]
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    (family,) = text_string_to_metric_families(text)
    assert family.type == "counter"
    assert [(s.labels, s.value) for s in family.samples if s.name == "x_new_total"] == [
        ({"a": "1", "publisher": "p1"}, 3.0)
    ]
    assert collector.conflicting_samples == 2


def test_a_worker_naming_hundreds_of_reasons_leaves_the_history_room_for_the_others() -> None:
    """A worker names the label values of its reasons and directions, and the history keeps
    each series it meets for good, up to its cap: one stats frame of 600 eviction reasons
    took all 512 series, and a publisher that stored its first blocks afterwards had none."""
    hostile, honest = RawPublisher(), RawPublisher()
    try:
        with ingesting(hostile.endpoints, honest.endpoints) as ingestor:
            wait_connected(hostile, ingestor)
            wait_connected(honest, ingestor)
            history = ingestor.state.history

            def metrics(publisher: RawPublisher) -> set[str]:
                window = history.window(0, publisher=publisher.endpoints.endpoint)
                return {key.metric for key, _kind, _values in window.series}

            reasons = [
                counter("kvscope_evicted_blocks_total", 1.0, medium="CPU", reason=f"r{n}")
                for n in range(600)
            ]
            payload = msgspec.msgpack.encode(frame(counters=reasons))
            hostile.pub.send_multipart([STATS, b"\0" * 8, payload])
            wait_until(lambda: "evictions" in metrics(hostile), "the reasons reach the history")
            honest.send(0, kv_payload(OffloadingEvent([1, 2], 16, "CPU", False)))
            wait_until(lambda: "blocks" in metrics(honest), "the honest blocks reach the history")
            assert history.refused > 0  # the reasons past the hostile worker's share
    finally:
        hostile.close()
        honest.close()
