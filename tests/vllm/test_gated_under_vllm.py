"""The gated policy inside vLLM 0.33: its models see each request whole.

vLLM's connector never calls ``touch``: a request's hits reach the policy as a
load, its new blocks as an offer, both naming the request. The duel's models
must see the two together, as the replay's touch shows them, or they would
never count a hit.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import make_offload_key

from bench.tooling.vllm_config import kvscope_manager
from bench.vllm_connector_hits import connector_request
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy


def test_the_models_count_the_hits_vllm_loads() -> None:
    manager = kvscope_manager(64, "gated")
    policy = manager.core.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    assert connector_request(manager, "first", list(range(8))) == 0
    assert all(model.hits == 0 for model in policy.duel.models)
    assert connector_request(manager, "second", [*range(8), 100, 101]) == 8  # then 2 new
    assert all(model.hits == 8 for model in policy.duel.models)
    assert not policy._met, "every request's blocks reached the models by its end"


def test_a_prefix_that_hits_continue_two_ways_is_shared_through_vllms_calls() -> None:
    manager = kvscope_manager(64, "gated")
    policy = manager.core.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    connector_request(manager, "document", [*range(4), 10])
    assert connector_request(manager, "its next turn", [*range(4), 10, 11]) == 5  # on into 10
    assert not any(key in policy.shared_prefixes for key in policy.blocks)
    assert connector_request(manager, "another", [*range(4), 20]) == 4  # stops at 3, on to 20
    shared = {key for key in policy.blocks if key in policy.shared_prefixes}
    assert shared == {make_offload_key(h.to_bytes(8, "big"), 0) for h in range(4)}
    assert shared <= set(policy._shared), "reused, so protected"
