"""The workers' families on /metrics: rendered once per stats frame, never printed twice.

Two real EventPublishers feed a real Ingestor; the app is driven in-process
(fastapi's TestClient). ``promtool check metrics`` (Debian's prometheus
package) lints what /metrics serves, as Prometheus would parse it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.ingest import Ingestor
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState
from offload.telemetry import metrics as m
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import Snapshot
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import (
    HistogramSnapshot,
    Sample,
    StatsFrame,
    WorkerConfig,
    decode_stats_frame,
    encode_stats_frame,
)
from tests.support.polling import wait_until
from tests.support.prometheus import needs_promtool, promtool

pytestmark = pytest.mark.timeout(120)


CONFIG = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)


def frame(ts: float, engine: str, counters=(), gauges=()) -> StatsFrame:
    return StatsFrame(
        ts=ts, engine_id=engine, rank=0, config=CONFIG, counters=[*counters], gauges=[*gauges]
    )


@pytest.fixture
def two_workers() -> Iterator[tuple[EventPublisher, EventPublisher, SidecarState, TestClient]]:
    with (
        EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as first,
        EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as second,
    ):
        settings = SidecarSettings(connect=[first.endpoint, second.endpoint])
        state = SidecarState.from_settings(settings)
        ingestor = Ingestor(state)
        ingestor.start()
        try:
            with TestClient(create_app(settings, state), base_url="http://localhost") as http:
                yield first, second, state, http
        finally:
            ingestor.close()


def publish(publisher: EventPublisher, state: SidecarState, sent: StatsFrame) -> None:
    """Publish until the sidecar holds this very frame (ZMQ's slow joiner drops the first)."""
    heard = state.publishers[publisher.endpoint]

    def held() -> bool:
        if heard.stats == sent:
            return True
        publisher.publish_stats(sent)
        return False

    wait_until(held, f"the sidecar holds the frame of ts {sent.ts}")


def worker_values(http: TestClient, name: str) -> dict[str, float]:
    """A worker family's values on /metrics, by publisher."""
    return {
        sample.labels["publisher"]: sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        for sample in family.samples
        if sample.name == name and "publisher" in sample.labels
    }


def test_a_frame_is_rendered_once_and_served_until_the_next_replaces_it(two_workers) -> None:
    first, _, state, http = two_workers
    workers = http.app.state.metrics.workers
    publish(first, state, frame(1.0, "e0", gauges=[Sample(name="kvscope_x", value=1.0)]))
    assert worker_values(http, "kvscope_x") == {first.endpoint: 1.0}
    rendered = workers.text()
    assert workers.text() is rendered  # the same bytes, not a new rendering
    assert worker_values(http, "kvscope_x") == {first.endpoint: 1.0}

    publish(first, state, frame(2.0, "e0", gauges=[Sample(name="kvscope_x", value=5.0)]))
    assert workers.text() is not rendered
    assert worker_values(http, "kvscope_x") == {first.endpoint: 5.0}


@needs_promtool
def test_worker_names_the_sidecar_prints_or_another_worker_prints_are_left_out(
    two_workers,
) -> None:
    first, second, state, http = two_workers
    # The sidecar's own process and interpreter families, and a gauge that prints the
    # series the second worker's counter prints (x_total).
    publish(first, state, frame(1.0, "e0", gauges=[
        Sample(name="process_open_fds", value=3.0),
        Sample(name="python_info", labels={"version": "0"}, value=1.0),
        Sample(name="x_total", value=1.0),
        Sample(name="kvscope_kept", value=7.0),
    ]))  # fmt: skip
    publish(second, state, frame(1.0, "e1", counters=[Sample(name="x", value=2.0)]))

    body = http.get("/metrics").text
    linted = promtool("check", "metrics", stdin=body)
    assert "parsing error" not in linted.stdout + linted.stderr, linted.stderr
    families = {family.name: family for family in text_string_to_metric_families(body)}
    assert all("publisher" not in s.labels for s in families["process_open_fds"].samples)
    assert all("publisher" not in s.labels for s in families["python_info"].samples)
    assert families["x_total"].type == "gauge"
    assert [s.labels["publisher"] for s in families["x_total"].samples] == [first.endpoint]
    assert families["kvscope_kept"].samples[0].value == 7.0
    (conflicts,) = families["kvscope_sidecar_conflicting_samples"].samples
    assert conflicts.value == 3


def decoded(ts: float, engine: str, counters=(), gauges=(), histograms=()) -> StatsFrame:
    """A frame as a peer's arrives: through the decoder, which refuses one no peer may send."""
    sent = StatsFrame(
        ts=ts, engine_id=engine, rank=0, config=CONFIG,
        counters=[*counters], gauges=[*gauges], histograms=[*histograms],
    )  # fmt: skip
    return decode_stats_frame(encode_stats_frame(sent))


def histogram(name: str, labels: dict[str, str], counts: tuple[int, int]) -> HistogramSnapshot:
    return HistogramSnapshot(
        name=name, labels=labels, buckets=[0.5, math.inf], counts=[*counts], sum=0.25 * counts[1],
        count=counts[1],
    )  # fmt: skip


def collector_text(state: SidecarState, reserved: frozenset[str]) -> tuple[bytes, int]:
    """What SnapshotCollector over the state's frames writes, and the samples it leaves out:
    every family built and written anew, nothing kept."""

    def snapshots():
        for name, publisher in state.publishers.items():
            if (frame_ := publisher.stats) is not None:
                snapshot = Snapshot(frame_.counters, frame_.gauges, frame_.histograms)
                yield snapshot, {"publisher": name, "engine": frame_.engine_id,
                                 "rank": str(frame_.rank)}  # fmt: skip

    collector = SnapshotCollector(snapshots, reserved)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry), collector.conflicting_samples


