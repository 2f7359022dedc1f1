"""Why lookups miss: each reason produced by a scripted sequence and counted exactly."""

from __future__ import annotations

from offload import CPUOffloadingManager, OffloadingEvent
from offload.cpu.miss_attribution import REASONS, Generations
from tests.support.stores import stored


def counts(manager: CPUOffloadingManager) -> tuple[dict, dict]:
    """Lookups and blocks per reason, the last miss's blocks charged (no store will split them)."""
    manager.misses.flush()
    lookups = {r: n for r, n in manager.misses.lookups.items() if n}
    blocks = {r: n for r, n in manager.misses.blocks.items() if n}
    return lookups, blocks


def test_a_block_never_stored_is_cold() -> None:
    manager = CPUOffloadingManager(16, 4)
    assert manager.lookup([1, 2, 3]) == 0
    assert counts(manager) == ({"cold": 1}, {"cold": 3})


def test_a_block_stored_then_evicted_for_room_is_evicted() -> None:
    manager = CPUOffloadingManager(16, 2)
    stored(manager, [1, 2])
    assert sorted(stored(manager, [3, 4])) == [1, 2]
    assert manager.lookup([1, 2]) == 0
    assert counts(manager) == ({"evicted": 1}, {"evicted": 2})


def test_a_block_being_written_is_in_flight() -> None:
    manager = CPUOffloadingManager(16, 4)
    manager.prepare_store([5])
    assert manager.lookup([5, 6]) == 0
    # blocks after the break that the tier does not hold go with the first miss's reason
    assert counts(manager) == ({"in_flight": 1}, {"in_flight": 2})


def test_stored_blocks_behind_the_break_are_prefix_lost() -> None:
    manager = CPUOffloadingManager(16, 4)
    stored(manager, [1])
    stored(manager, [2, 3], parent=1)
    stored(manager, [8])
    assert stored(manager, [9]) == [1]  # the chain's head was the least recent
    chain = [1, 2, 3, 4]
    assert manager.lookup(chain) == 0
    assert manager.misses.blocks["evicted"] == 0  # charged once the store shows what is held
    stored(manager, chain)  # as vLLM and the replay do: store what the lookup missed
    # 1 decides the loss (evicted); 2 and 3 are held but unreachable; 4 goes with 1
    assert counts(manager) == ({"evicted": 1}, {"evicted": 2, "prefix_lost": 2})


def test_a_miss_no_store_follows_is_charged_whole_at_the_next_miss() -> None:
    manager = CPUOffloadingManager(16, 4)
    stored(manager, [2])
    manager.lookup([1, 2])
    manager.lookup([5])
    assert manager.misses.blocks["cold"] == 2  # the first lookup's, all to its reason


def test_a_block_the_policy_refused_is_not_admitted() -> None:
    manager = CPUOffloadingManager(16, 2, "gated")
    stored(manager, [1, 2])
    for block_hash in range(10, 400):  # fill the tier's history until the gate closes
        out = manager.prepare_store([block_hash])
        if out is not None and out.block_hashes_to_store:
            manager.complete_store(out.block_hashes_to_store)
    refused = manager.stats.store_not_admitted_blocks
    assert refused > 0, "the gate never refused a first offer"
    offered_once = next(h for h in range(399, 9, -1) if h in manager.misses.refused)
    before = dict(manager.misses.lookups)
    assert manager.lookup([offered_once]) == 0
    assert manager.misses.lookups["not_admitted"] == before["not_admitted"] + 1


def test_hits_count_no_miss_and_a_reset_forgets_evictions() -> None:
    manager = CPUOffloadingManager(16, 2)
    stored(manager, [1, 2])
    assert manager.lookup([1, 2]) == 2
    assert counts(manager) == ({}, {})
    stored(manager, [3, 4])
    manager.reset()
    assert manager.lookup([1]) == 0
    assert counts(manager) == ({"cold": 1}, {"cold": 1})
    assert set(manager.misses.lookups) == set(REASONS)


def test_the_memory_of_evictions_keeps_between_one_and_two_horizons() -> None:
    remembered = Generations(horizon=100)
    for start in range(0, 1000, 10):
        remembered.add(range(start, start + 10))
        assert len(remembered) <= 200
    assert all(h in remembered for h in range(900, 1000))  # the last horizon's worth
    assert 0 not in remembered


def test_stored_events_name_each_runs_parent() -> None:
    manager = CPUOffloadingManager(16, 8, enable_events=True)
    stored(manager, [1, 3])
    manager.take_events()
    stored(manager, [2, 3, 4, 5], parent=1)  # 3 is held: runs [2] under 1, [4, 5] under 3
    assert manager.take_events() == [
        OffloadingEvent([2], 16, "CPU", False, 1),
        OffloadingEvent([4, 5], 16, "CPU", False, 3),
    ]
    out = manager.prepare_store([7, 8], parent=6)
    assert out is not None
    manager.complete_store([8])  # a run completed from its middle: its parent is not known
    manager.complete_store([7])
    assert manager.take_events() == [
        OffloadingEvent([8], 16, "CPU", False, None),
        OffloadingEvent([7], 16, "CPU", False, 6),
    ]
