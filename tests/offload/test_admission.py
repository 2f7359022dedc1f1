"""The admission contract (CachePolicy.admit) and the gated policy's own rules and bounds."""

from __future__ import annotations

import pytest

from offload import CPUOffloadingManager
from offload.base import PrepareStoreOutput
from offload.cpu.policies.gated_lru import MET_CAPACITIES, MET_REQUESTS, GatedLRUCachePolicy
from offload.cpu.policies.lru import _POSITION_BITS
from offload.cpu.policies.miniature import CANDIDATES, MODEL_TURNOVERS, Candidate, Miniature
from offload.cpu.policies.offer_history import (
    OFFERS_PER_SLOT,
    PROVEN_OFFERS,
    OfferHistory,
    earns_a_slot,
)
from offload.cpu.policies.residency import ResidencyAge
from offload.cpu.request_recency import RequestRecency
from offload.sim.workload import run_request as replay
from offload.telemetry import metrics as m
from tests.offload.test_manager_metrics import scrape


def gated(capacity: int, events: bool = True) -> tuple[CPUOffloadingManager, GatedLRUCachePolicy]:
    manager = CPUOffloadingManager(16, capacity, "gated", enable_events=events)
    assert isinstance(manager.policy, GatedLRUCachePolicy)
    return manager, manager.policy


def store(manager: CPUOffloadingManager, hashes: list) -> list:
    out = manager.prepare_store(hashes)
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)
    return out.block_hashes_to_store


def gate_only(policy: GatedLRUCachePolicy) -> None:
    """Leave the gate at its default horizon only: no model can lead it elsewhere."""
    policy.duel.models = [Miniature(policy.capacity, CANDIDATES[0])]


def full_with_a_residency(manager: CPUOffloadingManager, capacity: int) -> None:
    """Fill the tier, then turn it over as often as the gate waits, so it knows how long
    blocks stay."""
    assert isinstance(manager.policy, GatedLRUCachePolicy)
    turnovers = manager.policy.residency.turnovers
    for block_hash in range(1000, 1000 + capacity * (1 + turnovers)):
        store(manager, [block_hash])
    assert manager.policy.residency.age is not None
    manager.take_events()


def test_free_slots_admit_every_block() -> None:
    manager, _ = gated(4)
    assert store(manager, [1, 2, 3, 4]) == [1, 2, 3, 4]
    assert manager.stats.store_not_admitted_blocks == 0


def test_a_block_offered_once_is_refused_counted_and_silent() -> None:
    manager, _ = gated(4)
    full_with_a_residency(manager, 4)
    before = {h: b.slot for h, b in manager.policy.blocks.items()}
    out = manager.prepare_store([7, 8])
    assert out is not None
    assert out.block_hashes_to_store == [] and out.block_hashes_evicted == []
    assert manager.stats.store_not_admitted_blocks == 2
    assert manager.take_events() == []  # a refused block is never announced
    assert {h: b.slot for h, b in manager.policy.blocks.items()} == before  # nothing evicted
    assert scrape(manager)[(m.STORE_NOT_ADMITTED_BLOCKS_TOTAL.name,)] == 2


def test_a_block_offered_again_within_the_horizon_is_admitted() -> None:
    manager, policy = gated(4)
    full_with_a_residency(manager, 4)
    assert store(manager, [7]) == []  # first offer: refused
    assert store(manager, [7]) == [7]  # offered again at once: well within the horizon
    assert manager.lookup([7]) == 1
    assert policy.residency.age is not None


def test_under_a_continuing_leader_a_request_whose_head_is_held_stores_its_new_blocks() -> None:
    manager, policy = gated(4)
    continuing = Candidate(2, 0.25, True)
    policy.duel.models = [Miniature(policy.capacity, continuing)]
    policy.duel.leader = continuing
    full_with_a_residency(manager, 4)
    assert store(manager, [7]) == []  # starts cold: the gate refuses a first offer
    head = next(iter(policy.blocks))
    replay(manager, [head, 8])  # the head hits: 8 continues a held chain
    assert manager.lookup([head, 8]) == 2
    replay(manager, [9, 10])  # a cold request still meets the gate
    assert manager.lookup([9]) == 0


