"""The workers' families on /metrics: rendered once per stats frame, never printed twice.

Two real EventPublishers feed a real Ingestor; the app is driven in-process
(fastapi's TestClient). ``promtool check metrics`` (Debian's prometheus
package) lints what /metrics serves, as Prometheus would parse it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.ingest import Ingestor
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import Sample, StatsFrame, WorkerConfig
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
