"""Out-of-tree policies that break the policy contract, and callers that break the manager's.

A plug-in's wrong answer must be an error naming the policy and what it did, before the
tier frees or stores anything: no slot handed to two blocks, no block lost, no event for
what did not happen. A bad argument must be refused before anything changes.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import pytest

from offload import (
    CachePolicy,
    CPUOffloadingManager,
    PolicyContractError,
    make_policy,
    policy_names,
    register_policy,
)
from offload.base import BlockHash, OffloadingEvent
from offload.cpu.block_pool import Block
from offload.cpu.manager_stats import ManagerStats
from offload.cpu.policies import GuardedPolicy, LRUCachePolicy
from offload.cpu.request_recency import RequestRecency
from tests.support.plugin_policy import PluginLRU, plugin_manager, registered
from tests.support.stores import stored


class Misbehaving(LRUCachePolicy):
    """LRU, until ``admits`` or ``evicts`` replaces its admission or its eviction."""

    name = "misbehaving"
    admits: Any = None
    evicts: Any = None

    def admit(self, block_hashes: list, free: int, request: Any = None) -> Any:
        return block_hashes if self.admits is None else self.admits(self, block_hashes)

    def evict(self, n: int, protected: Container) -> Any:
        return super().evict(n, protected) if self.evicts is None else self.evicts(self, n)


def tier_state(manager: CPUOffloadingManager) -> dict:
    """What the tier holds and owes: blocks, free slots, transfers in flight, counts, events."""
    stats = manager.stats
    return {
        "blocks": {h: (b.slot, b.ref) for h, b in manager.policy.blocks.items()},
        "free": sorted(manager.pool.free_slots()),
        "in_flight": (stats.stores_in_flight, stats.loads_in_flight),
        "counts": (stats.store_not_admitted_blocks, stats.evicted_capacity_blocks),
        "events": manager.take_events(),
        "violations": manager.invariant_violations(),
    }


def take(policy: LRUCachePolicy, block_hash: BlockHash) -> tuple[BlockHash, Block]:
    """Remove a block from the LRU's own bookkeeping, as an eviction would."""
    return block_hash, policy.remove(block_hash)


def full_tier() -> tuple[CPUOffloadingManager, Misbehaving]:
    """A full tier of four: block 1 being read, 2 idle, 3 being written, 10 idle (newest)."""
    manager = plugin_manager(Misbehaving, 4)
    stored(manager, [1, 2])
    manager.prepare_store([3])
    manager.prepare_load([1])
    stored(manager, [10])
    manager.take_events()
    guard = manager.policy
    assert isinstance(guard, GuardedPolicy) and isinstance(guard.inner, Misbehaving)
    return manager, guard.inner


ADMITS = {
    "a hash never offered": lambda policy, offered: [*offered, 999],
    "a block twice": lambda policy, offered: [offered[0], offered[0]],
    "another order": lambda policy, offered: offered[::-1],
    "a number": lambda policy, offered: 7,
    "None": lambda policy, offered: None,
    "an unhashable item": lambda policy, offered: [[1]],
    "the offer, grown in place": lambda policy, offered: offered.append(999) or offered,
}


@pytest.mark.parametrize("answer", ADMITS.values(), ids=ADMITS.keys())
def test_an_admission_that_is_not_a_subsequence_of_the_offer_changes_nothing(answer) -> None:
    manager, policy = full_tier()
    manager.complete_store([3])
    manager.complete_load([1])
    manager.take_events()
    before = tier_state(manager)
    policy.admits = answer
    with pytest.raises(PolicyContractError, match=r"cache policy 'misbehaving': admit\(\) "):
        manager.prepare_store([20, 21])
    assert tier_state(manager) == before
    policy.admits = None
    # Its own bookkeeping may no longer match the tier's: it is not trusted again until reset.
    with pytest.raises(PolicyContractError, match="broke the policy contract earlier"):
        manager.prepare_store([20, 21])
    assert tier_state(manager) == before
    manager.reset()
    assert stored(manager, [20, 21]) == [] and manager.lookup([20, 21]) == 2


