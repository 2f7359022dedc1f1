"""The policies' self-checks find what they are for: each table corrupted here on purpose.

A resident block missing from every ranking table is never evicted; a ranked block that is
not resident is evicted twice. The stateful test (test_manager_invariants.py) runs these
checks after every step; here each one is shown to report a broken table by the block's
and the table's names, through the manager's full check. The gated policy's models and
offer history check themselves (test_miniature_forms.py, test_offer_history.py); here the
policy's check is shown to pass on what theirs find.
"""

from __future__ import annotations

from typing import Any

import pytest

from offload import CPUOffloadingManager, policy_names
from offload.cpu.block_pool import Block
from offload.cpu.policies.arc import ARCCachePolicy
from offload.cpu.policies.gated_lru import MET_CAPACITIES, MET_REQUESTS, GatedLRUCachePolicy
from offload.cpu.policies.guarded import GuardedPolicy
from offload.cpu.policies.lru import HEAP_SLACK, LRUCachePolicy
from offload.cpu.request_recency import RequestRecency
from tests.support.c_key_tables import c_state, unlink_oldest
from tests.support.plugin_policy import PluginLRU, plugin_manager
from tests.support.stores import stored

TABLES = "(_used, _placed)"
GATED_TABLES = "(_used, _placed, _protected, _shared)"


def tier(policy: str, capacity: int = 4) -> tuple[CPUOffloadingManager, Any]:
    manager = CPUOffloadingManager(16, capacity, policy)
    assert manager.invariant_violations() == []
    return manager, manager.policy


def by_position(manager: CPUOffloadingManager, hashes: list[int]) -> None:
    """A store ranked by its request (the heap's part of the LRU), completed."""
    places = {block_hash: 16 * (index + 1) for index, block_hash in enumerate(hashes)}
    out = manager.prepare_store(hashes, RequestRecency(places.get))
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)


@pytest.mark.parametrize("policy", policy_names())
def test_every_registered_policy_finds_a_resident_block_it_does_not_rank(policy: str) -> None:
    """A policy added to the registry without its own check would inherit the empty default
    and pass every stateful test with its tables broken."""
    manager, held = tier(policy)
    stored(manager, [1, 2])
    held.blocks[99] = Block(slot=99)  # resident as far as the map says, in no ranking table
    assert any(
        problem.startswith(f"{policy}: block 99 is resident but in no ranking table (")
        for problem in held.invariant_violations()
    )


# --- the LRU (and the gated policy's probation, which is the LRU's) ---


@pytest.mark.parametrize(("policy", "tables"), [("lru", TABLES), ("gated", GATED_TABLES)])
def test_a_resident_block_in_no_ranking_table_is_reported(policy: str, tables: str) -> None:
    manager, lru = tier(policy)
    stored(manager, [1, 2, 3])
    del lru._used[2]
    assert manager.invariant_violations() == [
        f"{policy}: block 2 is resident but in no ranking table {tables}"
    ]


def test_a_block_ranked_by_use_and_by_a_request_is_reported() -> None:
    manager, lru = tier("lru")
    stored(manager, [1, 2])
    lru._place(1, lru._used[1])  # a heap entry too: only the double ranking is wrong
    assert manager.invariant_violations() == ["lru: block 1 is in both _used and _placed"]


def test_a_ranked_block_that_is_not_resident_is_reported() -> None:
    manager, lru = tier("lru")
    stored(manager, [1, 2])
    lru._used[9] = lru._used[2] + 1
    assert manager.invariant_violations() == ["lru: block 9 is in _used but not resident"]


def test_a_block_a_request_ranks_with_no_heap_entry_is_reported() -> None:
    """Eviction finds a request-ranked block only through the heap: without its entry
    there, the block would stay for good."""
    manager, lru = tier("lru")
    by_position(manager, [1, 2])
    assert set(lru._placed) == {1, 2}
    lru._heap = [entry for entry in lru._heap if entry[2] != 2]
    assert manager.invariant_violations() == [
        "lru: block 2 is in _placed but not in _heap at its rank"
    ]


def test_a_block_out_of_rank_order_is_reported() -> None:
    manager, lru = tier("lru")
    stored(manager, [1, 2, 3])
    lru._used.move_to_end(1)  # keeps its old, lowest rank at the newest end
    assert manager.invariant_violations() == [
        "lru: block 1 in _used ranks below the block before it"
    ]


