"""One worker's telemetry, gathered: the manager, its transfers, its publisher.

This is what the inference worker (or the demo worker) holds: it turns the
core's plain counters into a snapshot for a Prometheus scrape or a stats
frame for the sidecar, and ships the manager's events. Nothing here runs per
block; ``publish_events`` runs once per scheduler step, ``record_request``
once per request (and only with a sampler: the sampled access stream behind
the sidecar's hit-ratio curve).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry

from offload.base import BlockHash
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.manager_metrics import manager_snapshot
from offload.telemetry import metrics as m
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import Snapshot
from offload.transfer.transfer_stats import TransferStats
from offload.wire.publisher import NullPublisher, Publisher
from offload.wire.sample_buffer import DEFAULT_MAX_BYTES, SampleBuffer, Sampler
from offload.wire.stats_frame import StatsFrame, WorkerConfig


class WorkerTelemetry:
    """Snapshots, stats frames and event shipping for one worker."""

    def __init__(
        self,
        manager: CPUOffloadingManager,
        *,
        engine_id: str,
        rank: int = 0,
        transfers: TransferStats | None = None,
        publisher: Publisher | None = None,
        bytes_per_block: int | None = None,
        sampler: Sampler | None = None,
        sample_buffer_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.manager = manager
        self.transfers = transfers
        self.publisher = NullPublisher() if publisher is None else publisher
        self.engine_id = engine_id
        self.rank = rank
        self.config = WorkerConfig(
            policy=manager.policy.name,
            capacity_blocks=manager.num_blocks,
            block_size=manager.block_size,
            bytes_per_block=bytes_per_block,
        )
        self.samples = None if sampler is None else SampleBuffer(sampler, sample_buffer_bytes)
        """The sampled access stream since the last sample frame; None: not sampling."""
        self.record_request: Callable[[Sequence[BlockHash]], None] = (
            _not_sampling if self.samples is None else self.samples.add
        )
        """One request's references to the tier, into the sample (nothing without a sampler):
        the buffer's own ``add``, so the call per request costs no frame of its own."""
        self._stats_lock = threading.Lock()
        """Held to make and queue one stats frame, by the engine or the heartbeat: frames
        reach the queue in the order they were made."""
        # Stats also go out while the engine is idle (no steps, so no publish_stats): the
        # publisher's thread publishes one when none has gone for a while.
        self.publisher.keep_alive(self.publish_stats)

    def snapshot(self) -> Snapshot:
        snap = manager_snapshot(self.manager)
        if self.transfers is not None:
            snap.extend(self.transfers.snapshot())
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
        self.publisher.publish_events(self.manager.take_events())

    def publish_sample(self, *, force: bool = False) -> None:
        """Ship the sample as a frame when one is due (or ``force``); call once per step."""
        samples = self.samples
        if samples is not None and (force or samples.due()):
            frame = samples.take(self.engine_id, self.rank, self.config)
            if frame is not None:
                self.publisher.publish_sample(frame)

    def publish_stats(self) -> None:
        """Ship a stats frame (every second or so, and from the publisher's heartbeat)."""
        with self._stats_lock:
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


def _not_sampling(block_hashes: Sequence[BlockHash]) -> None:
    """``record_request`` without a sampler: nothing is kept."""


def publisher_snapshot(publisher: Publisher) -> Snapshot:
    """The publisher's own health, as metric values."""
    snap = Snapshot()
    snap.add(m.PUBLISHER_FRAMES_TOTAL, publisher.batches_published, kind="kv_events")
    snap.add(m.PUBLISHER_FRAMES_TOTAL, publisher.stats_published, kind="stats")
    snap.add(m.PUBLISHER_DROPPED_FRAMES_TOTAL, publisher.dropped)
    snap.add(m.PUBLISHER_UNSENDABLE_EVENTS_TOTAL, publisher.unsendable_events)
    replays = m.PUBLISHER_REPLAY_REQUESTS_TOTAL
    snap.add(replays, publisher.replays_served, outcome="ok")
    snap.add(replays, publisher.malformed_replay_requests, outcome="malformed")
    snap.add(replays, publisher.refused_replay_requests, outcome="refused")
    snap.add(m.PUBLISHER_TRUNCATED_REPLAYS_TOTAL, publisher.truncated_replays)
    return snap
