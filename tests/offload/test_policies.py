"""Policy behaviour beyond the shared contract: ARC's adaptivity, the registry."""

from __future__ import annotations

import re

import pytest

from offload import CachePolicy, CPUOffloadingManager, make_policy, register_policy
from offload.cpu.policies import registry
from offload.cpu.policies.arc import ARCCachePolicy
from offload.cpu.policies.lru import HEAP_SLACK, LRUCachePolicy
from offload.cpu.request_recency import RequestRecency


def store(manager: CPUOffloadingManager, hashes: list) -> None:
    out = manager.prepare_store(hashes)
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)


def test_arc_keeps_frequently_used_blocks_through_a_scan() -> None:
    hot = list(range(10))
    results = {}
    for policy in ("lru", "arc"):
        manager = CPUOffloadingManager(16, 20, policy)
        store(manager, hot)
        manager.touch(hot)  # a second use: frequent
        for scanned in range(1000, 1100):  # one-time blocks, five times the free room
            store(manager, [scanned])
        results[policy] = manager.lookup(hot)
    assert results["arc"] == len(hot)
    assert results["lru"] == 0  # the same scan flushes LRU


def test_arc_promotes_on_second_use_and_remembers_evictions() -> None:
    manager = CPUOffloadingManager(16, 2, "arc")
    policy = manager.policy
    assert isinstance(policy, ARCCachePolicy)
    store(manager, [1, 2])
    assert list(policy.t1) == [1, 2]
    manager.touch([1])
    assert list(policy.t1) == [2] and list(policy.t2) == [1]
    store(manager, [3])  # T1 is over its target (0): 2 leaves T1 for ghost list B1
    assert list(policy.b1) == [2]
    assert manager.lookup([2]) == 0


def test_arc_ghost_hit_grows_the_recency_target() -> None:
    manager = CPUOffloadingManager(16, 2, "arc")
    policy = manager.policy
    assert isinstance(policy, ARCCachePolicy)
    store(manager, [1, 2])
    store(manager, [3])  # evicts 1 into B1
    assert 1 in policy.b1 and policy.target_t1 == 0
    store(manager, [1])  # a B1 ghost hit: recency deserved more room
    assert policy.target_t1 == 1
    assert 1 in policy.t2 and 1 not in policy.b1


def test_arc_ranks_a_finished_request_tail_first_and_promotes_what_it_found() -> None:
    """A request's end is its blocks' use where no touch comes (vLLM's connector): the ones
    it stored stay in T1, tail first to go, so the prefix keeps its head; the ones it found
    stored move to T2. Without this, T1 kept store order and the head left first."""
    manager = CPUOffloadingManager(16, 6, "arc")
    policy = manager.policy
    assert isinstance(policy, ARCCachePolicy)
    store(manager, [1, 2, 3])
    store(manager, [4, 5])
    policy.finish([4, 5, 1, 2, 3], reused={4, 5})
    assert list(policy.t1) == [3, 2, 1]
    assert list(policy.t2) == [5, 4]
    store(manager, [6, 7])  # T1 is over its target (0): its tail goes first
    assert manager.lookup([1, 2, 3]) == 2


def test_arc_ghost_lists_are_bounded_by_capacity() -> None:
    manager = CPUOffloadingManager(16, 4, "arc")
    policy = manager.policy
    assert isinstance(policy, ARCCachePolicy)
    for block_hash in range(100):
        store(manager, [block_hash])
    assert len(policy.b1) + len(policy.b2) <= 2 * 4
    assert len(policy.t1) + len(policy.t2) == 4


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))


def test_registry_builds_policies_by_name_and_accepts_new_ones(scratch_registry: None) -> None:
    assert isinstance(make_policy("lru", 3), LRUCachePolicy)
    assert isinstance(make_policy("arc", 3), ARCCachePolicy)

    @register_policy
    class FIFOPolicy(LRUCachePolicy):
        """LRU without touch: first in, first out."""

        name = "fifo-test"

        def touch(self, block_hashes: object) -> None:
            return None

    manager = CPUOffloadingManager(16, 2, "fifo-test")
    store(manager, [1, 2])
    manager.touch([1])
    out = manager.prepare_store([3])
    assert out is not None and out.block_hashes_evicted == [1]


@pytest.mark.parametrize(
    ("capacity", "error", "says"),
    [
        (0, ValueError, "capacity must be at least 1, got 0"),
        (-3, ValueError, "capacity must be at least 1, got -3"),
        (2.5, TypeError, "capacity must be an int, got float 2.5"),
        ("8", TypeError, "capacity must be an int, got str '8'"),
        (True, TypeError, "capacity must be an int, got bool True"),
    ],
)
@pytest.mark.parametrize("name", ["lru", "arc", "gated", "fifo-test"])
def test_a_capacity_that_is_not_a_positive_int_is_refused_by_name(
    scratch_registry: None, name: str, capacity: object, error: type, says: str
) -> None:
    """Built, an ARC of capacity -3 or "8" failed only at its first eviction, and an LRU of
    capacity 0 was built at all."""

    @register_policy
    class FIFOPolicy(LRUCachePolicy):
        name = "fifo-test"

    with pytest.raises(error, match=re.escape(says)):
        make_policy(name, capacity)  # type: ignore[arg-type]


