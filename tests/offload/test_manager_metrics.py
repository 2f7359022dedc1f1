"""Every manager metric moves exactly as the manager acts, and the exposition parses."""

from __future__ import annotations

from itertools import pairwise

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from offload import CPUOffloadingManager
from offload.cpu.manager_metrics import manager_snapshot
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.cpu.policies.miniature import CANDIDATES
from offload.sim.workload import run_request
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import MANAGER_OPERATION_DURATION_SECONDS, SPECS, Snapshot
from tests.support.interleaving import readings_while


def scrape(manager: CPUOffloadingManager, **extra: str) -> dict[tuple, float]:
    """The manager's series through a real registry and prometheus-client's own parser."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: [(manager_snapshot(manager), extra)]))
    text = generate_latest(registry).decode()
    series: dict[tuple, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in {"medium", *extra}}
            series[(sample.name, *sorted(labels.items()))] = sample.value
    return series


def test_a_scripted_sequence_moves_every_counter_exactly() -> None:
    manager = CPUOffloadingManager(16, 4, "lru", enable_events=True)
    out = manager.prepare_store([1, 2, 3, 3])  # 3 admitted, 1 repeat skipped
    assert out is not None
    manager.complete_store([1, 2])  # 3 stays in flight
    manager.lookup([1, 2, 3, 4])  # 2 hits of 4
    manager.prepare_load([1, 1])  # pinned twice
    manager.complete_load([1])
    assert manager.prepare_store([5, 6, 7]) is None  # needs 2 evictions; only 2 is idle
    manager.complete_store([3], success=False)  # rolled back
    manager.complete_load([1])
    manager.touch([1])
    out = manager.prepare_store([8, 9, 10])  # 2 free slots after the rollback, evicts one
    assert out is not None and out.block_hashes_evicted == [2]  # 2: never loaded
    manager.complete_store([8, 9, 10])
    manager.clear()  # drops 1 (loaded), 8, 9 and 10 (never loaded)

    s = scrape(manager)
    assert s[("kvscope_lookups_total",)] == 1
    assert s[("kvscope_lookup_blocks_total",)] == 4
    assert s[("kvscope_lookup_hit_blocks_total",)] == 2
    assert s[("kvscope_lookup_tokens_total",)] == 64
    assert s[("kvscope_lookup_hit_tokens_total",)] == 32
    assert s[("kvscope_store_requested_blocks_total",)] == 4 + 3 + 3
    assert s[("kvscope_store_admitted_blocks_total",)] == 3 + 3
    assert s[("kvscope_store_skipped_blocks_total",)] == 1
    assert s[("kvscope_store_refused_blocks_total",)] == 3
    assert s[("kvscope_store_refusals_total",)] == 1
    assert s[("kvscope_store_completed_blocks_total",)] == 2 + 3
    assert s[("kvscope_store_failed_blocks_total",)] == 1
    evicted = "kvscope_evicted_blocks_total"
    assert s[(evicted, ("policy", "lru"), ("reason", "capacity"))] == 1
    assert s[(evicted, ("policy", "lru"), ("reason", "failed_store"))] == 1
    assert s[(evicted, ("policy", "lru"), ("reason", "clear"))] == 4
    assert s[("kvscope_dead_write_blocks_total", ("policy", "lru"))] == 1 + 3
    assert s[("kvscope_load_blocks_total",)] == 2
    assert s[("kvscope_load_completed_blocks_total",)] == 2
    assert s[("kvscope_blocks_resident",)] == 0
    assert s[("kvscope_blocks_capacity",)] == 4
    assert s[("kvscope_blocks_pinned", ("reason", "load"))] == 0
    assert s[("kvscope_blocks_pinned", ("reason", "store"))] == 0
    assert s[("kvscope_invariant_violations",)] == 0
    latency = "kvscope_manager_operation_duration_seconds"
    assert s[(f"{latency}_count", ("operation", "prepare_store"))] == 2  # the refusal is not timed
    assert s[(f"{latency}_bucket", ("le", "+Inf"), ("operation", "prepare_store"))] == 2


def test_in_flight_pairs_show_pinned_blocks_while_work_is_pending() -> None:
    manager = CPUOffloadingManager(16, 8, "arc")
    manager.prepare_store([1, 2, 3])
    manager.complete_store([1])
    manager.prepare_load([1])
    s = scrape(manager)
    assert s[("kvscope_blocks_pinned", ("reason", "store"))] == 2
    assert s[("kvscope_blocks_pinned", ("reason", "load"))] == 1
    assert s[("kvscope_blocks_resident",)] == 3


def test_a_block_read_by_several_loads_at_once_is_pinned_once() -> None:
    manager = CPUOffloadingManager(16, 4, "lru")
    manager.prepare_store([1, 2])
    manager.complete_store([1, 2])
    pinned = ("kvscope_blocks_pinned", ("reason", "load"))
    manager.prepare_load([1, 2])
    manager.prepare_load([1])
    manager.prepare_load([1, 1])
    assert scrape(manager)[pinned] == 2
    manager.complete_load([1, 2])
    manager.complete_load([1, 1])
    assert scrape(manager)[pinned] == 1  # one load of 1 still reads it
    manager.complete_load([1])
    assert scrape(manager)[pinned] == 0
    manager.prepare_load([2, 2])
    manager.reset()  # drops the loads in flight with their blocks
    assert scrape(manager)[pinned] == 0


def test_a_broken_invariant_is_exported() -> None:
    manager = CPUOffloadingManager(16, 4, "lru")
    manager.prepare_store([1, 2])
    manager.complete_store([1, 2])
    manager.policy.blocks[2].slot = manager.policy.blocks[1].slot  # corrupt the bookkeeping
    assert manager.invariant_violations() == ["a slot is owned twice"]
    assert scrape(manager)[("kvscope_invariant_violations",)] == 1


def test_the_live_check_covers_a_large_tier_window_by_window() -> None:
    """A corrupted block is found when the rotating window reaches its slot, and only then."""
    manager = CPUOffloadingManager(16, 100, "lru")
    manager.prepare_store(list(range(100)))
    manager.complete_store(list(range(100)))
    manager.pool._by_slot[75].slot = 3  # corrupt a block's slot
    found = [manager.live_invariant_violations(slots=30) for _ in range(5)]
    # Windows [0, 30), [30, 60), [60, 90), [90, 100), then [0, 30) again.
    assert found == [[], [], ["a slot is owned twice"], [], []]
    assert manager.invariant_violations() == ["a slot is owned twice"]


def test_a_negative_reference_count_is_found_by_both_checks() -> None:
    manager = CPUOffloadingManager(16, 4, "arc")
    manager.prepare_store([1, 2])
    manager.policy.blocks[2].ref = -2
    assert manager.live_invariant_violations() == ["a negative reference count"]
    assert manager.invariant_violations() == ["a negative reference count"]


def test_a_lost_block_breaks_the_counts_at_once() -> None:
    manager = CPUOffloadingManager(16, 1000, "lru")
    manager.prepare_store([1, 2])
    manager.pool._fresh += 1  # a free slot leaks
    expected = ["used 2 + free 997 != capacity 1000"]
    assert manager.live_invariant_violations(slots=1) == expected


def test_a_block_held_twice_with_one_lost_is_left_to_the_full_check() -> None:
    """The documented limit of the live check: this pair keeps the counts right."""
    manager = CPUOffloadingManager(16, 4, "lru")
    manager.prepare_store([1, 2])
    manager.complete_store([1, 2])
    manager.prepare_store([3])
    manager.complete_store([3])
    manager.pool.free([manager.policy.remove(3)])
    free = manager.pool._free
    free[0] = manager.policy.blocks[1]  # a used block is also free; a free one is lost
    assert manager.live_invariant_violations() == []
    assert manager.invariant_violations() == ["a block is held twice"]


def test_a_check_on_another_thread_never_reports_a_move_half_done() -> None:
    """A scrape thread reading while the scheduler evicts and stores sees only whole calls.

    Between an eviction and the pool taking the slots back, and between the
    pool handing slots out and the policy taking them, the counts are short
    for a moment. Checks without the manager's sequence lock saw such a
    moment in about one in five readings here.
    """
    manager = CPUOffloadingManager(16, 64, "lru")
    hashes = iter(range(10**9))

    def store_48_new_blocks() -> None:
        out = manager.prepare_store([next(hashes) for _ in range(48)])
        if out is not None:
            manager.complete_store(out.block_hashes_to_store)

    found = readings_while(store_48_new_blocks, manager.live_invariant_violations, 5000)
    assert manager.stats.evicted_capacity_blocks > 0
    assert [problems for problems in found if problems] == []


def test_a_scrape_on_another_thread_gets_consistent_histograms() -> None:
    """Buckets, and the count that is their total, come from one reading.

    Read bucket by bucket while prepare_store observes, the +Inf bucket and
    the count disagreed, and the snapshot refused itself (a failed scrape).
    """
    manager = CPUOffloadingManager(16, 64, "lru")
    histogram = manager.stats.prepare_store_seconds

    def scrape_histogram() -> str | None:
        snap = Snapshot()
        try:
            snap.add_histogram(
                MANAGER_OPERATION_DURATION_SECONDS,
                histogram,
                medium="CPU",
                operation="prepare_store",
            )
        except ValueError as error:
            return str(error)
        return None

    found = readings_while(lambda: histogram.observe(0.001), scrape_histogram, 5000)
    assert histogram.cumulative()[-1] > 0
    assert [problem for problem in found if problem] == []


def test_a_scrape_on_another_thread_sees_counters_rise_and_pairs_in_order() -> None:
    """Counters never step back between scrapes, and nothing finishes before it started.

    The scheduler thread replays requests (lookups, loads, stores, evictions)
    while this thread scrapes through the real exposition, with no lock
    between them.
    """
    manager = CPUOffloadingManager(16, 64, "lru")
    requests = iter(range(10**9))

    def replay_a_request() -> None:
        first = next(requests) % 96 * 8
        run_request(manager, list(range(first, first + 24)))

    scrapes = readings_while(replay_a_request, lambda: scrape(manager), 400)
    assert scrapes[-1][("kvscope_load_blocks_total",)] > 0
    counters = [key for key in scrapes[0] if key[0].endswith("_total")]
    stepped_back = [
        (key, before[key], after[key])
        for before, after in pairwise(scrapes)
        for key in counters
        if after[key] < before[key]
    ]
    assert stepped_back == []
    for s in scrapes:
        assert s[("kvscope_load_completed_blocks_total",)] <= s[("kvscope_load_blocks_total",)]
        finished = (
            s[("kvscope_store_completed_blocks_total",)] + s[("kvscope_store_failed_blocks_total",)]
        )
        assert finished <= s[("kvscope_store_admitted_blocks_total",)]
        assert s[("kvscope_blocks_pinned", ("reason", "load"))] >= 0
        assert s[("kvscope_blocks_pinned", ("reason", "store"))] >= 0


def test_extra_labels_name_the_worker_on_every_series() -> None:
    manager = CPUOffloadingManager(16, 4, "lru")
    registry = CollectorRegistry()
    registry.register(
        SnapshotCollector(lambda: [(manager_snapshot(manager), {"engine": "e0", "rank": "3"})])
    )
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    elsewhere = ("kvscope_transfer", "kvscope_publisher", "kvscope_admission_candidate")
    assert {family.name for family in families} == {
        name.removesuffix("_total") for name in SPECS if not name.startswith(elsewhere)
    }
    for family in families:
        for sample in family.samples:
            assert sample.labels["engine"] == "e0" and sample.labels["rank"] == "3"


def test_clear_keeps_blocks_in_use_and_reports_the_rest() -> None:
    manager = CPUOffloadingManager(16, 4, "arc", enable_events=True)
    manager.prepare_store([1, 2, 3])
    manager.complete_store([1, 2])
    manager.prepare_load([1])
    manager.take_events()
    assert manager.clear() == [2]
    assert set(manager.policy.blocks) == {1, 3}
    assert [(e.block_hashes, e.removed) for e in manager.take_events()] == [([2], True)]
    manager.complete_load([1])
    manager.complete_store([3])
    assert manager.lookup([1, 3]) == 2
    assert manager.invariant_violations() == []


def test_a_gated_tier_exports_its_candidates_and_which_one_it_runs_as() -> None:
    manager = CPUOffloadingManager(16, 16, "gated")
    policy = manager.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    s = scrape(manager)  # before any request: every candidate at 0, the default followed
    labels = [candidate.label for candidate in CANDIDATES]
    assert len(set(labels)) == len(CANDIDATES)
    for label in labels:
        assert s[("kvscope_admission_candidate_hit_ratio", ("candidate", label))] == 0
        followed = s[("kvscope_admission_candidate_followed", ("candidate", label))]
        assert followed == (1 if label == CANDIDATES[0].label else 0)
    assert s[("kvscope_admission_candidate_switches_total",)] == 0
    for block in range(400):  # each prompt opens with the previous one's new block
        run_request(manager, [block, block + 1])
    s = scrape(manager)
    ratios = {
        label: s[("kvscope_admission_candidate_hit_ratio", ("candidate", label))]
        for label in labels
    }
    assert ratios["admit_all"] > ratios["horizon_2"]  # first offers come back at once
    assert all(0 <= ratio <= 1 for ratio in ratios.values())
    followed = [
        label
        for label in labels
        if s[("kvscope_admission_candidate_followed", ("candidate", label))]
    ]
    assert followed == [policy.duel.leader.label] == ["admit_all"]
    assert s[("kvscope_admission_candidate_switches_total",)] == policy.duel.switches >= 1


def test_other_policies_export_no_candidates() -> None:
    for policy in ("lru", "arc"):
        s = scrape(CPUOffloadingManager(16, 4, policy))
        assert not [key for key in s if key[0].startswith("kvscope_admission_candidate")]
