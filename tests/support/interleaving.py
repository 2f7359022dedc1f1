"""Reading shared state while another thread changes it, as a scrape thread does.

The interpreter switches threads every 5 ms by default, so a reader would
rarely land in the middle of a writer's update; switching every 10 us makes
it land there often, which is what a test of a lock-free reader needs.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SWITCH_INTERVAL_S = 1e-5


def readings_while(write: Callable[[], None], read: Callable[[], T], readings: int) -> list[T]:
    """``readings`` results of ``read``, taken while another thread repeats ``write``."""
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            write()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    thread = threading.Thread(target=writer, name="interleaving-writer")
    thread.start()
    try:
        return [read() for _ in range(readings)]
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
