"""When one logical transfer job is done across tensor-parallel ranks.

With tensor parallelism every one of ``world_size`` ranks copies its own
shard of each block, so a job finishes once per rank. The scheduler side
may act on a job only when every rank has finished it: a store made
visible to lookups after the first rank's report could be loaded while
another rank's shard is still missing. And one rank's failure fails the
job for all, because a block with a missing shard is garbage everywhere.

``RankAccounting`` keeps that tally and nothing else. It returns outcomes
and never calls the manager, so it sits beside the transfer words it shares
(``Direction``) and the caller decides what finishing means
(``complete_store(hashes, success)`` for a store, ``complete_load(hashes)``
for a load). It runs on the scheduler's thread and takes no lock; its
counters are plain integers, each with one writer, for telemetry to read.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from offload.base import BlockHash, positive_count
from offload.transfer.job import Direction


class JobOutcome(msgspec.Struct, frozen=True, gc=False):
    """A job every rank has reported: what it was, and which ranks failed it.

    A msgspec Struct, like ``OffloadingEvent``, because one is built per job
    on the scheduler's thread: built in C, several times cheaper than a
    frozen dataclass, and never tracked by the cycle collector.
    """

    job_id: int
    direction: Direction
    block_hashes: Sequence[BlockHash]
    """As registered: what the caller completes (or rolls back) in the manager."""
    failed_ranks: tuple[int, ...]
    """Ranks that reported failure, ascending; empty when the job succeeded."""

    @property
    def success(self) -> bool:
        """True only when every rank succeeded: one failed shard fails the block."""
        return not self.failed_ranks


class _Pending:
    """A job in flight: the ranks still to report, and those that failed, as bit masks."""

    __slots__ = ("block_hashes", "direction", "failed", "waiting")

    def __init__(self, direction: Direction, block_hashes: Sequence[BlockHash], waiting: int):
        self.direction = direction
        self.block_hashes = block_hashes
        self.waiting = waiting
        self.failed = 0


class RankAccounting:
    """Counts each job's per-rank reports; a job finishes when its last rank reports.

    Only jobs in flight are held: a finished job is forgotten, so its id may
    be registered again, and a late report for it is refused as unknown.
    Bad calls raise a ``ValueError`` naming the problem and change nothing.
    """

    __slots__ = ("_all_ranks", "_jobs", "jobs_failed", "jobs_ok", "rank_reports", "world_size")

    def __init__(self, world_size: int) -> None:
        # Checked as a count: a float or bool would pass ``< 1`` and break the bit masks.
        self.world_size = positive_count("world_size", world_size)
        self._all_ranks = (1 << world_size) - 1
        self._jobs: dict[int, _Pending] = {}
        self.jobs_ok = 0
        """Jobs every rank succeeded."""
        self.jobs_failed = 0
        """Jobs at least one rank failed."""
        self.rank_reports = 0
        """Per-rank reports accepted (refused ones are not counted)."""

    @property
    def jobs_in_flight(self) -> int:
        """Jobs registered and not yet reported by every rank."""
        return len(self._jobs)

    def register(
        self, job_id: int, direction: Direction, block_hashes: Sequence[BlockHash]
    ) -> None:
        """Start waiting for ``world_size`` reports of a job; its id must not be in flight."""
        jobs = self._jobs
        if job_id in jobs:
            raise ValueError(f"job {job_id} is already in flight")
        jobs[job_id] = _Pending(direction, block_hashes, self._all_ranks)

    def report(self, job_id: int, rank: int, success: bool) -> JobOutcome | None:
        """Record one rank's result; the job's outcome once every rank has reported, else None.

        Reports may come in any order across ranks and jobs. Each call
        finishes at most one job, so outcomes come back in the order jobs
        finish.
        """
        # An int, not merely in range: rank 0.5 passed the range check and, with one rank,
        # finished the job; True passed as rank 1.
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise ValueError(f"rank must be an int, got {type(rank).__name__} {rank!r}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size})")
        if self.world_size == 1:
            # The common case: one dict operation, no masks.
            job = self._jobs.pop(job_id, None)
            if job is None:
                raise ValueError(_unknown(job_id))
            self.rank_reports += 1
            return self._finish(job_id, job, () if success else (0,))
        job = self._jobs.get(job_id)
        if job is None:
            raise ValueError(_unknown(job_id))
        bit = 1 << rank
        if not job.waiting & bit:
            raise ValueError(f"rank {rank} already reported job {job_id}")
        self.rank_reports += 1
        job.waiting ^= bit
        if not success:
            job.failed |= bit
        if job.waiting:
            return None
        del self._jobs[job_id]
        failed = job.failed
        failed_ranks = tuple(r for r in range(self.world_size) if failed >> r & 1) if failed else ()
        return self._finish(job_id, job, failed_ranks)

    def _finish(self, job_id: int, job: _Pending, failed_ranks: tuple[int, ...]) -> JobOutcome:
        if failed_ranks:
            self.jobs_failed += 1
        else:
            self.jobs_ok += 1
        return JobOutcome(job_id, job.direction, job.block_hashes, failed_ranks)


def _unknown(job_id: int) -> str:
    return f"job {job_id} is not in flight (never registered, or already finished)"