def test_each_publishers_part_is_kept_and_the_text_is_the_collectors_through_every_change() -> None:
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"])
    state = SidecarState.from_settings(settings)
    workers = create_app(settings, state).state.metrics.workers
    reserved = workers._reserved
    lookups = m.LOOKUP_BLOCKS_TOTAL.name
    duration = m.TRANSFER_DURATION_SECONDS.name

    def assert_the_collectors() -> bytes:
        text = workers.text()
        assert (text, workers.conflicting_samples) == collector_text(state, reserved)
        return text

    a = state.listened_publisher(b"engine-a", 0)
    b = state.listened_publisher(b"engine-b", 0)
    assert a is not None and b is not None
    # The first publisher shapes kvscope_shared (by medium) and the counter
    # lookups prints as (its family's help is lookups'); one name run apart.
    a.stats = decoded(1.0, "ea", counters=[
        Sample(name=lookups, labels={"medium": "CPU"}, value=3.0),
        Sample(name=lookups.removesuffix("_total"), labels={"medium": "GPU"}, value=1.0),
    ], gauges=[
        Sample(name="kvscope_shared", labels={"medium": 'a "quoted"\\ value'}, value=1.0),
        Sample(name="kvscope_only_a", value=2.5),
        Sample(name="kvscope_shared", labels={"medium": "GPU"}, value=1.5e18),
    ], histograms=[histogram(duration, {"direction": "store"}, (1, 2))])  # fmt: skip
    # The second disagrees with the first about kvscope_shared's labels, prints a name the
    # sidecar prints itself, and gauges a name the first's counter family would print.
    b.stats = decoded(1.0, "eb", counters=[
        Sample(name="kvscope_only_b", value=4.0),
    ], gauges=[
        Sample(name="kvscope_shared", labels={"tier": "x"}, value=9.0),
        Sample(name="process_open_fds", value=3.0),
        Sample(name=lookups.removesuffix("_total") + "_created", value=1.0),
        Sample(name=lookups, value=5.0),
    ], histograms=[histogram(duration, {"direction": "load"}, (0, 1))])  # fmt: skip
    first = assert_the_collectors()
    assert workers.conflicting_samples == 3

    parts = workers._rendered.parts
    a.stats = decoded(2.0, "ea", gauges=[Sample(name="kvscope_only_a", value=7.0)])
    assert assert_the_collectors() != first
    assert workers._rendered.parts[b.name] is parts[b.name]  # written once, kept
    assert workers._rendered.parts[a.name] is not parts[a.name]

    c = state.listened_publisher(b"engine-c", 0)
    assert c is not None
    c.stats = decoded(1.0, "ec", gauges=[Sample(name="kvscope_shared", labels={"tier": "y"},
                                                value=1.0)])  # fmt: skip
    assert_the_collectors()

    # With a gone (no publisher leaves a sidecar today; the text must not depend on it),
    # b is the first to name kvscope_shared: its shape wins, and c's series join it.
    state.publishers = {name: p for name, p in state.publishers.items() if p is not a}
    assert_the_collectors()
    assert workers.conflicting_samples == 1  # b's process_open_fds

    # The publishers in another order: the parts are the same, the families' order is not.
    state.publishers = dict(reversed(state.publishers.items()))
    assert_the_collectors()


def test_what_is_kept_is_twice_the_text_and_a_gone_publishers_part_goes() -> None:
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"])
    state = SidecarState.from_settings(settings)
    exposition = create_app(settings, state).state.metrics
    workers = exposition.workers

    def held() -> float:
        families = text_string_to_metric_families(exposition.render().decode())
        (family,) = (f for f in families if f.name == "kvscope_sidecar_worker_text_bytes")
        return family.samples[0].value

    assert held() == 0
    for engine in (b"engine-a", b"engine-b", b"engine-c"):
        publisher = state.listened_publisher(engine, 0)
        assert publisher is not None
        publisher.stats = decoded(1.0, engine.decode(), gauges=[
            Sample(name="kvscope_tier_blocks", labels={"medium": "CPU"}, value=5.0),
            Sample(name="kvscope_other", value=1.0),
        ])  # fmt: skip
    # No sample left out: each part's lines and each family's header lines once are the text.
    assert held() == 2 * len(workers.text())
    three = held()
    state.publishers = dict(list(state.publishers.items())[1:])
    assert held() == 2 * len(workers.text()) < three
