"""The manager contract (docs/ARCHITECTURE.md, "Contracts"), case by case, for every policy."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest

from offload import CPUOffloadingManager, OffloadingEvent, policy_names
from offload.cpu import block_pool
from tests.support.plugin_policy import PluginLRU, registered
from tests.support.stores import stored

POLICIES = [*policy_names(), PluginLRU.name]
"""Every built-in policy, and one registered from outside (it runs behind the guard)."""


def snapshot(manager: CPUOffloadingManager) -> dict:
    """Everything observable about the tier's state, the policy's recency order included."""
    policy = getattr(manager.policy, "inner", manager.policy)
    return {
        "blocks": {h: (b.slot, b.ref) for h, b in manager.policy.blocks.items()},
        "free": sorted(manager.pool.free_slots()),
        "order": {k: list(v) for k, v in vars(policy).items() if isinstance(v, dict)},
    }


@pytest.fixture(params=POLICIES)
def policy(request: pytest.FixtureRequest) -> Iterator[str]:
    with registered(PluginLRU):
        yield request.param


def test_lookup_counts_the_leading_run_and_stops_at_the_first_miss(policy: str) -> None:
    manager = CPUOffloadingManager(16, 8, policy)
    stored(manager, [1, 2, 3])
    assert manager.lookup([1, 2, 3]) == 3
    assert manager.lookup([1, 2, 9, 3]) == 2
    assert manager.lookup([9, 1, 2]) == 0
    assert manager.lookup([]) == 0


def test_blocks_not_ready_are_invisible_to_lookup_and_load(policy: str) -> None:
    manager = CPUOffloadingManager(16, 8, policy)
    out = manager.prepare_store([1, 2])
    assert out is not None and out.block_hashes_to_store == [1, 2]
    assert manager.lookup([1, 2]) == 0
    with pytest.raises(ValueError, match="store is not complete"):
        manager.prepare_load([1])
    manager.complete_store([1, 2])
    assert manager.lookup([1, 2]) == 2


def test_store_skips_blocks_already_stored_and_dedupes_within_a_call(policy: str) -> None:
    manager = CPUOffloadingManager(16, 8, policy)
    stored(manager, [1, 2])
    out = manager.prepare_store([1, 2, 3, 3, 4, 3])
    assert out is not None
    assert out.block_hashes_to_store == [3, 4]
    assert len(out.store_spec.block_ids) == 2
    assert len(set(out.store_spec.block_ids)) == 2
    assert manager.prepare_store([1, 2]).block_hashes_to_store == []  # type: ignore[union-attr]


def test_store_spec_names_distinct_cpu_slots_within_capacity(policy: str) -> None:
    manager = CPUOffloadingManager(16, 4, policy)
    out = manager.prepare_store(["a", "b", "c", "d"])
    assert out is not None
    assert sorted(out.store_spec.block_ids) == [0, 1, 2, 3]
    assert out.store_spec.medium() == "CPU"


def test_a_large_tier_takes_memory_for_its_slots_only_as_they_fill(policy: str) -> None:
    """16M slots cost the pool nothing per slot until handed out (vLLM's pool counts them)."""
    tracemalloc.start()
    try:
        manager = CPUOffloadingManager(16, 2**24, policy)
        stored(manager, range(1000))
        pool = tracemalloc.Filter(True, block_pool.__file__)
        taken = tracemalloc.take_snapshot().filter_traces([pool]).statistics("filename")
    finally:
        tracemalloc.stop()
    assert sum(stat.size for stat in taken) < 1 << 20, taken
    assert sorted(b.slot for b in manager.policy.blocks.values()) == list(range(1000))
    assert manager.pool.num_free == 2**24 - 1000
    assert manager.live_invariant_violations() == []


def test_unused_slots_come_lowest_first_and_a_reset_makes_every_slot_unused(
    policy: str,
) -> None:
    """vLLM's own order, so a store gets the same slot ids under either manager."""
    manager = CPUOffloadingManager(16, 6, policy)
    stored(manager, [1, 2, 3, 4])
    manager.reset()
    out = manager.prepare_store([5, 6])
    assert out is not None
    assert list(out.store_spec.block_ids) == [0, 1]
    manager.complete_store([5, 6])
    out = manager.prepare_store([7, 8, 9, 10])
    assert out is not None
    assert list(out.store_spec.block_ids) == [2, 3, 4, 5]


def test_lru_evicts_least_recently_used_first() -> None:
    manager = CPUOffloadingManager(16, 3, "lru")
    stored(manager, [1])
    stored(manager, [2])
    stored(manager, [3])
    manager.touch([1])
    assert stored(manager, [4]) == [2]
    assert stored(manager, [5]) == [3]
    assert manager.lookup([1]) == 1


def test_touch_keeps_a_chain_head_longer_than_its_tail() -> None:
    manager = CPUOffloadingManager(16, 3, "lru")
    stored(manager, [1, 2, 3])
    manager.touch([1, 2, 3])  # tail-first: 1 ends most recent
    assert stored(manager, [7]) == [3]
    assert stored(manager, [8]) == [2]


def unstorable(manager: CPUOffloadingManager, hashes: list, not_stored: int) -> None:
    """The store stores nothing: refused for want of room, or (a gating policy) not admitted.

    Either way nothing is evicted; a policy that admits the blocks must refuse the store.
    """
    refused_before = manager.stats.store_not_admitted_blocks
    out = manager.prepare_store(hashes)
    if out is not None:
        assert out.block_hashes_to_store == [] and out.block_hashes_evicted == []
        assert manager.stats.store_not_admitted_blocks - refused_before == not_stored


def test_blocks_being_read_are_never_evicted(policy: str) -> None:
    manager = CPUOffloadingManager(16, 2, policy)
    stored(manager, [1, 2])
    manager.prepare_load([1])
    assert stored(manager, [3]) == [2]
    # Only 1 (pinned) and 3 remain; room for two more cannot be made.
    unstorable(manager, [4, 5], not_stored=2)
    manager.complete_load([1])
    # Offered again at once, the blocks pass any reuse gate; now room can be made.
    assert sorted(stored(manager, [4, 5])) == [1, 3]


def test_blocks_not_yet_ready_are_never_evicted(policy: str) -> None:
    manager = CPUOffloadingManager(16, 2, policy)
    pending = manager.prepare_store([1, 2])
    assert pending is not None
    assert manager.prepare_store([3]) is None
    manager.complete_store([1])
    out = manager.prepare_store([3])
    assert out is not None and out.block_hashes_evicted == [1]


def test_blocks_named_in_the_same_call_are_never_evicted(policy: str) -> None:
    manager = CPUOffloadingManager(16, 2, policy)
    stored(manager, [1, 2])
    # 1 is the only candidate by age, but this call names it: 2 goes instead.
    manager.touch([2])
    out = manager.prepare_store([1, 3])
    assert out is not None
    assert out.block_hashes_to_store == [3]
    assert out.block_hashes_evicted == [2]
    unstorable(manager, [1, 3, 4], not_stored=1)


def test_refusal_changes_nothing_and_emits_nothing(policy: str) -> None:
    manager = CPUOffloadingManager(16, 3, policy, enable_events=True)
    stored(manager, [1, 2, 3])
    manager.prepare_load([1, 2])
    manager.take_events()
    before = snapshot(manager)
    assert manager.prepare_store([4, 5]) is None
    assert snapshot(manager) == before
    assert manager.take_events() == []
    manager.complete_load([1, 2])
    assert manager.lookup([1, 2, 3]) == 3


def test_failed_store_rolls_back_and_frees_its_slots(policy: str) -> None:
    manager = CPUOffloadingManager(16, 3, policy, enable_events=True)
    stored(manager, [1])
    manager.take_events()
    out = manager.prepare_store([2, 3])
    assert out is not None
    manager.complete_store([1, 2, 3], success=False)
    assert manager.lookup([1]) == 1  # a ready block named in a failed store stays
    assert manager.lookup([2]) == 0
    assert set(manager.policy.blocks) == {1}
    assert manager.pool.num_free == 2
    assert manager.take_events() == []
    assert stored(manager, [2, 3]) == []


def test_complete_store_ignores_unknown_and_ready_blocks(policy: str) -> None:
    manager = CPUOffloadingManager(16, 4, policy, enable_events=True)
    stored(manager, [1])
    manager.take_events()
    manager.complete_store([1, 99])
    assert manager.take_events() == []


def test_events_report_evictions_and_stores_in_order(policy: str) -> None:
    manager = CPUOffloadingManager(16, 2, policy, enable_events=True)
    stored(manager, [b"a", b"b"])
    (victim,) = stored(manager, [b"c"])  # which one is the policy's choice
    assert victim in (b"a", b"b")
    events = manager.take_events()
    assert events == [
        OffloadingEvent([b"a", b"b"], 16, "CPU", removed=False),
        OffloadingEvent([victim], 16, "CPU", removed=True),
        OffloadingEvent([b"c"], 16, "CPU", removed=False),
    ]
    assert manager.take_events() == []


def test_events_are_off_unless_enabled(policy: str) -> None:
    manager = CPUOffloadingManager(16, 2, policy)
    stored(manager, [1, 2])
    stored(manager, [3])
    assert manager.take_events() == []


def test_load_pins_until_every_load_completes(policy: str) -> None:
    manager = CPUOffloadingManager(16, 2, policy)
    stored(manager, [1, 2])
    spec = manager.prepare_load([1, 1, 2])
    assert len(spec.block_ids) == 3
    assert manager.policy.blocks[1].ref == 2
    manager.complete_load([1, 2])
    assert manager.policy.blocks[1].ref == 1
    assert manager.prepare_store([3, 4]) is None  # 1 still read
    manager.complete_load([1])
    assert manager.policy.blocks[1].ref == 0


def test_load_of_a_missing_block_is_a_clear_error_that_changes_nothing(policy: str) -> None:
    manager = CPUOffloadingManager(16, 4, policy)
    stored(manager, [1, 2])
    before = snapshot(manager)
    with pytest.raises(ValueError, match="block 7: not in the CPU tier"):
        manager.prepare_load([1, 7, 2])
    assert snapshot(manager) == before


def test_completing_a_load_never_started_is_an_error_that_changes_nothing(policy: str) -> None:
    manager = CPUOffloadingManager(16, 4, policy)
    stored(manager, [1, 2])
    manager.prepare_load([1])
    before = snapshot(manager)
    with pytest.raises(ValueError, match="block 2: no load in flight"):
        manager.complete_load([1, 2])
    assert snapshot(manager) == before
    with pytest.raises(ValueError, match="block 1: no load in flight"):
        manager.complete_load([1, 1])
    assert snapshot(manager) == before
    with pytest.raises(ValueError, match="not in the CPU tier"):
        manager.complete_load([5])


@pytest.mark.parametrize(
    ("call", "hashes"),
    [("lookup", [[4, 5], 1]), ("prepare_store", [3, [4, 5]])],  # lookup stops at a miss
)
def test_an_unhashable_block_hash_is_refused_before_anything_changes(
    policy: str, call: str, hashes: list
) -> None:
    manager = CPUOffloadingManager(16, 2, policy)
    stored(manager, [1, 2])
    before = snapshot(manager), vars_of(manager.stats)
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        getattr(manager, call)(hashes)
    assert (snapshot(manager), vars_of(manager.stats)) == before


def test_a_touch_refused_part_way_leaves_the_policy_whole_and_working(policy: str) -> None:
    """A touch raises at an unhashable hash after moving the hashes walked before it (the
    manager's documented limit, walking tail first). The gated policy kept the bad list for
    its models and failed every later touch and store until a reset; the LRU's clock stayed
    behind the ranks it had given, so the next use ranked below them."""
    manager = CPUOffloadingManager(16, 4, policy)
    stored(manager, [1, 2, 3])
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        manager.touch([1, 9, [5], 2, 3])  # 3 and 2 are walked, then the list refused
    manager.touch([1])
    assert manager.invariant_violations() == []
    out = manager.prepare_store([4, 5])
    assert out is not None and out.block_hashes_evicted == [3]  # the least recently used


@pytest.mark.parametrize("success", [True, False])
def test_completing_a_store_with_an_unhashable_hash_changes_nothing(
    policy: str, success: bool
) -> None:
    """Part way through, the blocks before the bad hash must not stay ready, or freed."""
    manager = CPUOffloadingManager(16, 4, policy, enable_events=True)
    manager.prepare_store([1, 2, 3])
    before = snapshot(manager), vars_of(manager.stats)
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        manager.complete_store([1, 2, [9]], success=success)
    assert (snapshot(manager), vars_of(manager.stats)) == before
    assert manager.take_events() == []
    assert manager.invariant_violations() == []


def vars_of(stats: object) -> dict[str, object]:
    """Every counter of a ManagerStats (a __slots__ class), the histogram's buckets included."""
    values = {name: getattr(stats, name) for name in type(stats).__slots__}
    histogram = values.pop("prepare_store_seconds")
    return {**values, "prepare_store_buckets": list(histogram.counts)}


def test_unknown_policy_names_the_policies_that_exist() -> None:
    with pytest.raises(ValueError, match=r"unknown cache policy 'mru'; known policies: lru, arc"):
        CPUOffloadingManager(16, 4, "mru")


@pytest.mark.parametrize(
    ("block_size", "num_blocks", "error"),
    [
        (16.5, 4, TypeError),
        (float("nan"), 4, TypeError),
        (float("inf"), 4, TypeError),
        (True, 4, TypeError),
        ("16", 4, TypeError),
        (16, 4.0, TypeError),
        (10**30, 4, ValueError),
        (16, 2**40, ValueError),
    ],
)
def test_sizes_that_are_not_sane_ints_are_refused(
    block_size: object, num_blocks: object, error: type[Exception]
) -> None:
    """A float, a bool or a string size, or one no encoding or host could hold, fails at once."""
    name = "block_size" if block_size != 16 else "num_blocks"
    with pytest.raises(error, match=name):
        CPUOffloadingManager(block_size, num_blocks)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call", ["lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store"]
)
@pytest.mark.parametrize("one_object", [b"abc", "abc", bytearray(b"abc")])
def test_one_bytes_or_str_object_is_refused_as_the_hashes(
    policy: str, call: str, one_object: object
) -> None:
    """Iterated, b"abc" is the hashes 97, 98, 99: it must not store, load or evict them."""
    manager = CPUOffloadingManager(16, 2, policy, enable_events=True)
    stored(manager, [97, 98])
    manager.take_events()
    before = snapshot(manager), vars_of(manager.stats)
    with pytest.raises(TypeError, match="a collection of hashes, not one"):
        getattr(manager, call)(one_object)
    assert (snapshot(manager), vars_of(manager.stats)) == before
    assert manager.take_events() == []


@pytest.mark.parametrize(("block_size", "num_blocks"), [(0, 4), (16, 0), (-1, 4)])
def test_nonpositive_sizes_are_rejected(block_size: int, num_blocks: int) -> None:
    with pytest.raises(ValueError, match="must be at least 1"):
        CPUOffloadingManager(block_size, num_blocks)
