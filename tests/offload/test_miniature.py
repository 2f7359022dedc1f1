"""Miniature simulations: prefix-aware models of the tier, the duel that follows the best,
and the tier running as the leader (a gate, or SLRU's protected segment)."""

from __future__ import annotations

from math import inf, sqrt

import pytest

from offload import CPUOffloadingManager
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.cpu.policies.miniature import (
    CANDIDATES,
    FLOOD_TURNOVERS,
    MODEL_SLOTS,
    MODEL_TURNOVERS,
    Candidate,
    Miniature,
    MiniatureDuel,
    sampling_rate,
)
from offload.cpu.policies.miniature_model import sampled
from offload.cpu.policies.offer_history import OFFERS_PER_SLOT
from offload.sim.workload import run_request as replay

LRU = Candidate(None, 0.0)
SLRU = Candidate(None, 0.5)


def test_a_model_counts_the_leading_run_only() -> None:
    model = Miniature(8, LRU)
    model.run([1, 2, 3], 1.0, False)
    model.run([4], 1.0, False)
    model.run([1, 9, 3], 1.0, False)  # 3 is held, but behind the missing 9 no lookup reaches it
    assert model.hits == 1
    model.run([1, 9, 3], 1.0, False)
    assert model.hits == 1 + 3


def test_a_model_evicts_the_oldest_and_its_last_stored_block_first() -> None:
    model = Miniature(3, LRU)
    model.run([1, 2], 1.0, False)
    model.run([5, 6], 1.0, False)  # 6 ends a prompt: first to go; 2 likewise, and older
    assert list(model.probation) == [6, 1, 5]


def test_the_tier_evicts_a_stored_run_tail_first() -> None:
    manager = CPUOffloadingManager(16, 4, "gated")
    replay(manager, [1, 2, 3, 4])
    out = manager.prepare_store([5, 6, 7])  # no residency yet: admitted, room made
    assert out is not None
    assert out.block_hashes_evicted == [4, 3, 2]  # its last block first, then tail to head
    manager.complete_store(out.block_hashes_to_store)
    assert manager.lookup([1]) == 1


def test_a_prompt_sent_again_keeps_its_last_block_in_line() -> None:
    manager = CPUOffloadingManager(16, 4, "gated")
    replay(manager, [1, 2])  # 2 ends the prompt: ranked first to go
    replay(manager, [3, 4, 5])  # room for one: 2 leaves; 5 is now first to go
    assert manager.lookup([1, 2]) == 1
    replay(manager, [1, 2])  # sent again: 5 leaves for 2, which ended a store before
    out = manager.prepare_store([9])
    assert out is not None
    assert out.block_hashes_evicted == [4]  # the other run's tail, not the resent prompt's end


def test_a_gated_model_refuses_first_offers_once_it_has_turned_over() -> None:
    model = Miniature(2, Candidate(2, 0.0))
    model.run([1, 2], 1.0, False)  # free slots: admitted
    assert model.age is None
    model.run([3, 4], 1.0, False)  # full, and no residency known yet: admitted, a turnover evicted
    assert MODEL_TURNOVERS == 1 and model.age is not None
    model.run([5, 6], 1.0, False)  # first offers: refused, the chain stops at 5
    assert 5 not in model and 6 not in model
    model.run([5], 1.0, False)  # offered again at once: within the horizon
    assert 5 in model


def test_a_model_admitting_continuations_gates_only_requests_that_start_cold() -> None:
    continuing, gated = Miniature(2, Candidate(2, 0.0, True)), Miniature(2, Candidate(2, 0.0))
    for model in (continuing, gated):
        model.run([1, 2], 1.0, False)
        model.run([3, 4], 1.0, False)  # a turnover: the residency is known, the gate is on
        model.run([5, 6], 1.0, False)  # starts cold: refused by both
        assert 5 not in model
        model.run([3, 7], 1.0, True)  # 3 is held: the request continues a held chain
    assert 7 in continuing  # admitted at its first offer
    assert 7 not in gated  # the plain gate waits for a second offer


def test_a_model_takes_the_tiers_verdict_that_a_request_continues() -> None:
    """The model sees a sample: a request's held head (a shared system prompt, say) may lie
    outside it. Whether the request continues is the tier's call, not the model's."""
    model = Miniature(2, Candidate(2, 0.0, True))
    model.run([1, 2], 1.0, False)
    model.run([3, 4], 1.0, False)  # a turnover: the residency is known, the gate is on
    model.run([5, 6], 1.0, True)  # nothing of it held here, but the tier held its head
    assert 5 in model and 6 in model
    model.run([8, 9], 1.0, False)  # cold in the tier: the gate refuses a first offer
    assert 8 not in model


