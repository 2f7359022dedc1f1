"""One worker's telemetry, gathered: the manager, its transfers, its publisher.

This is what the inference worker (or the replay engine) holds: it turns the
core's plain counters into a snapshot for a Prometheus scrape or a stats
frame for the sidecar, and ships the manager's events. Nothing here runs per
block; ``publish_events`` runs once per scheduler step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry

from offload.cpu_manager import CPUOffloadingManager
from offload.publisher import EventPublisher
from offload.stats_frame import StatsFrame, WorkerConfig
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import Snapshot
from offload.transfer.transfer_stats import TransferStats


class WorkerTelemetry:
    """Snapshots, stats frames and event shipping for one worker."""

    def __init__(
        self,
        manager: CPUOffloadingManager,
        *,
        engine_id: str,
        rank: int = 0,
        transfers: TransferStats | None = None,
        publisher: EventPublisher | None = None,
        bytes_per_block: int | None = None,
    ) -> None:
        self.manager = manager
        self.transfers = transfers
        self.publisher = publisher
        self.engine_id = engine_id
        self.rank = rank
        self.config = WorkerConfig(
            policy=manager.policy.name,
            capacity_blocks=manager.num_blocks,
            block_size=manager.block_size,
            bytes_per_block=bytes_per_block,
        )

    def snapshot(self) -> Snapshot:
        snap = manager_snapshot(self.manager)
        if self.transfers is not None:
            snap.extend(self.transfers.snapshot())
        if self.publisher is not None:
            snap.extend(publisher_snapshot(self.publisher))
        return snap

    def stats_frame(self) -> StatsFrame:
        snap = self.snapshot()
        return StatsFrame(
            ts=time.time(),
            engine_id=self.engine_id,
            rank=self.rank,
            config=self.config,
            counters=snap.counters,
            gauges=snap.gauges,
            histograms=snap.histograms,
        )

    def publish_events(self) -> None:
        """Ship the manager's events since the last call (once per scheduler step)."""
        if self.publisher is None:
            raise RuntimeError("this worker has no publisher to ship events with")
        self.publisher.publish_events(self.manager.take_events())

    def publish_stats(self) -> None:
        if self.publisher is None:
            raise RuntimeError("this worker has no publisher to ship stats with")
        self.publisher.publish_stats(self.stats_frame())

    def labels(self) -> Mapping[str, str]:
        return {"engine": self.engine_id, "rank": str(self.rank)}

    def registry(self) -> CollectorRegistry:
        """A registry exposing this worker's metrics, for an optional exporter."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(self._sources))
        return registry

    def _sources(self) -> Iterator[tuple[Snapshot, Mapping[str, str]]]:
        yield self.snapshot(), self.labels()


def publisher_snapshot(publisher: EventPublisher) -> Snapshot:
    snap = Snapshot()
    snap.add("kvscope_publisher_frames_total", publisher.batches_published, kind="kv_events")
    snap.add("kvscope_publisher_frames_total", publisher.stats_published, kind="stats")
    snap.add("kvscope_publisher_dropped_frames_total", publisher.dropped)
    replays = "kvscope_publisher_replay_requests_total"
    snap.add(replays, publisher.replays_served, outcome="ok")
    snap.add(replays, publisher.malformed_replay_requests, outcome="malformed")
    return snap


def manager_snapshot(manager: CPUOffloadingManager) -> Snapshot:
    """Counters, gauges and histograms of one manager, read at scrape time only.

    Here, not on the hot path, is where per-block work such as the
    invariant check belongs, and even here it is bounded: the scheduler's
    thread pays for every scrape and stats frame.
    """
    stats = manager.stats
    # Finished counts before submitted ones (see offload/telemetry/manager_stats.py).
    load_completed = stats.load_completed_blocks
    store_completed = stats.store_completed_blocks
    store_failed = stats.evicted_failed_store_blocks
    medium = manager.medium
    policy = manager.policy.name
    tokens = manager.block_size
    snap = Snapshot()
    add = snap.add
    add("kvscope_lookups_total", stats.lookup_calls, medium=medium)
    add("kvscope_lookup_blocks_total", stats.lookup_blocks, medium=medium)
    add("kvscope_lookup_hit_blocks_total", stats.lookup_hit_blocks, medium=medium)
    add("kvscope_lookup_tokens_total", stats.lookup_blocks * tokens, medium=medium)
    add("kvscope_lookup_hit_tokens_total", stats.lookup_hit_blocks * tokens, medium=medium)
    add("kvscope_store_requested_blocks_total", stats.store_requested_blocks, medium=medium)
    add("kvscope_store_admitted_blocks_total", stats.store_admitted_blocks, medium=medium)
    add("kvscope_store_skipped_blocks_total", stats.store_skipped_blocks, medium=medium)
    add("kvscope_store_refused_blocks_total", stats.store_refused_blocks, medium=medium)
    add("kvscope_store_refusals_total", stats.store_refused_calls, medium=medium)
    add("kvscope_store_completed_blocks_total", store_completed, medium=medium)
    add("kvscope_store_failed_blocks_total", store_failed, medium=medium)
    for reason, count in (
        ("capacity", stats.evicted_capacity_blocks),
        ("failed_store", store_failed),
        ("clear", stats.evicted_clear_blocks),
    ):
        add("kvscope_evicted_blocks_total", count, medium=medium, policy=policy, reason=reason)
    add("kvscope_dead_write_blocks_total", stats.dead_write_blocks, medium=medium, policy=policy)
    add("kvscope_load_blocks_total", stats.load_blocks, medium=medium)
    add("kvscope_load_completed_blocks_total", load_completed, medium=medium)
    add("kvscope_blocks_resident", manager.pool.num_used, medium=medium)
    add("kvscope_blocks_capacity", manager.pool.capacity, medium=medium)
    add("kvscope_blocks_pinned", stats.loads_in_flight, medium=medium, reason="load")
    add("kvscope_blocks_pinned", stats.stores_in_flight, medium=medium, reason="store")
    add("kvscope_invariant_violations", len(manager.live_invariant_violations()), medium=medium)
    snap.add_histogram(
        "kvscope_manager_operation_duration_seconds",
        stats.prepare_store_seconds,
        medium=medium,
        operation="prepare_store",
    )
    return snap