EVICTIONS = {
    "a block being read": (lambda policy, n: [take(policy, 1)], "block 1, being read"),
    "a block being written": (lambda policy, n: [take(policy, 3)], "block 3, being written"),
    "a protected block": (lambda policy, n: [take(policy, 10)], "block 10, protected"),
    "a block it does not hold": (lambda policy, n: [(2, Block(0))], "not a block it held"),
    "a block it kept": (lambda policy, n: [(2, policy.blocks[2])], "block 2 and kept it"),
    "too few": (lambda policy, n: [], "returned 0 blocks, asked for exactly 1"),
    "too many": (lambda policy, n: [take(policy, 2), take(policy, 10)], "returned 2 blocks"),
    "not pairs": (lambda policy, n: [2], "must return \\(hash, block\\) pairs"),
    "no hash": (lambda policy, n: [([2], policy.blocks[2])], "returned something that is no hash"),
    "None after removing": (lambda policy, n: take(policy, 2) and None, "returned None after"),
}


@pytest.mark.parametrize(("answer", "says"), EVICTIONS.values(), ids=EVICTIONS.keys())
def test_an_eviction_outside_the_contract_frees_no_slot_and_announces_nothing(answer, says) -> None:
    manager, policy = full_tier()
    before = tier_state(manager)
    policy.evicts = answer
    with pytest.raises(PolicyContractError, match=rf"'misbehaving': evict\(\) .*{says}"):
        manager.prepare_store([20], offered=[10])
    assert tier_state(manager) == before
    # The reader's block is still its own: its load completes, and no slot has two owners.
    manager.complete_load([1])
    manager.complete_store([3])
    assert manager.invariant_violations() == []


def test_an_eviction_naming_a_block_twice_frees_no_slot() -> None:
    manager, policy = full_tier()
    manager.complete_load([1])
    before = tier_state(manager)
    policy.evicts = lambda policy, n: [take(policy, 2)] * n
    with pytest.raises(PolicyContractError, match=r"evict\(\) returned a block twice"):
        manager.prepare_store([20, 21])
    assert tier_state(manager) == before


def test_a_policy_failing_to_insert_leaves_no_slot_taken() -> None:
    class FailsInsert(LRUCachePolicy):
        name = "fails-insert"

        def insert(self, block_hashes: Sequence, blocks: Sequence, request: Any = None) -> None:
            self.blocks.update(zip(block_hashes, blocks, strict=True))  # took some, then
            raise OSError("the policy's own store is gone")

    manager = plugin_manager(FailsInsert, 4)
    with pytest.raises(OSError, match="own store is gone"):
        manager.prepare_store([1, 2])
    assert manager.policy.blocks == {} and manager.pool.num_free == 4
    assert manager.stats.stores_in_flight == 0 and manager.invariant_violations() == []


def test_a_policy_failing_to_remove_part_way_frees_what_it_removed() -> None:
    class FailsSecondRemove(LRUCachePolicy):
        name = "fails-remove"
        removed = 0

        def remove(self, block_hash: BlockHash) -> Block:
            self.removed += 1
            if self.removed == 2:
                raise OSError("the policy's own store is gone")
            return super().remove(block_hash)

    manager = plugin_manager(FailsSecondRemove, 4)
    stored(manager, [1, 2, 3])
    manager.take_events()
    with pytest.raises(OSError, match="own store is gone"):
        manager.clear()
    assert manager.pool.num_free == 4 - len(manager.policy.blocks) == 2
    assert manager.invariant_violations() == []
    # What left the tier is announced and counted: a consumer must not go on believing in it.
    assert [(e.block_hashes, e.removed) for e in manager.take_events()] == [([1], True)]
    assert manager.stats.evicted_clear_blocks == 1


def test_a_policy_failing_to_reset_leaves_the_counts_as_they_were() -> None:
    class FailsReset(LRUCachePolicy):
        name = "fails-reset"

        def reset(self) -> None:
            raise OSError("the policy's own store is gone")

    manager = plugin_manager(FailsReset, 4)
    stored(manager, [1, 2])
    manager.prepare_load([1])
    with pytest.raises(OSError, match="own store is gone"):
        manager.reset()
    manager.complete_load([1])
    assert (manager.stats.loads_in_flight, manager.stats.load_dropped_blocks) == (0, 0)