def test_registry_rejects_a_policy_without_a_name_or_a_taken_name(
    scratch_registry: None,
) -> None:
    class Nameless(LRUCachePolicy):
        name = ""

    with pytest.raises(ValueError, match=r"Nameless\.name='' must be 1 to 64 letters"):
        register_policy(Nameless)

    class Impostor(LRUCachePolicy):
        name = "lru"

    with pytest.raises(ValueError, match=r"'lru' is already registered, by offload\.cpu\.policies"):
        register_policy(Impostor)
    assert issubclass(LRUCachePolicy, CachePolicy)


@pytest.mark.parametrize("policy", ["lru", "gated"])
@pytest.mark.parametrize("leave", ["touch", "failed_store"])
def test_request_ranked_stores_keep_the_lazy_heap_bounded(policy: str, leave: str) -> None:
    """Each block a request places leaves the placed table (a touch ranks it by use, a failed
    store drops it) before the next store: the heap's outdated entries must not pile up."""
    capacity = 4
    manager = CPUOffloadingManager(16, capacity, policy)
    lru = manager.policy
    assert isinstance(lru, LRUCachePolicy)
    for block_hash in range(2000):
        out = manager.prepare_store([block_hash], RequestRecency(lambda _: 16))
        assert out is not None
        if leave == "touch":
            manager.complete_store([block_hash])
            manager.touch([block_hash])
        else:
            manager.complete_store([block_hash], success=False)
        assert len(lru._heap) <= 2 * capacity + 64
    assert manager.invariant_violations() == []


@pytest.mark.parametrize("policy", ["lru", "gated"])
def test_blocks_at_one_rank_never_compare_their_hashes(policy: str) -> None:
    """A request ranks its blocks by position, and two chains of one request (vLLM's KV cache
    groups) hold blocks at the same positions: blocks of one rank must not be ordered by their
    hashes, which need not compare (an int and a bytes here)."""
    manager = CPUOffloadingManager(16, 4, policy)
    positions = {1: 16, b"one": 16, 2: 32, b"two": 32}
    out = manager.prepare_store(list(positions), RequestRecency(positions.get))
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)
    assert manager.lookup([1, 2]) == 2
    store(manager, [3, b"three"])  # room is made among the equally ranked blocks
    store(manager, [4, b"four"])
    assert manager.lookup([1]) == 0 and manager.lookup([b"one"]) == 0
    assert manager.invariant_violations() == []


@pytest.mark.parametrize("policy", ["lru", "gated"])  # the ones that place by the request
@pytest.mark.parametrize("place", [-16, 2**48, 2**49 + 16])
def test_a_position_no_rank_can_hold_is_refused_and_changes_nothing(
    policy: str, place: int
) -> None:
    """A rank is (request << 48) - position: a position of 2**48 or more ranked a newer
    request's block below an older request's (evicted first), a negative one above later
    requests' blocks. Both the store and the request's meeting of its blocks refuse it,
    naming the block, before anything moves."""
    manager = CPUOffloadingManager(16, 4, policy)
    lru = manager.policy
    assert isinstance(lru, LRUCachePolicy)
    out = manager.prepare_store([1], RequestRecency({1: 16}.get))
    assert out is not None
    manager.complete_store([1])
    before = (dict(lru.blocks), dict(lru._used), dict(lru._placed), manager.pool.num_free)
    says = re.escape(f"block 3's position {place} is outside [0, 2**48)")
    with pytest.raises(ValueError, match=says):
        manager.prepare_store([2, 3], RequestRecency({2: 16, 3: place}.get))
    with pytest.raises(ValueError, match=re.escape(f"block 3's position {place}")):
        lru.observe([1, 3], RequestRecency({1: 32, 3: place}.get))
    assert (dict(lru.blocks), dict(lru._used), dict(lru._placed), manager.pool.num_free) == before
    assert manager.invariant_violations() == []


def test_meetings_refused_part_way_keep_the_lazy_heap_bounded() -> None:
    """The LRU's observe() raising at an unhashable hash keeps the places it gave before it;
    it skipped compacting their heap entries, so each such call left a tier's worth behind.
    (gated's observe looks at every hash before the LRU's runs.)"""
    capacity = 8
    manager = CPUOffloadingManager(16, capacity, "lru")
    out = manager.prepare_store(list(range(capacity)))
    assert out is not None
    manager.complete_store(list(range(capacity)))
    lru = manager.policy
    assert isinstance(lru, LRUCachePolicy)
    for _ in range(50):  # each a newer request, so every block is placed again
        with pytest.raises(TypeError, match="unhashable type: 'list'"):
            lru.observe([*range(capacity), []], RequestRecency(lambda _: 16))
        assert len(lru._heap) <= 2 * capacity + HEAP_SLACK
    assert manager.invariant_violations() == []