def test_the_tier_refuses_nothing_before_it_has_turned_over_after_the_models() -> None:
    manager, policy = gated(4)
    assert policy.residency.turnovers == MODEL_TURNOVERS + 1
    for block_hash in range(1000, 1000 + 4 * (1 + policy.residency.turnovers) - 1):
        store(manager, [block_hash])  # one block short of the last turnover
    assert policy.residency.age is None
    assert manager.stats.store_not_admitted_blocks == 0
    store(manager, [1])
    assert policy.residency.age is not None
    assert store(manager, [2]) == []  # now a first offer is refused


def test_residency_age_waits_for_its_turnovers_and_forgets_them_on_clear() -> None:
    residency = ResidencyAge(10, 2)
    residency.observe(50, 15)
    assert residency.age is None  # the fill's ages, not yet the steady state's
    residency.observe(30, 5)
    assert residency.age == 40.0  # 20 evicted: two turnovers; 30 weighed 5 / 10 against 50
    residency.clear()
    residency.observe(40, 1)
    assert residency.age is None


def test_the_reuse_horizon_rule() -> None:
    assert not earns_a_slot(None, 10)  # never offered: no evidence it recurs
    assert earns_a_slot((10, 1), 10)  # offered within the horizon
    assert not earns_a_slot((9, 1), 10)  # offered before the horizon, once
    assert earns_a_slot((0, PROVEN_OFFERS - 1), 10)  # offered often enough, whenever


def test_admission_stops_at_the_first_refusal_in_a_chain() -> None:
    manager, _ = gated(4)
    full_with_a_residency(manager, 4)
    store(manager, [8])  # refused: 8 is now known, 7 and 9 are not
    out = manager.prepare_store([7, 8, 9])
    assert out is not None
    # 8 would pass the gate, but behind the refused 7 no lookup could reach it.
    assert out.block_hashes_to_store == []
    assert manager.stats.store_not_admitted_blocks == 1 + 3


def test_a_refused_block_never_evicts_anything() -> None:
    manager, policy = gated(4)
    gate_only(policy)
    full_with_a_residency(manager, 4)
    store(manager, [7])
    out = manager.prepare_store([7, 9])  # 7 is admitted, 9 is refused
    assert out is not None
    assert out.block_hashes_to_store == [7]
    assert len(out.block_hashes_evicted) == 1  # room for 7 only


def test_reset_forgets_offers_and_residency() -> None:
    manager, policy = gated(4)
    full_with_a_residency(manager, 4)
    store(manager, [7])
    manager.reset()
    assert len(policy.offers) == 0 and policy.residency.age is None
    assert all(not len(model) and model.hits == 0 for model in policy.duel.models)
    assert policy.duel.leader == CANDIDATES[0]


def test_offer_history_is_bounded_by_a_fixed_multiple_of_capacity() -> None:
    manager, policy = gated(3)
    assert policy.offers.limit == OFFERS_PER_SLOT * 3
    for start in range(0, 10 * OFFERS_PER_SLOT * 3, 7):
        manager.prepare_store(list(range(start, start + 7)))
        manager.complete_store(list(range(start, start + 7)))
        assert len(policy.offers) <= policy.offers.limit


def test_offer_history_counts_offers_and_forgets_the_oldest() -> None:
    history = OfferHistory(1)
    assert history.admit(["a"], 1, free=0, oldest=1) == ([], 1)  # never offered before
    assert history.admit(["a"], 5, free=0, oldest=1) == (["a"], 0)  # offered at 1 >= oldest
    assert history.admit(["a"], 9, free=0, oldest=100) == (["a"], 0)  # the third offer: proven
    history.admit(list(range(history.limit)), 10, free=0, oldest=None)  # no horizon: all in
    assert len(history) == history.limit
    assert history.admit(["a"], 11, free=0, oldest=0) == ([], 1)  # the oldest went first


def test_a_refusal_refuses_the_rest_of_the_chain_but_every_offer_is_remembered() -> None:
    history = OfferHistory(4)
    assert history.admit(["x", "y", "z"], 20, free=1, oldest=0) == (["x"], 2)  # a free slot
    assert history.admit(["y", "z"], 21, free=0, oldest=20) == (["y", "z"], 0)


def _named(manager: CPUOffloadingManager, hashes: list, request: RequestRecency) -> None:
    """As vLLM 0.33's connector runs a request: it names the request and never touches.
    The request loads its hits, then offers the rest; the policy is told of each."""
    hits = manager.lookup(hashes)
    if hits:
        manager.prepare_load(hashes[:hits])
        manager.policy.observe(hashes[:hits], request)
        manager.complete_load(hashes[:hits])
    manager.policy.observe(hashes[hits:], request)
    out = manager.prepare_store(hashes[hits:], request)
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)


