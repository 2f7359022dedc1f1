"""The Prometheus registry behind /metrics: every worker's metrics, labelled, and the sidecar's own.

The sidecar's own ``kvscope_sidecar_*`` metrics are defined here, read at
scrape time from the sidecar's state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.state.sidecar import SidecarState
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import Snapshot

_PUBLISHER_COUNTERS = (
    ("kvscope_sidecar_frames_total", "Frames received (KV batches and stats).", "frames"),
    ("kvscope_sidecar_gaps_total", "Jumps in a publisher's sequence numbers.", "gaps"),
    ("kvscope_sidecar_missed_batches_total", "Batches lost in gaps, not replayable.", "missed"),
    ("kvscope_sidecar_restarts_total", "Times a publisher's sequence went back.", "restarts"),
    ("kvscope_sidecar_malformed_frames_total", "Frames or events skipped as malformed.",
     "malformed"),
    ("kvscope_sidecar_replayed_batches_total", "Batches fetched from replay sockets.",
     "replayed"),
)  # fmt: skip
_LISTENER_COUNTERS = (
    ("kvscope_sidecar_listen_frames_total", "Frames received on the listen socket.", "frames"),
    ("kvscope_sidecar_listen_malformed_frames_total",
     "Listen-socket frames skipped before they named a publisher's stream.", "malformed"),
    ("kvscope_sidecar_listen_refused_frames_total",
     "Listen-socket frames of new streams once the most publishers are tracked.", "refused"),
)  # fmt: skip
"""The listen socket's own counts; its publishers' frames are counted per publisher above."""


class SidecarCollector(Collector):
    """The sidecar's own health, read at scrape time from its state."""

    def __init__(self, state: SidecarState) -> None:
        self._state = state

    def describe(self) -> list[Metric]:
        return []  # families appear on the first scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        publishers = list(self._state.publishers.values())
        for name, help_text, attribute in _PUBLISHER_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["publisher"])
            for publisher in publishers:
                family.add_metric([publisher.name], getattr(publisher, attribute))
            yield family
        lag = GaugeMetricFamily(
            "kvscope_sidecar_ingest_lag_seconds",
            "Seconds since the publisher's last frame (absent until its first).",
            labels=["publisher"],
        )
        now = time.time()
        for publisher in publishers:
            if publisher.last_frame_at is not None:
                lag.add_metric([publisher.name], now - publisher.last_frame_at)
        yield lag
        listener = self._state.listener
        if listener is not None:
            for name, help_text, attribute in _LISTENER_COUNTERS:
                yield CounterMetricFamily(name, help_text, getattr(listener, attribute))
        index = self._state.index
        with self._state.lock:
            tracked, overflow = len(index), index.overflow
        yield GaugeMetricFamily("kvscope_sidecar_tracked_blocks", "Blocks indexed.", tracked)
        yield GaugeMetricFamily(
            "kvscope_sidecar_tracked_blocks_max", "Most blocks the index holds.", index.max_blocks
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_index_overflow_total", "Blocks refused by a full index.", overflow
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_events_total", "Block events received.", self._state.event_log.last_id
        )


def _worker_snapshots(state: SidecarState) -> Iterator[tuple[Snapshot, Mapping[str, str]]]:
    """Every publisher's latest stats frame, labelled with who sent it."""
    for name, publisher in state.publishers.items():
        frame = publisher.stats
        if frame is not None:
            snapshot = Snapshot(frame.counters, frame.gauges, frame.histograms)
            yield snapshot, {"publisher": name, "engine": frame.engine_id, "rank": str(frame.rank)}


def metrics_registry(state: SidecarState) -> CollectorRegistry:
    """A registry of its own, so two sidecars in one process (tests) never collide."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: _worker_snapshots(state)))
    registry.register(SidecarCollector(state))
    return registry