def test_a_heap_past_its_bound_is_reported() -> None:
    manager, lru = tier("lru", capacity=2)
    by_position(manager, [1])
    bound = 2 * 2 + HEAP_SLACK
    lru._heap += [(0, -n, "gone") for n in range(bound)]  # outdated entries
    assert manager.invariant_violations() == [
        f"lru: _heap holds {bound + 1} entries, over its bound of {bound} "
        "(2 * capacity + HEAP_SLACK)"
    ]


# --- ARC ---


def arc_tier() -> tuple[CPUOffloadingManager, ARCCachePolicy]:
    manager, arc = tier("arc")
    stored(manager, [1, 2, 3])
    manager.touch([1])  # 1 in T2, 2 and 3 in T1
    stored(manager, [4, 5])  # 2 leaves T1 for B1
    assert list(arc.t1) == [3, 4, 5] and list(arc.t2) == [1] and list(arc.b1) == [2]
    return manager, arc


def test_arc_reports_a_block_in_neither_t1_nor_t2() -> None:
    manager, arc = arc_tier()
    del arc.t2[1]
    assert manager.invariant_violations() == [
        "arc: block 1 is resident but in no ranking table (t1, t2)"
    ]


def test_arc_reports_a_block_in_both_t1_and_t2() -> None:
    manager, arc = arc_tier()
    arc.t2[3] = arc.t1[3]
    assert manager.invariant_violations() == ["arc: block 3 is in both t1 and t2"]


def test_arc_reports_a_ranked_block_that_is_not_the_resident_one() -> None:
    manager, arc = arc_tier()
    arc.t1[4] = Block(slot=arc.t1[4].slot)
    assert manager.invariant_violations() == [
        "arc: block 4 in t1 is not the block resident under its hash"
    ]


def test_arc_reports_a_ghost_that_is_resident_or_in_both_ghost_lists() -> None:
    manager, arc = arc_tier()
    arc.b2[5] = None
    arc.b2[2] = None
    assert manager.invariant_violations() == [
        "arc: block 5 is in ghost list b2 and resident",
        "arc: block 2 is in both ghost lists b1 and b2",
    ]


def test_arc_reports_a_ghost_list_past_its_bound() -> None:
    manager, arc = arc_tier()
    arc.b1.update(dict.fromkeys(range(100, 104)))
    assert manager.invariant_violations() == [
        "arc: b1 holds 5 entries, over its bound of 4 (capacity)"
    ]


@pytest.mark.parametrize("ghosts", ["b1", "b2"])
def test_arc_ghost_lists_keep_the_latest_evictions_within_capacity(ghosts: str) -> None:
    """Driven far past their bound, each ghost list holds the ``capacity`` latest evictions
    of its side, in eviction order: the oldest were forgotten first."""
    manager, arc = tier("arc")
    for block_hash in range(1, 13):
        stored(manager, [block_hash])
        if ghosts == "b2":
            manager.touch([block_hash])  # seen twice: T2, the only side to evict from
    assert list(getattr(arc, ghosts)) == [5, 6, 7, 8]
    assert manager.invariant_violations() == []


# --- the gated policy's own tables and memories ---


def gated_tier() -> tuple[CPUOffloadingManager, GatedLRUCachePolicy]:
    manager, gated = tier("gated", capacity=8)
    stored(manager, [1, 2, 3])
    manager.touch([1, 2, 3])  # reused: protected (the leader protects a quarter: 2 slots)
    assert set(gated._protected) == {1, 2} and set(gated._used) == {3}
    return manager, gated


def test_gated_reports_a_protected_block_lost_from_its_segment() -> None:
    manager, gated = gated_tier()
    del gated._protected[1]
    assert manager.invariant_violations() == [
        f"gated: block 1 is resident but in no ranking table {GATED_TABLES}"
    ]


def test_gated_reports_a_block_both_protected_and_in_probation() -> None:
    manager, gated = gated_tier()
    gated._used[2] = gated._order << 48
    assert manager.invariant_violations() == ["gated: block 2 is in both _used and _protected"]


def test_gated_reports_a_block_kept_as_shared_that_is_on_no_shared_prefix() -> None:
    manager, gated = gated_tier()
    gated._shared[1] = gated._protected.pop(1)
    assert manager.invariant_violations() == [
        "gated: block 1 is in _shared but on no shared prefix"
    ]


