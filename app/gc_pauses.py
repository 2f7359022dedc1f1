"""The interpreter's garbage collections, timed as they run, for /metrics.

Every request and the ingest thread wait while a collection runs, so its
duration is a floor under the sidecar's latency at that moment. The sidecar
is built so that none grows with the block index (docs/ARCHITECTURE.md,
"The block index"); this is how an operator sees that it holds.
"""

from __future__ import annotations

import gc
import time
from functools import cache

from offload.telemetry.histogram import Histogram

GENERATIONS = 3
"""CPython's generations: 0 (youngest) to 2 (a full collection)."""

BUCKETS_S = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""A young collection's tenth of a millisecond to a second; the 50 ms a request should
never wait sits on a bound. Few buckets: each is a line of every scrape."""


class GcPauses:
    """Wall-clock seconds of each collection, one histogram per generation.

    The collector calls ``on_collection`` before and after each collection,
    with the interpreter held, and never two collections at once, so the
    histograms need no lock.
    """

    def __init__(self) -> None:
        self.by_generation = tuple(Histogram(BUCKETS_S) for _ in range(GENERATIONS))
        self._started = 0.0

    def on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.by_generation[info["generation"]].observe(time.perf_counter() - self._started)


@cache
def gc_pauses() -> GcPauses:
    """The process's recorder, hooked into the collector on the first call (collections are
    the process's, so there is one)."""
    pauses = GcPauses()
    gc.callbacks.append(pauses.on_collection)
    return pauses