def test_a_caller_that_never_touches_feeds_the_models_what_each_request_met() -> None:
    """The models see a request whole, its loads first, as a touching caller shows it: here
    the second request's hits reach them, so every model counts them."""
    manager, policy = gated(64)
    _named(manager, list(range(8)), RequestRecency(lambda _: None))
    assert all(model.hits == 0 for model in policy.duel.models)
    _named(manager, [*range(8), 100, 101], RequestRecency(lambda _: None))
    assert all(model.hits == 8 for model in policy.duel.models)
    assert not policy._met and policy._met_blocks == 0


def test_a_cold_store_after_a_request_that_hit_whole_reaches_the_models_as_itself() -> None:
    """A request found whole stores nothing, so its touch is still pending when the next
    request, which hit nothing and so was never touched, stores: the models must see both."""
    manager, policy = gated(64)
    replay(manager, list(range(8)))
    replay(manager, list(range(8)))  # every block hit: touched, nothing stored
    replay(manager, [20, 21, 22])  # nothing hit: not touched, stored whole
    for model in policy.duel.models:
        assert 7 < model.hits <= 8  # the whole hit, decayed by the three blocks after it
        assert all(block_hash in model for block_hash in (20, 21, 22))


def test_a_request_that_only_loads_reaches_the_models_when_it_finishes() -> None:
    manager, policy = gated(64)
    _named(manager, list(range(8)), RequestRecency(lambda _: None))
    reader = RequestRecency(lambda _: None)
    assert manager.lookup(list(range(8))) == 8
    policy.observe(list(range(8)), reader)  # loaded whole: nothing to store
    assert all(model.hits == 0 for model in policy.duel.models)
    policy.finish(list(range(8)), set(range(8)), reader)
    assert all(model.hits == 8 for model in policy.duel.models)
    assert not policy._met


def test_what_waits_for_the_models_is_bounded_in_requests_and_blocks() -> None:
    """Requests that meet blocks and never store or finish: the oldest go to the models
    early, so at most MET_REQUESTS requests and MET_CAPACITIES tiers' worth of blocks wait
    (beyond one request's own)."""
    _, policy = gated(MET_REQUESTS)  # room for the blocks: the count of requests binds
    for number in range(MET_REQUESTS + 10):
        policy.observe([number], RequestRecency(lambda _: None))
    assert len(policy._met) == MET_REQUESTS
    capacity = 8
    _, policy = gated(capacity)
    for number in range(50):
        policy.observe(list(range(number * 5, number * 5 + 5)), RequestRecency(lambda _: None))
        assert policy._met_blocks <= MET_CAPACITIES * capacity
    assert policy._met_blocks == sum(len(met[1]) for met in policy._met.values())
    big = list(range(1000, 1000 + 3 * MET_CAPACITIES * capacity))
    policy.observe(big, RequestRecency(lambda _: None))  # one request alone may hold more
    assert policy._met_blocks == len(big) and len(policy._met) == 1


def stored_by(
    manager: CPUOffloadingManager, block_hash: int, request: RequestRecency | None
) -> PrepareStoreOutput:
    out = manager.prepare_store([block_hash], request)
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)
    return out


@pytest.mark.parametrize("second_by_request", [True, False])
def test_the_residency_age_is_timed_from_the_oldest_block_still_at_its_rank(
    second_by_request: bool,
) -> None:
    """Block 1, placed by a request, is placed again by a newer one (its first heap entry
    outdated), then block 2 is stored, by a request or by use: the eviction that makes room
    for block 3 takes block 1, and the age the gate learns is block 1's at its current rank,
    not its outdated entry's, nor the younger block 2's when 2 is ranked by use."""
    manager, policy = gated(2)
    stored_by(manager, 1, RequestRecency({1: 16}.get))
    policy.observe([1], RequestRecency({1: 16}.get))
    stored_by(manager, 2, RequestRecency({2: 16}.get) if second_by_request else None)
    rank, now = policy._placed[1], policy._order
    assert policy._heap[0][0] < rank  # the outdated entry is the heap's top
    out = stored_by(manager, 3, RequestRecency({3: 16}.get))
    assert out.block_hashes_evicted == [1]
    assert policy.residency._average == now - (rank >> _POSITION_BITS)
    assert manager.invariant_violations() == []