class FailsWhenTold(LRUCachePolicy):
    """LRU that refuses the blocks from 100 on, and whose ``fails`` method (admit, evict or
    insert) raises: a plug-in whose own store went away part way through a store."""

    name = "fails-when-told"
    fails: str | None = None

    def _check(self, method: str) -> None:
        if self.fails == method:
            raise OSError(f"the policy's {method} lost its own store")

    def admit(self, block_hashes: list, free: int, request: Any = None) -> list:
        self._check("admit")
        return [block_hash for block_hash in block_hashes if block_hash < 100]

    def evict(self, n: int, protected: Container) -> Any:
        self._check("evict")
        return super().evict(n, protected)

    def insert(self, block_hashes: Sequence, blocks: Sequence, request: Any = None) -> None:
        self._check("insert")
        super().insert(block_hashes, blocks, request)


def whole_state(manager: CPUOffloadingManager) -> dict:
    """Everything a store can change: blocks, slots, every count, events, miss attribution."""
    stats, misses = manager.stats, manager.misses
    return {
        "blocks": {h: (b.slot, b.ref, b.loaded) for h, b in manager.policy.blocks.items()},
        "free": sorted(manager.pool.free_slots()),
        "counts": {
            name: getattr(stats, name)
            for name in ManagerStats.__slots__
            if name != "prepare_store_seconds"
        },
        "timed_stores": sum(stats.prepare_store_seconds.counts),
        "events": manager.take_events(),
        "misses": (dict(misses.lookups), dict(misses.blocks), misses.remembered),
        "violations": manager.invariant_violations(),
    }


def full_tier_after_a_miss() -> CPUOffloadingManager:
    """A full tier of four idle blocks (1 was read once), whose last lookup missed at 50, and
    no event waiting."""
    manager = plugin_manager(FailsWhenTold, 4)
    stored(manager, [1, 2, 3, 4])
    manager.prepare_load([1])
    manager.complete_load([1])
    assert manager.lookup([50, 51]) == 0
    manager.take_events()
    return manager


OFFER = [50, 51, 100, 4]
"""Two new blocks, one the plug-in refuses, one held: every store count moves."""


@pytest.mark.parametrize("method", ["admit", "evict"])
def test_a_plugin_raising_before_room_is_made_leaves_the_tier_exactly_as_it_was(
    method: str,
) -> None:
    """No count for a store that did not happen (offered, skipped, not admitted), and the
    pending miss is left for the store that follows it: the tier is its twin's, which was
    never asked, and the same store retried does what the twin's does."""
    failing, twin = full_tier_after_a_miss(), full_tier_after_a_miss()
    policy = failing.policy.inner
    policy.fails = method
    with pytest.raises(OSError, match=f"{method} lost its own store"):
        failing.prepare_store(OFFER)
    assert whole_state(failing) == whole_state(twin)
    policy.fails = None
    assert failing.prepare_store(OFFER) == twin.prepare_store(OFFER) is not None
    assert whole_state(failing) == whole_state(twin)


def test_a_plugin_raising_after_room_was_made_counts_and_announces_the_evictions_alone() -> None:
    """The evicted blocks did leave: their slots are free, they are counted and announced,
    and a later miss on one is charged to its eviction. Nothing is counted for the store."""
    failing, twin = full_tier_after_a_miss(), full_tier_after_a_miss()
    failing.policy.inner.fails = "insert"
    with pytest.raises(OSError, match="insert lost its own store"):
        failing.prepare_store(OFFER)
    after, before = whole_state(failing), whole_state(twin)
    evicted = [h for h in before["blocks"] if h not in after["blocks"]]
    never_read = sum(not before["blocks"][h][2] for h in evicted)
    assert len(evicted) == len(after["free"]) == 2 and after["violations"] == []
    assert after["events"] == [OffloadingEvent(evicted, 16, failing.medium, True)]
    assert after["counts"] == {
        **before["counts"],
        "evicted_capacity_blocks": 2,
        "dead_write_blocks": never_read,
    }
    lookups, blocks, remembered = before["misses"]
    assert after["misses"] == (lookups, blocks, remembered + 2)
    assert failing.lookup(evicted[:1]) == 0
    failing.misses.flush()
    assert failing.misses.blocks["evicted"] == 1


def test_a_plugin_that_keeps_the_contract_decides_as_the_same_policy_built_in() -> None:
    requests = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3], [7, 8, 9], [5, 6, 10], [1, 11]]
    runs = []
    for manager in (CPUOffloadingManager(16, 4, "lru"), plugin_manager(PluginLRU, 4)):
        trail = []
        for request in requests:
            hit = manager.lookup(request)
            if hit:
                manager.prepare_load(request[:hit])
                manager.touch(request)
                manager.complete_load(request[:hit])
            trail.append((hit, stored(manager, request[hit:])))
        runs.append(trail)
    assert runs[0] == runs[1]