def test_an_unbounded_gate_admits_a_second_offer_whatever_its_gap() -> None:
    """vLLM's reuse filter as a candidate: a block comes back after many turnovers, long
    past any residency horizon; only the unbounded gate stores it at its second offer."""
    unbounded, gated = Miniature(2, Candidate(inf, 0.0)), Miniature(2, Candidate(2, 0.0))
    for model in (unbounded, gated):
        model.run([1, 2], 1.0, False)
        model.run([3, 4], 1.0, False)  # a turnover: the residency is known, the gate is on
        model.run([5], 1.0, False)  # a first offer: refused by both
        for start in range(100, 160, 2):  # pairs offered once each, on and on: all refused
            model.run([start, start + 1], 1.0, False)
        assert 5 not in model and 100 not in model
        model.run([5], 1.0, False)  # offered again, 31 stores later
    assert 5 in unbounded
    assert 5 not in gated  # its previous offer lies far outside two residency ages


def test_the_tier_follows_the_reuse_filter_where_documents_return_after_turnovers() -> None:
    """Four documents, each back after 40 one-off prompts (ten tiers' worth of blocks): the
    horizon gates refuse their second offers, admit-all has evicted them, so only storing
    at the second offer whatever the gap (vLLM's reuse filter) serves them a round early,
    and the duel follows it."""
    manager = CPUOffloadingManager(16, 64, "gated")
    documents = [list(range(start, start + 8)) for start in range(100, 500, 100)]
    one_offs = iter(range(10_000, 1_000_000, 16))
    served = []
    for _ in range(6):
        hits = 0
        for document in documents:
            hits += replay(manager, document)
            for _ in range(10):
                start = next(one_offs)
                replay(manager, list(range(start, start + 16)))
        served.append(hits)
    assert manager.policy.duel.leader.horizon == inf
    assert served[0] == 0 and all(hits >= 3 * 8 for hits in served[3:])


def test_a_candidates_oldest_admitted_offer() -> None:
    assert Candidate(2, 0.0).oldest_offer(100, 10.0, False) == 80  # two residency ages back
    assert Candidate(inf, 0.0).oldest_offer(100, 10.0, False) == -inf  # any gap remembered
    assert Candidate(inf, 0.0).oldest_offer(100, 0.0, False) == -inf  # even at an age of 0
    assert Candidate(2, 0.0).oldest_offer(100, None, False) is None  # the fill: no gate yet
    assert Candidate(None, 0.5).oldest_offer(100, 10.0, False) is None  # no gate at all
    assert Candidate(2, 0.0, True).oldest_offer(100, 10.0, True) is None  # continues a chain
    assert Candidate(2, 0.0, True).oldest_offer(100, 10.0, False) == 80  # starts cold


def scan_after_reuse(model: Miniature) -> None:
    """Blocks 1-2 stored and reused, then one-off prompts that fill the rest twice over."""
    model.run([1, 2], 1.0, False)
    model.run([1, 2], 1.0, False)
    for start in (100, 200):
        model.run(list(range(start, start + model.slots - 2)), 1.0, False)


def test_a_protected_segment_keeps_reused_blocks_through_a_scan() -> None:
    lru, slru = Miniature(8, LRU), Miniature(8, SLRU)
    scan_after_reuse(lru)
    scan_after_reuse(slru)
    assert 1 not in lru and 2 not in lru  # the scan flushed the reused chain
    assert 1 in slru and 2 in slru  # it churned only the probation segment
    assert len(slru) <= slru.slots


def quick_returns() -> list[list[int]]:
    """Each prompt opens with the previous one's new block: first offers pay at once."""
    return [[block, block + 1] for block in range(400)]


def hot_set_and_one_offs() -> list[list[int]]:
    """A recurring prefix among one-off prompts larger than the tier: first offers do not."""
    requests, fresh = [], 100_000
    for turn in range(400):
        one_off = list(range(fresh, fresh + 12))
        fresh += 12
        requests.append(one_off if turn % 2 else [*range(20), *one_off[:2]])
    return requests


def test_the_duel_follows_admit_all_when_first_offers_come_back() -> None:
    duel = MiniatureDuel(16)
    for request in quick_returns():
        duel.run(request, False)
    assert duel.leader.horizon is None


