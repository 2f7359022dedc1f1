"""The gated policy inside vLLM 0.33: its models see each request whole.

vLLM's connector never calls ``touch``: a request's hits reach the policy as a
load, its new blocks as an offer, both naming the request. The duel's models
must see the two together, as the replay's touch shows them, or they would
never count a hit.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

from bench.tooling.vllm_config import kvscope_manager
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy


def _request(manager, req_id: str, hashes: list[int]) -> None:
    """One request as vLLM's scheduler runs it: lookups, the hits' load, one offer, the end."""
    keys = [make_offload_key(h.to_bytes(8, "big"), 0) for h in hashes]
    ctx = ReqContext(req_id=req_id)
    for place, key in enumerate(keys, 1):
        ctx.set_offload_key_position(key, place * 16)
    manager.on_new_request(ctx)
    hits = 0
    for key in keys:
        if manager.lookup(key, ctx) is not LookupResult.HIT:
            break
        hits += 1
    if hits:
        manager.prepare_load(keys[:hits], ctx)
    out = manager.prepare_store(keys[hits:], ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    if hits:
        manager.complete_load(keys[:hits], ctx)
    manager.on_request_finished(ctx)


def test_the_models_count_the_hits_vllm_loads() -> None:
    manager = kvscope_manager(64, "gated")
    policy = manager.core.policy
    assert isinstance(policy, GatedLRUCachePolicy)
    _request(manager, "first", list(range(8)))
    assert all(model.hits == 0 for model in policy.duel.models)
    _request(manager, "second", [*range(8), 100, 101])  # 8 hits, loaded, then 2 new blocks
    assert all(model.hits == 8 for model in policy.duel.models)
    assert not policy._met, "every request's blocks reached the models by its end"
