"""Stores and loads that fail part way under vLLM 0.33's connector.

vLLM's scheduler hears the error (vLLM's own manager propagates it too). A store that a
plug-in policy fails keeps what the policy observed of its request, as vLLM's manager
records the request before storing; nothing else counts for the store that did not
happen: not the offers the reuse threshold counts, its skips, nor the allocation size. A
retry is then the first try, as a twin manager that was never asked shows. A load that
fails leaves no block pinned for a load vLLM will never complete.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import pytest
from vllm.v1.kv_offload.base import ReqContext, make_offload_key

from bench.tooling.vllm_config import kvscope_manager
from offload.cpu.policies import LRUCachePolicy
from offload.vllm.manager import KVScopeManager
from offload.vllm.request_access import RequestAccess
from tests.support.plugin_policy import registered


class EvictsUnlessTold(LRUCachePolicy):
    """LRU whose eviction raises while ``fails``: a plug-in whose own store went away."""

    name = "evicts-unless-told"
    fails = False

    def evict(self, n: int, protected: Container) -> Any:
        if self.fails:
            raise OSError("the policy's own store is gone")
        return super().evict(n, protected)


KEYS = [make_offload_key(bytes([place]) * 8, 0) for place in range(5)]
A, B, C, D, X = KEYS
PUBLISHING = {"kvscope_endpoint": "tcp://127.0.0.1:*", "sample_rate": 1}
"""kvscope's publisher on, sampling every block: offers are the sample's references too."""


def full_tier(extra: dict) -> tuple[KVScopeManager, ReqContext]:
    """Two slots holding A and B (each stored at its second offer, the reuse threshold's),
    and C and D offered once; the context of the request that offers them next."""
    with registered(EvictsUnlessTold):
        manager = kvscope_manager(2, EvictsUnlessTold.name, True, store_threshold=2, **extra)
    first = ReqContext(req_id="first")
    manager.prepare_store([A, B], first)
    stored = manager.prepare_store([A, B], first)
    assert stored is not None
    manager.complete_store(stored.keys_to_store, first)
    assert manager.prepare_store([C, D], ReqContext(req_id="second")).keys_to_store == []
    manager.get_stats()
    return manager, ReqContext(req_id="third")


@pytest.mark.parametrize("extra", [{}, PUBLISHING], ids=["alone", "publishing"])
def test_a_store_the_policy_fails_counts_nothing_and_its_retry_is_the_first_try(
    extra: dict,
) -> None:
    failing, failing_request = full_tier(extra)
    twin, twin_request = full_tier(extra)
    try:
        policy = failing.core.policy.inner
        policy.fails = True
        # C and D reach the threshold and need A's and B's slots; X is offered the first time.
        with pytest.raises(OSError, match="own store is gone"):
            failing.prepare_store([C, D, X], failing_request)
        assert failing.counts == twin.counts
        assert failing.get_stats().data == twin.get_stats().data
        policy.fails = False
        retried = failing.prepare_store([C, D, X], failing_request)
        first = twin.prepare_store([C, D, X], twin_request)
        assert retried is not None and first is not None
        assert (retried.keys_to_store, retried.evicted_keys) == (first.keys_to_store, [A, B])
        assert failing.counts == twin.counts
        assert failing.get_stats().data == twin.get_stats().data
        assert list(failing.take_events()) == list(twin.take_events())
        # The sample's references of the request: the offer once, not once per try.
        sampled = [C, D, X] if extra else []
        for request in (failing_request, twin_request):
            assert request.get_state(RequestAccess).referenced == sampled
    finally:
        failing.shutdown()
        twin.shutdown()


def test_a_load_whose_request_the_policy_cannot_place_pins_nothing() -> None:
    """LRU places a request's blocks by their positions, and refuses one outside [0, 2**48)
    when the request first meets it: in a load that came after the pins, so the load vLLM
    never completes held its blocks for good, counted and never evictable."""
    manager = kvscope_manager(2, "lru", True)
    writer = ReqContext(req_id="writer")
    stored = manager.prepare_store([A, B], writer)
    assert stored is not None
    manager.complete_store(stored.keys_to_store, writer)
    reader = ReqContext(req_id="reader")
    reader.set_offload_key_position(A, 2**48)
    with pytest.raises(ValueError, match=r"outside \[0, 2\*\*48\)"):
        manager.prepare_load([A, B], reader)
    stats = manager.core.stats
    assert (stats.load_blocks, stats.loads_in_flight, stats.blocks_pinned_by_loads) == (0, 0, 0)
    # Nor are they recorded as met: the policy observes them when the load is retried.
    access = reader.get_state(RequestAccess)
    assert access is not None and not access.seen
    reader.set_offload_key_position(A, 16)
    manager.prepare_load([A, B], reader)
    assert list(access.seen) == [A, B] and stats.blocks_pinned_by_loads == 2
    manager.complete_load([A, B], reader)
    # Nothing holds A and B: new blocks take their slots.
    taken = manager.prepare_store([C, D], ReqContext(req_id="next"))
    assert taken is not None and sorted(taken.evicted_keys) == [A, B]