def test_the_duel_follows_a_gate_when_first_offers_never_come_back() -> None:
    duel = MiniatureDuel(24)
    for request in hot_set_and_one_offs():
        duel.run(request, False)
    assert duel.leader.horizon is not None


def test_the_tier_applies_the_leaders_horizon() -> None:
    manager = CPUOffloadingManager(16, 16, "gated")
    policy = manager.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    assert policy.duel.leader == CANDIDATES[0]
    for request in quick_returns():
        replay(manager, request)
    assert policy.duel.leader.horizon is None
    assert manager.stats.store_not_admitted_blocks < 50  # admitted once the models agreed


def test_model_memory_does_not_grow_with_the_tier() -> None:
    for capacity in (1, 100, MODEL_SLOTS, 10 * MODEL_SLOTS, 10**6):
        duel = MiniatureDuel(capacity)
        rate = sampling_rate(capacity)
        assert rate & (rate - 1) == 0  # a power of two: a mask picks the sample
        for model in duel.models:
            assert model.slots <= max(capacity, 1)
            assert model.slots < 2 * MODEL_SLOTS or capacity < 2 * MODEL_SLOTS
            assert model.offers.limit == OFFERS_PER_SLOT * model.slots
        assert len(duel.models) == len(CANDIDATES)


def test_models_stay_within_their_bounds() -> None:
    duel = MiniatureDuel(8)
    for start in range(0, 20 * OFFERS_PER_SLOT * 8, 5):
        duel.run(list(range(start, start + 5)), False)
        for model in duel.models:
            assert len(model) <= model.slots
            assert len(model.protected) <= model.protected_slots
            assert len(model.offers) <= model.offers.limit


def model_of(duel: MiniatureDuel, candidate: Candidate) -> Miniature:
    return next(model for model in duel.models if model.candidate == candidate)


def test_the_duel_keeps_its_leader_while_the_lead_is_noise() -> None:
    duel = MiniatureDuel(16)
    leader = model_of(duel, duel.leader)
    challenger = model_of(duel, Candidate(1, 0.25))  # another gate
    leader.hits, challenger.hits = 100.0, 110.0  # within sqrt(210): noise
    duel.run([10**9], False)  # a request no model holds: the counts only decay
    assert duel.leader == leader.candidate
    challenger.hits = 130.0  # beyond the noise of the two counts
    duel.run([10**9 + 1], False)
    assert duel.leader == challenger.candidate


@pytest.mark.parametrize(
    ("opener", "stricter"),
    [
        (Candidate(None, 0.5), CANDIDATES[0]),  # admit everything, then back to the gate
        (Candidate(inf, 0.25), Candidate(1, 0.25)),  # no horizon, then a horizon again
    ],
)
def test_a_more_open_candidate_takes_over_only_beyond_three_times_the_noise(
    opener: Candidate, stricter: Candidate
) -> None:
    """Opening the gate (to admit everything, or to no horizon: every block offered twice,
    however long ago) floods the tier, which no switch back undoes: the lead must be
    FLOOD_NOISE (3) times the noise. A stricter gate needs once the noise."""
    duel = MiniatureDuel(16)
    gate = model_of(duel, duel.leader)
    flood = model_of(duel, opener)
    back = model_of(duel, stricter)
    assert gate.candidate.horizon == 2
    gate.hits, flood.hits = 100.0, 140.0  # 40: 2.6 times sqrt(240)
    duel.run([10**9], False)
    assert duel.leader == gate.candidate
    flood.hits = 160.0  # 60: 3.8 times sqrt(260)
    duel.run([10**9 + 1], False)
    assert duel.leader == opener
    back.hits = 185.0  # back to a stricter gate: 25 ahead, 1.4 times sqrt(345)
    duel.run([10**9 + 2], False)
    assert duel.leader == stricter


def test_openness_ranks_a_horizon_below_none_below_admitting_everything() -> None:
    assert [Candidate(h, 0.25).openness for h in (1, 2, inf, None)] == [0, 0, 1, 2]
    assert Candidate(2, 0.25, True).openness == Candidate(2, 0.25).openness


def test_a_sampled_model_demotes_a_stored_block_only_where_the_prompt_ends() -> None:
    duel = MiniatureDuel(4 * MODEL_SLOTS)  # one block in four
    mask = sampling_rate(4 * MODEL_SLOTS) - 1
    assert mask == 3
    ends = [b for b in range(10**6, 10**6 + 200) if sampled([b], mask)]
    middles = [b for b in range(2 * 10**6, 2 * 10**6 + 200) if not sampled([b], mask)]
    model = duel.models[1]  # admit-everything: every block is stored
    assert model.candidate.horizon is None
    duel.run([ends[0], ends[1]], False)  # the prompt ends in a sampled block
    duel.run([ends[2], ends[3], middles[0]], False)  # it ends in a block the sample leaves out
    assert list(model.probation) == [ends[1], ends[0], ends[3], ends[2]]


