"""Counters of one transfer backend: plain integers and histograms, per job.

A job moves many blocks at once, so per-job accounting (a few additions and
two histogram observations) is negligible beside the copy it describes; the
span of each job is recorded here too, from submit to finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from offload.telemetry import metrics as m
from offload.telemetry.histogram import DURATION_BUCKETS_S, SIZE_BUCKETS_BYTES, Histogram
from offload.telemetry.metrics import Snapshot
from offload.telemetry.spans import SpanGate, record_span
from offload.transfer.job import Direction, TransferResult


@dataclass(slots=True)
class DirectionStats:
    """One direction's counts: submitted/finished pairs give the jobs in flight."""

    jobs_submitted: int = 0
    jobs_refused: int = 0
    jobs_ok: int = 0
    jobs_failed: int = 0
    blocks_ok: int = 0
    blocks_failed: int = 0
    bytes_moved: int = 0
    seconds: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS_S))
    sizes: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS_BYTES))


class TransferStats:
    """What a backend reports: on_submit when a job is queued, on_finish when it ends.

    The two calls may come from different threads (the caller's and the
    backend's worker); each field has a single writer, so no lock is needed.
    """

    __slots__ = ("_spans", "directions")

    def __init__(self) -> None:
        self.directions = {direction: DirectionStats() for direction in Direction}
        self._spans = SpanGate()

    def on_submit(self, direction: Direction) -> None:
        self.directions[direction].jobs_submitted += 1

    def on_refuse(self, direction: Direction) -> None:
        self.directions[direction].jobs_refused += 1

    def on_finish(self, result: TransferResult) -> None:
        stats = self.directions[result.direction]
        if result.success:
            stats.jobs_ok += 1
            stats.blocks_ok += result.num_blocks
            stats.bytes_moved += result.bytes
            stats.sizes.observe(result.bytes)
        else:
            stats.jobs_failed += 1
            stats.blocks_failed += result.num_blocks
        stats.seconds.observe(result.seconds)
        if self._spans.active():
            record_span(
                "kvscope.transfer",
                result.seconds,
                {
                    "kvscope.direction": result.direction.value,
                    "kvscope.job_id": result.job_id,
                    "kvscope.blocks": result.num_blocks,
                    "kvscope.bytes": result.bytes,
                    "kvscope.success": result.success,
                },
            )

    def snapshot(self) -> Snapshot:
        """The counts as of now, from any thread.

        Finished jobs are read before submitted ones: a reader on another
        thread while jobs come and go then never sees more jobs finished than
        submitted (a later submitted count is never below an earlier finished
        one).
        """
        snap = Snapshot()
        for direction, stats in self.directions.items():
            d = direction.value
            outcomes = (
                ("ok", stats.jobs_ok, stats.blocks_ok),
                ("failed", stats.jobs_failed, stats.blocks_failed),
            )
            snap.add(m.TRANSFER_JOBS_SUBMITTED_TOTAL, stats.jobs_submitted, direction=d)
            snap.add(m.TRANSFER_JOBS_REFUSED_TOTAL, stats.jobs_refused, direction=d)
            for outcome, jobs, blocks in outcomes:
                snap.add(m.TRANSFER_JOBS_TOTAL, jobs, direction=d, outcome=outcome)
                snap.add(m.TRANSFER_BLOCKS_TOTAL, blocks, direction=d, outcome=outcome)
            snap.add(m.TRANSFER_BYTES_TOTAL, stats.bytes_moved, direction=d)
            snap.add_histogram(m.TRANSFER_DURATION_SECONDS, stats.seconds, direction=d)
            snap.add_histogram(m.TRANSFER_SIZE_BYTES, stats.sizes, direction=d)
        return snap
