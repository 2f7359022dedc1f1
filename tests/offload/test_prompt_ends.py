"""PromptEnds: which stores ended in a block a recent store ended in, within its bound."""

from __future__ import annotations

import pytest

from offload import CPUOffloadingManager
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.cpu.policies.prompt_ends import PromptEnds
from offload.sim.workload import run_request as replay


def test_an_end_is_known_the_second_time_only() -> None:
    ends = PromptEnds(4)
    assert not ends.ended_before(7)
    assert ends.ended_before(7)
    assert not ends.ended_before(8)


def test_the_least_recent_end_is_forgotten_first() -> None:
    ends = PromptEnds(2)
    ends.ended_before(1)
    ends.ended_before(2)
    assert ends.ended_before(1)  # 1 is now the most recent
    ends.ended_before(3)  # over the limit: 2 goes
    assert len(ends) == 2
    assert ends.ended_before(1)
    assert not ends.ended_before(2)


def test_a_negative_limit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="limit"):
        PromptEnds(-1)


def test_the_tier_remembers_at_most_one_end_per_slot_and_forgets_them_on_reset() -> None:
    manager = CPUOffloadingManager(16, 8, "gated")
    for start in range(0, 400, 2):
        replay(manager, [start, start + 1])
    policy = manager.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    assert len(policy.prompt_ends) == 8
    policy.reset()
    assert len(policy.prompt_ends) == 0
