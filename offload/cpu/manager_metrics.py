"""The CPU manager's counts as metric values, read at scrape time only.

Here, not on the hot path, is where per-block work such as the invariant
check belongs, and even here it is bounded: the scheduler's thread pays for
every scrape and stats frame.
"""

from __future__ import annotations

from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.telemetry import metrics as m
from offload.telemetry.metrics import Snapshot


def manager_snapshot(manager: CPUOffloadingManager) -> Snapshot:
    """Counters, gauges and histograms of one manager, as of now, from any thread."""
    stats = manager.stats
    # Finished counts before submitted ones (see offload/cpu/manager_stats.py).
    load_completed = stats.load_completed_blocks
    store_completed = stats.store_completed_blocks
    store_failed = stats.evicted_failed_store_blocks
    medium = manager.medium
    policy = manager.policy.name
    snap = Snapshot()
    add = snap.add
    add(m.LOOKUPS_TOTAL, stats.lookup_calls, medium=medium)
    add(m.LOOKUP_BLOCKS_TOTAL, stats.lookup_blocks, medium=medium)
    add(m.LOOKUP_HIT_BLOCKS_TOTAL, stats.lookup_hit_blocks, medium=medium)
    add(m.LOOKUP_TOKENS_TOTAL, stats.lookup_tokens, medium=medium)
    add(m.LOOKUP_HIT_TOKENS_TOTAL, stats.lookup_hit_tokens, medium=medium)
    misses = manager.misses
    for reason, lookups in list(misses.lookups.items()):
        if reason != "prefix_lost":  # it never decides a lookup
            add(m.LOOKUP_MISSES_TOTAL, lookups, medium=medium, reason=reason)
    for reason, blocks in list(misses.blocks.items()):
        add(m.LOOKUP_MISS_BLOCKS_TOTAL, blocks, medium=medium, reason=reason)
    for reason, tokens in list(misses.tokens.items()):
        add(m.LOOKUP_MISS_TOKENS_TOTAL, tokens, medium=medium, reason=reason)
    add(m.MISS_MEMORY_BLOCKS, misses.remembered, medium=medium)
    add(m.STORE_REQUESTED_BLOCKS_TOTAL, stats.store_requested_blocks, medium=medium)
    add(m.STORE_ADMITTED_BLOCKS_TOTAL, stats.store_admitted_blocks, medium=medium)
    add(m.STORE_SKIPPED_BLOCKS_TOTAL, stats.store_skipped_blocks, medium=medium)
    add(m.STORE_REFUSED_BLOCKS_TOTAL, stats.store_refused_blocks, medium=medium)
    add(m.STORE_NOT_ADMITTED_BLOCKS_TOTAL, stats.store_not_admitted_blocks, medium=medium)
    add(m.STORE_REFUSALS_TOTAL, stats.store_refused_calls, medium=medium)
    add(m.STORE_COMPLETED_BLOCKS_TOTAL, store_completed, medium=medium)
    add(m.STORE_FAILED_BLOCKS_TOTAL, store_failed, medium=medium)
    for reason, count in (
        ("capacity", stats.evicted_capacity_blocks),
        ("failed_store", store_failed),
        ("clear", stats.evicted_clear_blocks),
    ):
        add(m.EVICTED_BLOCKS_TOTAL, count, medium=medium, policy=policy, reason=reason)
    add(m.DEAD_WRITE_BLOCKS_TOTAL, stats.dead_write_blocks, medium=medium, policy=policy)
    add(m.LOAD_BLOCKS_TOTAL, stats.load_blocks, medium=medium)
    add(m.LOAD_COMPLETED_BLOCKS_TOTAL, load_completed, medium=medium)
    add(m.BLOCKS_RESIDENT, manager.pool.num_used, medium=medium)
    add(m.BLOCKS_CAPACITY, manager.pool.capacity, medium=medium)
    add(m.BLOCKS_PINNED, stats.blocks_pinned_by_loads, medium=medium, reason="load")
    add(m.BLOCKS_PINNED, stats.stores_in_flight, medium=medium, reason="store")
    add(m.INVARIANT_VIOLATIONS, len(manager.live_invariant_violations()), medium=medium)
    policy_itself = getattr(manager.policy, "inner", manager.policy)  # behind a guard or not
    if isinstance(policy_itself, GatedLRUCachePolicy):
        duel = policy_itself.duel
        leader = duel.leader
        for candidate, hit_ratio in duel.hit_ratios():
            label = candidate.label
            add(m.ADMISSION_CANDIDATE_HIT_RATIO, hit_ratio, medium=medium, candidate=label)
            followed = 1.0 if candidate == leader else 0.0
            add(m.ADMISSION_CANDIDATE_FOLLOWED, followed, medium=medium, candidate=label)
        add(m.ADMISSION_CANDIDATE_SWITCHES_TOTAL, duel.switches, medium=medium)
    snap.add_histogram(
        m.MANAGER_OPERATION_DURATION_SECONDS,
        stats.prepare_store_seconds,
        medium=medium,
        operation="prepare_store",
    )
    return snap
