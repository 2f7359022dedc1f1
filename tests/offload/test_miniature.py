"""Miniature simulations: prefix-aware models of the tier, and the duel that follows the best."""

from __future__ import annotations

from offload import CPUOffloadingManager
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.cpu.policies.miniature import (
    HORIZONS,
    MODEL_SLOTS,
    Miniature,
    MiniatureDuel,
    sampling_rate,
)
from offload.cpu.policies.offer_history import OFFERS_PER_SLOT


def test_a_model_counts_the_leading_run_only() -> None:
    model = Miniature(8, None)
    model.run([1, 2, 3], 1.0)
    model.run([4], 1.0)
    model.run([1, 9, 3], 1.0)  # 3 is held, but behind the missing 9 no lookup reaches it
    assert model.hits == 1
    model.run([1, 9, 3], 1.0)
    assert model.hits == 1 + 3


def test_a_model_evicts_the_oldest_and_its_last_stored_block_first() -> None:
    model = Miniature(3, None)
    model.run([1, 2], 1.0)
    model.run([5, 6], 1.0)  # 6 ends a prompt: first to go; 2 likewise, and older
    assert list(model.resident) == [6, 1, 5]


def test_a_gated_model_refuses_first_offers_once_full() -> None:
    model = Miniature(2, 2)
    model.run([1, 2], 1.0)  # free slots: admitted
    model.run([3], 1.0)  # full, and no residency known yet: admitted, one evicted
    model.run([4, 5], 1.0)  # first offers: refused, the chain stops at 4
    assert 4 not in model.resident and 5 not in model.resident
    model.run([4], 1.0)  # offered again at once: within the horizon
    assert 4 in model.resident


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
        duel.run(request)
    assert duel.horizon is None


def test_the_duel_follows_a_gate_when_first_offers_never_come_back() -> None:
    duel = MiniatureDuel(24)
    for request in hot_set_and_one_offs():
        duel.run(request)
    assert duel.horizon is not None


def test_the_tier_applies_the_leaders_horizon() -> None:
    manager = CPUOffloadingManager(16, 16, "gated")
    policy = manager.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    assert policy.duel.horizon == HORIZONS[0]
    for request in quick_returns():
        hits = manager.lookup(request)
        if hits:
            manager.prepare_load(request[:hits])
            manager.touch(request)
            manager.complete_load(request[:hits])
        out = manager.prepare_store(request[hits:])
        assert out is not None
        manager.complete_store(out.block_hashes_to_store)
    assert policy.duel.horizon is None
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
        assert len(duel.models) == len(HORIZONS)


def test_models_stay_within_their_bounds() -> None:
    duel = MiniatureDuel(8)
    for start in range(0, 20 * OFFERS_PER_SLOT * 8, 5):
        duel.run(list(range(start, start + 5)))
        for model in duel.models:
            assert len(model.resident) <= model.slots
            assert len(model.offers) <= model.offers.limit
