"""The job bookkeeping every threaded backend shares: ids, in-flight jobs, unpolled results.

A backend's workers copy; the book says which jobs exist, which are still in
flight and which finished but were not yet polled, all under one lock whose
condition wakes whoever waits on a job. It also keeps the backend's
``TransferStats`` and its closed flag, so the rules that tie them together
(count a job submitted before a worker can finish it, refuse jobs once
closed) live in one place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from offload.transfer.job import Direction, TransferResult
from offload.transfer.layout import TransferPlan
from offload.transfer.transfer_stats import TransferStats
from offload.wire.log_limit import LogLimiter

DEFAULT_MAX_JOBS: Final = 65_536
"""Jobs a backend holds at once, in flight or finished and not yet polled: far more than an
engine keeps in flight (it polls every step), and a bound on a caller that never polls."""

_log = LogLimiter(logging.getLogger(__name__))


class BackendFullError(ValueError):
    """As many jobs as the backend holds are in flight or waiting to be polled."""


class BackendClosedError(RuntimeError):
    """The backend was closed: it takes no more jobs."""


class JobBook:
    """Ids, pending jobs, finished-unpolled results and stats of one backend.

    ``changed`` is the condition over the book's lock: it is notified
    whenever a job finishes, and a backend may wait on it (or notify it)
    for state of its own that it guards with the same lock.
    """

    def __init__(self, max_jobs: int = DEFAULT_MAX_JOBS) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self._next_id = 0
        self._pending: set[int] = set()
        self._unpolled: dict[int, TransferResult] = {}
        """Finished, not yet polled, in completion order (dicts keep insertion order)."""
        self._closed = False
        self.stats = TransferStats()

    def open(self, direction: Direction, enqueue: Callable[[int], None]) -> int:
        """Take a new job's id, count it submitted, and hand it to ``enqueue``; return the id.

        Refuses once the book is closed, and (``BackendFullError``, counted) while it
        holds ``max_jobs``.
        """
        with self._lock:
            if self._closed:
                raise BackendClosedError("the transfer backend is closed; it accepts no more jobs")
            if len(self._pending) + len(self._unpolled) >= self.max_jobs:
                self.stats.on_refuse(direction)
                raise BackendFullError(
                    f"{self.max_jobs} transfer jobs are in flight or finished and not yet "
                    "polled, the backend's most: poll() takes the finished ones"
                )
            job_id = self._next_id
            self._next_id += 1
            self._pending.add(job_id)
            # Counted before it is queued: a worker may finish it at once, and a job
            # must never be counted finished before it is counted submitted.
            self.stats.on_submit(direction)
            # Queued under the lock so queue order (and so, but for expedited jobs, completion
            # order) is id order.
            enqueue(job_id)
        return job_id

    def finish(self, result: TransferResult, forget: Callable[[int], object] | None = None) -> None:
        """Record a finished job for ``poll`` and wake its waiters.

        ``forget`` runs under the lock with the job's id, in the same step that
        takes the job off the in-flight set: for a backend's own per-job state.
        Counting it (and its span, which an OpenTelemetry exporter records) may
        fail without losing the job: a worker that died here reported nothing
        again, and ``wait`` on its jobs never returned.
        """
        try:
            self.stats.on_finish(result)
        except Exception as exc:
            _log.log(
                logging.ERROR, "stats", "a finished transfer job was not counted", exc_info=exc
            )
        with self.changed:
            self._pending.discard(result.job_id)
            if forget is not None:
                forget(result.job_id)
            self._unpolled[result.job_id] = result
            self.changed.notify_all()

    def poll(self) -> list[TransferResult]:
        """Jobs finished since the last poll, in completion order. Never blocks."""
        with self._lock:
            results = list(self._unpolled.values())
            self._unpolled.clear()
        return results

    def wait(self, job_id: int, timeout: float | None = None) -> TransferResult:
        """Block until a job finishes and return its result, left in place for ``poll``."""
        with self.changed:
            if job_id not in self._pending and job_id not in self._unpolled:
                raise ValueError(f"job {job_id} is neither in flight nor waiting to be polled")
            if not self.changed.wait_for(lambda: job_id not in self._pending, timeout):
                raise TimeoutError(f"job {job_id} did not finish within {timeout} s")
            result = self._unpolled.get(job_id)
        if result is None:
            raise RuntimeError(f"job {job_id} finished, but another thread polled it first")
        return result

    def close(self, stop: Callable[[], None]) -> None:
        """Refuse further jobs; only the first call runs ``stop``, under the lock."""
        with self._lock:
            if not self._closed:
                self._closed = True
                stop()

    def was_submitted(self, job_id: int) -> bool:
        """Whether ``open`` ever gave out this id. Call with ``changed`` held."""
        return 0 <= job_id < self._next_id

    def in_flight(self, job_id: int) -> bool:
        """Whether the job is submitted and not yet finished. Call with ``changed`` held."""
        return job_id in self._pending


def job_result(
    job_id: int,
    plan: TransferPlan,
    submitted: float,
    copy_seconds: float | None,
    *,
    success: bool,
    error: str | None,
) -> TransferResult:
    """A finished job's result; ``submitted`` is its ``time.perf_counter`` at submit."""
    return TransferResult(
        job_id=job_id,
        direction=plan.direction,
        success=success,
        num_blocks=plan.num_blocks,
        bytes=plan.bytes if success else 0,
        seconds=time.perf_counter() - submitted,
        error=error,
        copy_seconds=copy_seconds,
    )
