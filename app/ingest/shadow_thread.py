"""The shadow thread: runs the curves' shadow tiers (and the optimum over each publisher's
window, app/state/insight.py) off the ingest thread, on a CPU budget.

The interpreter runs one thread at a time, so a busy thread beside the
ingest thread takes its time from ingest, whatever the queue between them.
This thread therefore keeps to ``cpu_share`` of one core: after each item,
and between the steps of a long one (``pace``), it compares the CPU time it
used in the current window with the share of the wall time passed, and
waits out the excess. What it cannot get through
in that share piles up in the queue, which sheds (counted) when full: the
curve loses precision, ingest loses nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

from app.settings import MIN_INSIGHT_CPU_SHARE
from app.state.insight_queue import ShadowQueue
from offload.wire.log_limit import LogLimiter

logger = logging.getLogger("app.ingest.shadow")
_log = LogLimiter(logger)

POLL_S: Final = 0.1
"""How often the thread looks at its stop flag when nothing arrives."""
WINDOW_S: Final = 1.0
"""The window over which the CPU share is kept."""


class ShadowThread:
    """Takes items off ``queue`` and runs them, within ``cpu_share`` of a core."""

    def __init__(self, queue: ShadowQueue, cpu_share: float) -> None:
        if not MIN_INSIGHT_CPU_SHARE <= cpu_share <= 1:
            raise ValueError(f"cpu_share must be in [{MIN_INSIGHT_CPU_SHARE}, 1], got {cpu_share}")
        self.queue = queue
        self.cpu_share = cpu_share
        self.items_run = 0
        self._wall = self._cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvscope-shadows", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        self._restart()
        while not self._stop.is_set():
            work = self.queue.get(POLL_S)
            if work is None:
                self._restart()
                continue
            try:
                work.apply(self.pace)
            except Exception as exc:  # a bug here must not stop the curves of every publisher
                _log.log(logging.ERROR, "shadow-error", "a shadow tier failed", exc_info=exc)
            finally:
                self.queue.finished()
            self.items_run += 1
            self.pace()

    def _restart(self) -> None:
        """A new window of the CPU share: from now, nothing used yet."""
        self._wall, self._cpu = time.monotonic(), time.thread_time()

    def pace(self) -> None:
        """Wait out the CPU time used past the share in this window (at once when closing)."""
        elapsed = time.monotonic() - self._wall
        used = time.thread_time() - self._cpu
        excess = used / self.cpu_share - elapsed
        if excess > 0:
            self._stop.wait(excess)
        if time.monotonic() - self._wall >= WINDOW_S:
            self._restart()
