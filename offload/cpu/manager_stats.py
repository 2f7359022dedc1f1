"""The manager's counters: plain integers bumped once per call, never per block.

Every figure is a monotonic count (gauges are differences of pairs, taken
at scrape time), written once per call and read finished-count first, so a
scrape on another thread needs no lock. docs/ARCHITECTURE.md has the
reasoning.
"""

from __future__ import annotations

from offload.telemetry.histogram import DURATION_BUCKETS_S, Histogram


class ManagerStats:
    """Cumulative counts of one manager's decisions, in blocks unless named calls."""

    __slots__ = (
        "dead_write_blocks",
        "evicted_capacity_blocks",
        "evicted_clear_blocks",
        "evicted_failed_store_blocks",
        "load_blocks",
        "load_completed_blocks",
        "load_dropped_blocks",
        "load_pinned_blocks",
        "load_unpinned_blocks",
        "lookup_blocks",
        "lookup_calls",
        "lookup_hit_blocks",
        "lookup_hit_tokens",
        "lookup_tokens",
        "prepare_store_seconds",
        "store_admitted_blocks",
        "store_completed_blocks",
        "store_dropped_blocks",
        "store_not_admitted_blocks",
        "store_refused_blocks",
        "store_refused_calls",
        "store_requested_blocks",
        "store_skipped_blocks",
    )

    def __init__(self) -> None:
        self.lookup_calls = 0
        self.lookup_blocks = 0
        """Blocks asked about; with lookup_hit_blocks, the hit ratio."""
        self.lookup_hit_blocks = 0
        self.lookup_tokens = 0
        self.lookup_hit_tokens = 0
        """Their tokens, each block counted as its own: inside vLLM, a hybrid model's KV
        cache groups differ in tokens per chunk."""
        self.load_blocks = 0
        """Blocks pinned by prepare_load (submitted)."""
        self.load_completed_blocks = 0
        """Blocks unpinned by complete_load (finished)."""
        self.load_pinned_blocks = 0
        self.load_unpinned_blocks = 0
        """Blocks that loads began to hold (none held them before) and stopped holding (the
        last load finished, or a reset dropped them): a block read by several loads at once
        counts once, as vLLM's CPU-tier usage counts it."""
        self.store_requested_blocks = 0
        self.store_skipped_blocks = 0
        """Requested blocks stored already, or named twice in one call."""
        self.store_admitted_blocks = 0
        """Blocks given a slot (submitted stores); the rest were already stored."""
        self.store_not_admitted_blocks = 0
        """New blocks the policy's admission turned away: not stored, evicting nothing."""
        self.store_refused_calls = 0
        self.store_refused_blocks = 0
        self.store_completed_blocks = 0
        self.load_dropped_blocks = 0
        self.store_dropped_blocks = 0
        """Loads and stores in flight at a reset, whose completions will never come."""
        self.evicted_capacity_blocks = 0
        self.evicted_failed_store_blocks = 0
        self.evicted_clear_blocks = 0
        self.dead_write_blocks = 0
        """Blocks that left the tier without ever being loaded: stores that bought nothing."""
        self.prepare_store_seconds = Histogram(DURATION_BUCKETS_S)
        """Latency of prepare_store, the call that evicts and allocates."""

    @property
    def loads_in_flight(self) -> int:
        finished = self.load_completed_blocks + self.load_dropped_blocks  # first: see above
        return self.load_blocks - finished

    @property
    def blocks_pinned_by_loads(self) -> int:
        """Distinct blocks that loads in flight hold; at most the tier's capacity."""
        unpinned = self.load_unpinned_blocks  # first: see above
        return self.load_pinned_blocks - unpinned

    @property
    def stores_in_flight(self) -> int:
        finished = (
            self.store_completed_blocks
            + self.evicted_failed_store_blocks
            + self.store_dropped_blocks
        )
        return self.store_admitted_blocks - finished
