"""Shared prefixes: which resident chains hits continue in more than one way, and the
gated tier keeping them protected ahead of a single chain's blocks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from offload.cpu.policies.gated_lru import SHARED_AGE_FACTOR
from offload.cpu.policies.shared_prefix import SharedPrefixes
from offload.sim.workload import run_request as replay
from tests.offload.test_miniature import slru_tier


def test_a_hit_that_goes_on_where_the_last_one_did_shares_nothing() -> None:
    prefixes = SharedPrefixes()
    prefixes.note_hit([1, 2, 3, 4], 3)  # a conversation's next turn
    prefixes.note_hit([1, 2, 3, 4, 5], 4)  # and the one after: it goes on as before
    assert not any(block in prefixes for block in (1, 2, 3, 4, 5))


def test_a_hit_that_goes_on_another_way_shares_its_whole_prefix() -> None:
    prefixes = SharedPrefixes()
    prefixes.note_hit([1, 2, 3, 4], 3)  # 2 was continued into 3
    prefixes.note_hit([1, 2, 7], 2)  # a request stops its hit at 2 and goes on to 7
    assert 1 in prefixes and 2 in prefixes
    assert 3 not in prefixes and 7 not in prefixes


def test_a_hit_to_the_end_of_its_request_or_past_an_unknown_block_shares_nothing() -> None:
    whole, unknown = SharedPrefixes(), SharedPrefixes()
    whole.note_hit([1, 2, 3], 3)  # hit whole: it goes on nowhere
    whole.note_hit([1, 2, 3], 3)
    unknown.note_hit([1, 2, 9], 2)  # no hit continued past 2 before
    unknown.note_hit([5, 6], 0)  # no hit at all
    assert whole.tracked() == {1, 2} and unknown.tracked() == {1}
    assert not any(block in whole or block in unknown for block in (1, 2, 3, 5, 6, 9))


def test_forgetting_a_block_drops_all_that_was_learnt_about_it() -> None:
    prefixes = SharedPrefixes()
    prefixes.note_hit([1, 2, 3], 3)
    prefixes.note_hit([1, 2, 4], 2)
    assert 1 in prefixes and prefixes.tracked() == {1, 2}
    prefixes.forget(1)
    prefixes.forget(8)  # never seen: nothing to forget
    assert 1 not in prefixes and prefixes.tracked() == {2}
    prefixes.clear()
    assert prefixes.tracked() == set()


def test_the_tier_demotes_a_single_chain_before_an_older_shared_prefix() -> None:
    manager, policy = slru_tier(8)  # admit everything, half the tier protected: 4 slots
    replay(manager, [1, 2, 10])
    replay(manager, [1, 2, 10, 11])  # 1, 2 and 10 reused; a hit continued 2 into 10
    replay(manager, [1, 2, 20])  # another request stops at 2 and goes on to 20
    assert 1 in policy.shared_prefixes and 10 not in policy.shared_prefixes
    for chain in ([30, 31, 32], [40, 41, 42]):  # two other chains, each reused: newer
        replay(manager, chain)
        replay(manager, chain)
    assert list(policy._shared) == [2, 1]
    assert len(policy._protected) + len(policy._shared) == 4  # 10 and 30, 31, 32 gave way
    for start in (100, 200):  # one-off prompts that flush the probation segment
        replay(manager, list(range(start, start + 4)))
    assert manager.lookup([1, 2]) == 2
    assert manager.lookup([30, 31, 32]) == 0
    assert manager.invariant_violations() == []


def test_a_shared_prefix_no_chain_uses_gives_way_once_far_older_than_the_others() -> None:
    manager, policy = slru_tier(8)
    replay(manager, [1, 2, 10])
    replay(manager, [1, 2, 10, 11])
    replay(manager, [1, 2, 20])
    assert list(policy._shared) == [2, 1]
    prompts = [30, 31, 32, 33]  # more than the protected segment's other slots
    for prompt in prompts:  # stored, then reused
        replay(manager, [prompt])
        replay(manager, [prompt])
    for turn in range(8 * SHARED_AGE_FACTOR):  # reused in turn, none through 1 and 2
        assert replay(manager, [prompts[turn % len(prompts)]]) == 1
    assert not policy._shared  # older than SHARED_AGE_FACTOR times the others: demoted
    for start in (100, 200):
        replay(manager, list(range(start, start + 4)))
    assert manager.lookup([1, 2]) == 0
    assert manager.invariant_violations() == []


def test_only_blocks_a_request_found_stored_make_its_hit() -> None:
    manager, policy = slru_tier(8)
    replay(manager, [1, 2, 3])
    replay(manager, [1, 2, 3, 4])  # a hit continued 2 into 3
    policy.finish([1, 2, 5], reused={1})  # 2 was resident but not loaded: the hit is 1 alone
    assert 1 not in policy.shared_prefixes
    policy.finish([1, 2, 5], reused={1, 2})
    assert 1 in policy.shared_prefixes and 2 in policy.shared_prefixes


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 40), min_size=1, max_size=6).map(lambda t: [0, *t]),
        min_size=1,
        max_size=80,
    )
)
def test_what_the_tier_learns_of_shared_prefixes_is_about_resident_blocks_only(
    requests: list[list[int]],
) -> None:
    manager, policy = slru_tier(6)
    for request in requests:
        replay(manager, list(dict.fromkeys(request)))
        assert policy.shared_prefixes.tracked() <= policy.blocks.keys()
        assert set(policy._shared) <= set(policy.shared_prefixes.tracked())
        assert len(policy._protected) + len(policy._shared) <= policy._protected_slots
    assert manager.invariant_violations() == []
    policy.reset()
    assert policy.shared_prefixes.tracked() == set()
