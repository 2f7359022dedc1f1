"""Run vLLM 0.33.0's own manager tests against kvscope's manager.

``test_vllm_manager.py`` is vLLM's ``tests/v1/kv_offload/cpu/test_manager.py``,
fetched unchanged by ``make test`` (tests/vllm/fetch_upstream.py) and never
committed. Each of its tests builds managers through its module-level name
``CPUOffloadingManager``; here that name builds kvscope's manager the way
vLLM does (its factory, kvscope's spec, ``get_manager()``).

Tests that read or patch vLLM's private fields (``manager._policy``,
``policy.t1``, ``_num_evictable_cache_chunks`` ...) test vLLM's
implementation, not the interface, and are listed below with the field
they need; every other test must pass.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.tooling.vllm_config import kvscope_manager

PRIVATE = {
    "test_cpu_manager_reports_allocation_size_on_allocation_failure": "patches _allocate_chunks",
    "test_lru_batch_eviction_failure_is_atomic": "calls manager._policy.evict",
    "test_lru_repeated_pin_cycles_compact_lazy_heap_entries": "reads policy._heap",
    "test_reset_discards_stale_request_access_classification": "reads ARC's policy.t1/t2",
    "TestARCPolicy": "reads ARC's policy.t1/t2/b1/b2 and target_t1_size",
    "test_evictable_cache_chunk_count": "reads _num_evictable_cache_chunks",
    "test_touch_forwards_req_context_to_policy": "patches manager._policy.touch",
    "test_arc_counts_reuse_once_and_keeps_insertions_in_t1": "reads ARC's policy.t1/t2",
    "test_arc_reuse_wins_if_same_request_later_reinserts_key": "reads ARC's policy.t1/t2",
    "test_request_finish_forwards_grouped_deduplicated_accesses": "patches manager._policy",
    "test_failed_store_records_access_once_and_uses_store_miss_hook": "patches private hooks",
    "test_arc_ghost_hit_adapts_once_per_request_before_insertion": "reads ARC's policy.b1",
    "test_arc_pending_chunk_is_not_a_frequency_hit": "reads ARC's policy.t1/t2",
    "test_lru_insert_orders_positioned_chunks_without_followup_access": "builds vLLM's LRU",
    "test_cpu_manager_reports_no_config_info_without_info": "builds a manager without a spec",
}
"""vLLM's tests of vLLM's private fields, with the field each one needs."""

ZERO_CAPACITY = "kvscope refuses a tier of 0 chunks at start-up (a clear error) instead"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = item.originalname if isinstance(item, pytest.Function) else item.name
        owner = item.cls.__name__ if item.cls is not None else None
        reason = PRIVATE.get(name) or (PRIVATE.get(owner) if owner else None)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"vLLM private field: {reason}"))
        elif name == "test_cpu_manager_reports_cache_usage_gauge":
            item.add_marker(pytest.mark.skip(reason=ZERO_CAPACITY))


def _built_by_vllm_factory(num_chunks: int, **options: Any) -> Any:
    options.pop("cache_policy_module_path", None)
    return kvscope_manager(num_chunks, **options)


@pytest.fixture(autouse=True)
def kvscope_behind_vllm_names(request: pytest.FixtureRequest) -> None:
    """vLLM's test module builds kvscope's manager wherever it names its own."""
    request.module.CPUOffloadingManager = _built_by_vllm_factory