def test_gated_reports_what_it_learnt_of_a_block_that_left() -> None:
    manager, gated = gated_tier()
    gated.shared_prefixes.note_hit([50, 51], 2)  # 50 is not resident
    assert manager.invariant_violations() == [
        "gated: shared_prefixes remembers block 50, which is not resident"
    ]


def test_gated_reports_a_miscounted_wait_for_the_models() -> None:
    manager, gated = gated_tier()
    gated.observe([7, 8], RequestRecency(lambda _: None))
    gated._met_blocks += 1
    assert manager.invariant_violations() == ["gated: _met holds 2 blocks but counts 3"]


def test_gated_reports_prompt_ends_past_their_bound() -> None:
    manager, gated = gated_tier()
    assert len(gated.prompt_ends) == 1  # the end of the one store
    for block_hash in range(100, 108):
        gated.prompt_ends._ends[block_hash] = None
    assert manager.invariant_violations() == [
        "gated: prompt_ends holds 9 entries, over its bound of 8 (capacity)"
    ]


def test_gated_met_requests_past_their_bound_leave_oldest_first() -> None:
    """Past ``MET_REQUESTS`` waiting requests, or ``MET_CAPACITIES`` tiers' worth of blocks,
    the least recently met request goes to the models first."""
    _, gated = tier("gated", capacity=MET_REQUESTS)
    requests = [RequestRecency(lambda _: None) for _ in range(MET_REQUESTS + 10)]
    for number, request in enumerate(requests):
        gated.observe([number], request)
    assert list(gated._met) == requests[10:]
    assert gated.invariant_violations() == []
    _, gated = tier("gated", capacity=8)  # 32 blocks may wait: the blocks bind
    requests = [RequestRecency(lambda _: None) for _ in range(50)]
    for number, request in enumerate(requests):
        gated.observe(list(range(number * 5, number * 5 + 5)), request)
    assert list(gated._met) == requests[-6:]  # 30 blocks; a seventh request would be 35
    assert gated.invariant_violations() == []


def test_gated_waits_for_at_most_met_capacities_requests_a_slot() -> None:
    """Requests that met nothing yet wait too, holding no block: only ``MET_REQUESTS``
    bounded them, past the policy's stated memory on a small tier. ``MET_CAPACITIES``
    a slot do, the oldest leaving first."""
    _, gated = tier("gated", capacity=8)
    requests = [RequestRecency(lambda _: None) for _ in range(100)]
    for request in requests:
        gated.observe([], request)
    assert list(gated._met) == requests[-MET_CAPACITIES * 8 :]
    assert gated._met_blocks == 0
    assert gated.invariant_violations() == []


# --- a plug-in behind the guard ---


def test_the_guard_reports_a_block_its_map_and_the_plugins_hold_differently() -> None:
    manager = plugin_manager(PluginLRU, 4)
    guard = manager.policy
    assert isinstance(guard, GuardedPolicy) and isinstance(guard.inner, LRUCachePolicy)
    stored(manager, [1, 2])
    guard.inner.blocks[2] = Block(slot=guard.blocks[2].slot)
    assert manager.invariant_violations() == [
        "cache policy 'plugin-lru': block 2 is in the guard's map, not as the policy holds it"
    ]


def test_the_guard_passes_on_the_plugins_own_check() -> None:
    manager = plugin_manager(PluginLRU, 4)
    stored(manager, [1, 2])
    del manager.policy.inner._used[1]
    assert manager.invariant_violations() == [
        "plugin-lru: block 1 is resident but in no ranking table (_used, _placed)"
    ]


# --- the gated models and offer histories, in both forms ---


def test_the_gated_policy_reports_its_models_and_offer_history_by_name() -> None:
    manager, gated = gated_tier()
    model = gated.duel.models[0]
    with c_state(model) as state:
        lost = unlink_oldest(state, "probation")
        with c_state(gated.offers) as offers:
            offers.limit = 1
            assert manager.invariant_violations() == [
                "gated: offers: holds 3 blocks, over its limit of 1",
                f"gated: model {model.candidate.label}: block {lost!r} is held but in none "
                "of probation, protected",
            ]
    assert manager.invariant_violations() == []