# --- registration ------------------------------------------------------------------------


class Abstract(CachePolicy):
    name = "abstract"


class NotAPolicy:
    name = "not-a-policy"


def named(name: object) -> type[CachePolicy]:
    return type("Named", (LRUCachePolicy,), {"name": name})


REFUSED = {
    "an instance": (PluginLRU(4), TypeError, "is not a subclass of offload.CachePolicy"),
    "a number": (42, TypeError, "42 is not a subclass"),
    "not a CachePolicy": (NotAPolicy, TypeError, "is not a subclass"),
    "abstract": (Abstract, TypeError, "Abstract does not implement evict, insert"),
    "no name": (named(None), ValueError, "Named.name=None must be 1 to 64 letters"),
    "a space": (named("my policy"), ValueError, "must be 1 to 64 letters"),
    "a newline": (named("bad\nname, arc"), ValueError, "must be 1 to 64 letters"),
    "a comma": (named("a,b"), ValueError, "must be 1 to 64 letters"),
    "65 characters": (named("p" * 65), ValueError, "must be 1 to 64 letters"),
    "the optimum's": (named("opt"), ValueError, "'opt' is the offline optimum's"),
    "a built-in's": (named("gated"), ValueError, "'gated' is already registered, by offload"),
}


@pytest.mark.parametrize(("policy_cls", "error", "says"), REFUSED.values(), ids=REFUSED.keys())
def test_what_cannot_be_a_policy_or_be_chosen_is_refused_and_registers_nothing(
    policy_cls, error, says
) -> None:
    before = policy_names()
    with pytest.raises(error, match=says):
        register_policy(policy_cls)
    assert policy_names() == before


def test_a_policy_name_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="cache_policy must be a policy name, got list"):
        make_policy(["lru"], 4)  # type: ignore[arg-type]


def test_a_built_in_policy_runs_unguarded_and_a_registered_one_guarded() -> None:
    assert not isinstance(make_policy("lru", 4), GuardedPolicy)
    with registered(PluginLRU):
        guarded = make_policy("plugin-lru", 4)
    assert isinstance(guarded, GuardedPolicy) and isinstance(guarded.inner, PluginLRU)
    assert "plugin-lru" not in policy_names()


# --- the manager's own arguments -----------------------------------------------------------


@pytest.fixture(params=policy_names())
def ready(request: pytest.FixtureRequest) -> CPUOffloadingManager:
    """A full tier of ready blocks 1 and 2, events on, under each built-in policy."""
    manager = CPUOffloadingManager(16, 2, request.param, enable_events=True)
    stored(manager, [1, 2])
    manager.take_events()
    return manager


BAD_STORES = {
    "a request that is not a RequestRecency": (
        {"request": "req-1"}, TypeError, "request must be a RequestRecency or None, not str",
    ),
    "restarts that are not a mapping": (
        {"restarts": [1]}, TypeError, "restarts must map positions to parents, not list",
    ),
    "a restart past the offer": ({"restarts": {5: None}}, ValueError, "position 5, not one"),
    "a restart at a position that is not an int": (
        {"restarts": {"a": 1}}, ValueError, "position 'a', not one",
    ),
    "a restart whose parent is not a hash": (
        {"restarts": {1: []}}, TypeError, r"restarts\[1\] is not a hash",
    ),
    "an unhashable parent": ({"parent": [1]}, TypeError, "unhashable type: 'list'"),
    "offered blocks in one string": (
        {"offered": "ab"}, TypeError, "offered must be a collection of hashes, not one str",
    ),
    "an unhashable offered block": ({"offered": [[9]]}, TypeError, "unhashable type: 'list'"),
}  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "says"), BAD_STORES.values(), ids=BAD_STORES.keys())
def test_a_store_with_a_bad_argument_is_refused_before_anything_changes(
    ready: CPUOffloadingManager, kwargs, error, says
) -> None:
    before = tier_state(ready)
    with pytest.raises(error, match=says):
        ready.prepare_store([5, 6], **kwargs)
    assert tier_state(ready) == before
    # The same store with good arguments goes through.
    good = {
        "request": RequestRecency({5: 16, 6: 32}.get),
        "restarts": {1: 5},
        "parent": 4,
        "offered": [6],
    }
    out = ready.prepare_store([5, 6], **{key: good[key] for key in kwargs})
    assert out is not None and ready.invariant_violations() == []


