"""Reading the core's counters into metric snapshots, at scrape time only.

Everything here runs when a scraper or the stats publisher asks, never on the
hot path; that is where per-block costs such as the invariant check belong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from offload.telemetry.metrics import Snapshot

if TYPE_CHECKING:
    from offload.cpu_manager import CPUOffloadingManager


def manager_snapshot(manager: CPUOffloadingManager) -> Snapshot:
    """Counters, gauges and histograms of one manager."""
    stats = manager.stats
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
    add("kvscope_store_completed_blocks_total", stats.store_completed_blocks, medium=medium)
    add("kvscope_store_failed_blocks_total", stats.evicted_failed_store_blocks, medium=medium)
    for reason, count in (
        ("capacity", stats.evicted_capacity_blocks),
        ("failed_store", stats.evicted_failed_store_blocks),
        ("clear", stats.evicted_clear_blocks),
    ):
        add("kvscope_evicted_blocks_total", count, medium=medium, policy=policy, reason=reason)
    add("kvscope_dead_write_blocks_total", stats.dead_write_blocks, medium=medium, policy=policy)
    add("kvscope_load_blocks_total", stats.load_blocks, medium=medium)
    add("kvscope_load_completed_blocks_total", stats.load_completed_blocks, medium=medium)
    add("kvscope_blocks_resident", manager.pool.num_used, medium=medium)
    add("kvscope_blocks_capacity", manager.pool.capacity, medium=medium)
    add("kvscope_blocks_pinned", stats.loads_in_flight, medium=medium, reason="load")
    add("kvscope_blocks_pinned", stats.stores_in_flight, medium=medium, reason="store")
    add("kvscope_invariant_violations", len(manager.invariant_violations()), medium=medium)
    snap.add_histogram(
        "kvscope_manager_operation_duration_seconds",
        stats.prepare_store_seconds,
        medium=medium,
        operation="prepare_store",
    )
    return snap