def test_admit_everything_takes_over_from_a_gate_once_its_lead_beyond_the_noise_lasts() -> None:
    """A lead of once to three times the noise that lasts FLOOD_TURNOVERS model turnovers is
    the workload's; one that dips to the noise must start again."""
    duel = MiniatureDuel(16)  # no sampling: one model slot per tier slot
    slots = duel.models[0].slots
    gate = model_of(duel, duel.leader)
    everything = model_of(duel, Candidate(None, 0.5))
    unseen = iter(range(10**9, 2 * 10**9))  # requests no model holds: the counts only decay
    gate.hits, everything.hits = 100.0, 125.0  # 25: 1.7 times sqrt(225)
    for _ in range(FLOOD_TURNOVERS * slots // 2):
        duel.run([next(unseen)], False)
    assert duel.leader == gate.candidate
    everything.hits = gate.hits  # the lead dips to nothing: it must last afresh
    duel.run([next(unseen)], False)
    everything.hits = gate.hits + 1.7 * sqrt(2 * gate.hits)
    duel.run([next(unseen)], False)  # the lead starts here
    for _ in range(FLOOD_TURNOVERS * slots - 1):
        duel.run([next(unseen)], False)
        assert duel.leader == gate.candidate
    duel.run([next(unseen)], False)  # it has lasted FLOOD_TURNOVERS turnovers
    assert duel.leader == everything.candidate


def slru_tier(capacity: int) -> tuple[CPUOffloadingManager, GatedLRUCachePolicy]:
    """A gated tier whose only model is admit-all SLRU: it leads from the first request."""
    manager = CPUOffloadingManager(16, capacity, "gated")
    policy = manager.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    policy.duel.models = [Miniature(capacity, SLRU)]
    return manager, policy


def test_the_tier_keeps_reused_blocks_through_a_scan_under_slru() -> None:
    manager, policy = slru_tier(8)
    replay(manager, [1, 2])
    assert replay(manager, [1, 2]) == 2
    assert policy.duel.leader == SLRU
    for start in (100, 200):  # one-off prompts that fill the rest of the tier twice over
        replay(manager, list(range(start, start + 6)))
    assert replay(manager, [1, 2]) == 2
    assert manager.invariant_violations() == []


def test_the_protected_segment_gives_way_when_probation_has_no_idle_block() -> None:
    manager, _ = slru_tier(4)
    replay(manager, [1, 2])
    replay(manager, [1, 2])  # 1 and 2 reused: protected, 1 newest
    replay(manager, [3, 4])
    manager.prepare_load([3, 4])  # probation's blocks are being read
    out = manager.prepare_store([5])
    assert out is not None and out.block_hashes_evicted == [2]  # the chain's tail first
    assert manager.invariant_violations() == []


def test_a_finished_request_protects_only_the_blocks_it_found_stored() -> None:
    manager, policy = slru_tier(8)
    replay(manager, [1, 2])
    replay(manager, [3])  # the models learn nothing yet; SLRU leads
    policy.finish([1, 2, 3], reused={1, 2})
    for start in (100, 200):  # one-off prompts: room for them only in probation
        replay(manager, list(range(start, start + 5)))
    assert 1 in policy.blocks and 2 in policy.blocks and 3 not in policy.blocks


def test_the_duel_reports_each_candidates_recent_hit_ratio_and_its_switches() -> None:
    duel = MiniatureDuel(16)
    assert [ratio for _, ratio in duel.hit_ratios()] == [0.0] * len(CANDIDATES)
    for request in quick_returns():
        duel.run(request, False)
    ratios = dict(duel.hit_ratios())
    assert list(ratios) == list(CANDIDATES)
    # Every prompt but the first finds its first block stored: at most half of all blocks.
    assert 0 < ratios[Candidate(None, 0.5)] <= 0.5
    assert ratios[Candidate(None, 0.5)] > ratios[CANDIDATES[0]]
    assert duel.switches >= 1 and duel.leader.horizon is None
    duel.clear()
    assert duel.switches == 0
    assert [ratio for _, ratio in duel.hit_ratios()] == [0.0] * len(CANDIDATES)