@pytest.mark.parametrize("success", ["False", None, 0, 1])
def test_a_completion_whose_success_is_not_a_bool_is_refused(success: object) -> None:
    manager = CPUOffloadingManager(16, 4, "lru", enable_events=True)
    manager.prepare_store([1])
    with pytest.raises(TypeError, match="success must be True or False"):
        manager.complete_store([1], success=success)  # type: ignore[arg-type]
    assert manager.lookup([1]) == 0 and manager.stats.stores_in_flight == 1


def test_a_lookup_of_a_generator_is_refused_before_it_is_counted() -> None:
    manager = CPUOffloadingManager(16, 4, "lru")
    with pytest.raises(TypeError, match="has no len"):
        manager.lookup(h for h in [1, 2])  # type: ignore[arg-type]
    assert manager.stats.lookup_calls == 0


def test_a_plugin_refusing_blocks_as_the_contract_allows_has_them_counted_and_unannounced() -> None:
    manager, policy = full_tier()
    manager.complete_store([3])
    manager.complete_load([1])
    manager.take_events()
    refused_before = manager.stats.store_not_admitted_blocks
    policy.admits = lambda policy, offered: [h for h in offered if h % 2 == 0]
    out = manager.prepare_store([20, 21, 22])
    assert out is not None and out.block_hashes_to_store == [20, 22]
    assert manager.stats.store_not_admitted_blocks - refused_before == 1
    manager.complete_store(out.block_hashes_to_store)
    stored_events = [e for e in manager.take_events() if not e.removed]
    assert sorted(h for e in stored_events for h in e.block_hashes) == [20, 22]
    assert manager.lookup([21]) == 0 and manager.invariant_violations() == []


def test_after_a_refused_eviction_every_call_names_the_first_breach_until_a_reset() -> None:
    manager, policy = full_tier()
    policy.evicts = lambda policy, n: [take(policy, 1)]  # being read
    with pytest.raises(PolicyContractError, match="block 1, being read"):
        manager.prepare_store([20])
    policy.evicts = None
    for call in (lambda: manager.prepare_store([21]), manager.clear, lambda: manager.touch([2])):
        with pytest.raises(PolicyContractError, match=r"earlier \(cache policy 'misbehaving'"):
            call()
    assert manager.lookup([1, 2]) == 2 and manager.invariant_violations() == []
    manager.reset()
    stored(manager, [30, 31, 32, 33])
    assert stored(manager, [34]) == [30]  # the tier goes on, as LRU


def test_a_plugin_with_nothing_it_may_evict_says_none_and_changes_nothing() -> None:
    manager, _ = full_tier()
    manager.prepare_store([5])  # evicts 2: now 1 is read, 3 and 5 written, 10 idle
    manager.take_events()
    before = tier_state(manager)
    assert manager.prepare_store([40], offered=[10]) is None
    assert manager.stats.store_refused_calls == 1 and tier_state(manager) == before


@pytest.mark.parametrize("policy", ["lru", "gated"])  # the ones that place by the request
def test_a_request_that_cannot_place_a_block_leaves_no_slot_owned_twice(policy: str) -> None:
    """vLLM's key lookup behind ``position`` raising part way once left the LRU holding the
    blocks while the manager gave their slots back: the next store took them again."""

    def raising(block_hash: BlockHash) -> int:
        if block_hash == 6:
            raise KeyError(block_hash)
        return 16

    def no_position(block_hash: BlockHash) -> object:
        return "x" if block_hash == 6 else 16

    manager = CPUOffloadingManager(16, 4, policy, enable_events=True)
    stored(manager, [1, 2])
    for position, error in ((raising, KeyError), (no_position, TypeError)):
        with pytest.raises(error):
            manager.prepare_store([5, 6], RequestRecency(position))  # type: ignore[arg-type]
        # Neither block was taken: both slots are free again, nothing waits to be written.
        assert 5 not in manager.policy.blocks and manager.pool.num_free == 2
        assert manager.stats.stores_in_flight == 0 and manager.invariant_violations() == []
    stored(manager, [7, 8])
    assert manager.invariant_violations() == [] and manager.lookup([7, 8]) == 2
