"""The shadow thread keeps to its CPU share inside a long item too: it waits between steps.

The bound is one-sided (a loaded machine only stretches the wall time), and
the CPU time is the thread's own, so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import time

from app.ingest.shadow_thread import ShadowThread
from app.state.insight_queue import Pace, ShadowQueue, ShadowWork
from tests.support.polling import wait_until

SHARE = 0.25
STEPS = 10
STEP_CPU_S = 0.01


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_long_item_waits_between_its_steps_to_keep_the_share() -> None:
    queue = ShadowQueue(max_bytes=1 << 20)
    spent: dict[str, float] = {}

    def apply(pace: Pace) -> None:
        cpu = time.thread_time()
        for _ in range(STEPS):
            burn(STEP_CPU_S)
            pace()
        spent["wall"], spent["cpu"] = time.monotonic() - began, time.thread_time() - cpu

    assert queue.put(ShadowWork(apply, lambda: None, 0, "publisher"))
    thread = ShadowThread(queue, SHARE)
    # Wall time is counted from before the thread's window began: from the item's start, a
    # loaded machine's pause between the two (the thread descheduled) went uncounted.
    began = time.monotonic()
    thread.start()
    try:
        wait_until(lambda: queue.unfinished == 0, "the item ran")
    finally:
        thread.close()
    # At its last step the thread had used at most SHARE of the wall time since its window
    # began.
    assert spent["cpu"] >= STEPS * STEP_CPU_S
    assert spent["wall"] >= spent["cpu"] / SHARE - 0.05, spent
