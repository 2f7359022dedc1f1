"""Stateful property test: the manager's invariants hold after every step.

Hypothesis drives random sequences of every manager call against a small
model of what must be true (which blocks are stored, ready, pinned), and
checks the invariants of docs/ARCHITECTURE.md after each step.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from offload import CPUOffloadingManager, policy_names
from offload.cpu.request_recency import RequestRecency
from tests.support.plugin_policy import PluginLRU, registered

CAPACITY = 6
REQUESTS = 3
"""Running requests the connector-like rules name (their stores, meetings and ends)."""
hashes = st.lists(st.integers(min_value=0, max_value=15), max_size=8)


def _position(block_hash: int) -> int | None:
    """A block's place in every request's prompt: blocks of one prompt share places across
    requests, and a few have none (the request does not hold them)."""
    return None if block_hash % 5 == 4 else 16 * (block_hash % 7 + 1)


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.manager: CPUOffloadingManager | None = None
        self.ready: set[int] = set()
        self.pending: set[int] = set()
        self.pins: Counter[int] = Counter()
        self.evicted_since_stored: set[int] = set()
        self.requests = [RequestRecency(_position) for _ in range(REQUESTS)]

    @precondition(lambda self: self.manager is None)
    @rule(policy=st.sampled_from([*policy_names(), PluginLRU.name]))
    def start(self, policy: str) -> None:
        with registered(PluginLRU):  # one from outside too: it runs behind the guard
            self.manager = CPUOffloadingManager(16, CAPACITY, policy, enable_events=True)

    @precondition(lambda self: self.manager is not None)
    @rule(block_hashes=hashes)
    def prepare_store(self, block_hashes: list[int]) -> None:
        self._store(block_hashes, None)

    @precondition(lambda self: self.manager is not None)
    @rule(block_hashes=hashes, request=st.sampled_from(range(REQUESTS)))
    def prepare_store_for_a_request(self, block_hashes: list[int], request: int) -> None:
        """As vLLM's connector stores: the request named, its blocks ranked by position."""
        self._store(block_hashes, self.requests[request])

    @precondition(lambda self: self.manager is not None)
    @rule(block_hashes=hashes, request=st.sampled_from(range(REQUESTS)))
    def observe(self, block_hashes: list[int], request: int) -> None:
        """A running request meets blocks (loaded or offered), as the connector tells it."""
        assert self.manager is not None
        self.manager.policy.observe(block_hashes, self.requests[request])

    @precondition(lambda self: self.manager is not None)
    @rule(data=st.data(), block_hashes=hashes, request=st.sampled_from(range(REQUESTS)))
    def finish(self, data: st.DataObject, block_hashes: list[int], request: int) -> None:
        """A request ends, having found some of its blocks stored (``reused``)."""
        assert self.manager is not None
        reused = set(data.draw(st.lists(st.sampled_from([*block_hashes, 99]), max_size=4)))
        self.manager.policy.finish(block_hashes, reused, self.requests[request])

    @precondition(lambda self: self.manager is not None)
    @rule()
    def clear(self) -> None:
        """A prefix-cache reset: every idle block leaves; blocks read or written stay."""
        assert self.manager is not None
        idle = {h for h in self.ready if not self.pins[h]}
        assert set(self.manager.clear()) == idle
        self.ready -= idle
        self.evicted_since_stored |= idle
        self._check_events(stored=set(), removed=idle)

    @precondition(lambda self: self.manager is not None)
    @rule()
    def reset(self) -> None:
        """vLLM's reset: every block leaves, idle, read or written; the jobs in flight are
        never completed (vLLM drops their completions)."""
        assert self.manager is not None
        self.manager.reset()
        self._check_events(stored=set(), removed=self.ready)
        self.evicted_since_stored |= self.ready | self.pending
        self.ready, self.pending = set(), set()
        self.pins.clear()

    def _store(self, block_hashes: list[int], request: RequestRecency | None) -> None:
        assert self.manager is not None
        stats = self.manager.stats
        free = self.manager.pool.num_free
        refused_before = stats.store_not_admitted_blocks
        out = self.manager.prepare_store(block_hashes, request)
        if out is None:
            self._check_events(stored=set(), removed=set())
            return
        named = set(block_hashes)
        new = named - self.ready - self.pending
        # A policy may refuse new blocks (admission): they are counted, not stored,
        # and make no room: evictions only ever serve the admitted ones.
        assert set(out.block_hashes_to_store) <= new
        not_admitted = stats.store_not_admitted_blocks - refused_before
        assert not_admitted == len(new) - len(out.block_hashes_to_store)
        assert len(out.block_hashes_evicted) <= max(0, len(out.block_hashes_to_store) - free)
        assert len(out.block_hashes_to_store) == len(set(out.block_hashes_to_store))
        for evicted in out.block_hashes_evicted:
            assert evicted in self.ready, "only ready blocks may be evicted"
            assert evicted not in named, "a block named in the call was evicted"
            assert self.pins[evicted] == 0, "a block being read was evicted"
        self.ready -= set(out.block_hashes_evicted)
        self.evicted_since_stored |= set(out.block_hashes_evicted)
        self.pending |= set(out.block_hashes_to_store)
        self._check_events(stored=set(), removed=set(out.block_hashes_evicted))

    @precondition(lambda self: self.manager is not None)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        assert self.manager is not None
        universe = [*sorted(self.pending | self.ready), 99]  # 99: never stored
        chosen = data.draw(st.lists(st.sampled_from(universe), max_size=6))
        self.manager.complete_store(chosen, success=success)
        finished = self.pending & set(chosen)
        self.pending -= finished
        if success:
            self.ready |= finished
            self.evicted_since_stored -= finished
        self._check_events(stored=finished if success else set(), removed=set())

    @precondition(lambda self: self.manager is not None and self.ready)
    @rule(data=st.data())
    def prepare_load(self, data: st.DataObject) -> None:
        assert self.manager is not None
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.ready)), min_size=1))
        spec = self.manager.prepare_load(chosen)
        assert len(spec.block_ids) == len(chosen)
        self.pins.update(chosen)

    @precondition(lambda self: self.manager is not None and +self.pins)
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        assert self.manager is not None
        chosen = data.draw(st.sampled_from(sorted(+self.pins)))
        self.manager.complete_load([chosen])
        self.pins[chosen] -= 1

    @precondition(lambda self: self.manager is not None)
    @rule(block_hashes=hashes)
    def touch_and_lookup(self, block_hashes: list[int]) -> None:
        assert self.manager is not None
        self.manager.touch(block_hashes)
        expected = 0
        for block_hash in block_hashes:
            if block_hash not in self.ready:
                break
            expected += 1
        assert self.manager.lookup(block_hashes) == expected

    def _check_events(self, stored: set[int], removed: set[int]) -> None:
        assert self.manager is not None
        events = self.manager.take_events()
        got_stored = {h for e in events if not e.removed for h in e.block_hashes}
        got_removed = {h for e in events if e.removed for h in e.block_hashes}
        assert got_stored == stored
        assert got_removed == removed
        assert all(e.medium == "CPU" and e.block_size == 16 for e in events)

    @invariant()
    def slots_are_owned_once_and_accounted(self) -> None:
        if self.manager is None:
            return
        blocks = self.manager.policy.blocks
        used = [block.slot for block in blocks.values()]
        free = self.manager.pool.free_slots()
        assert len(used) == len(set(used)), "a slot is owned twice"
        assert not set(used) & set(free), "a slot is both used and free"
        assert len(used) + len(free) == CAPACITY
        assert sorted(used + free) == list(range(CAPACITY))

    @invariant()
    def the_managers_own_checks_agree(self) -> None:
        """The full check and the live one (a window of 3 slots) find nothing either."""
        if self.manager is None:
            return
        assert self.manager.invariant_violations() == []
        assert self.manager.live_invariant_violations(slots=3) == []

    @invariant()
    def ref_counts_match_the_model(self) -> None:
        if self.manager is None:
            return
        blocks = self.manager.policy.blocks
        assert set(blocks) == self.ready | self.pending
        for block_hash, block in blocks.items():
            if block_hash in self.pending:
                assert block.ref == -1
            else:
                assert block.ref == self.pins[block_hash] >= 0

    @invariant()
    def the_counts_agree_with_the_blocks(self) -> None:
        """What the metrics derive from counters (blocks in flight, pinned, held) is what the
        tier holds, whatever failed, was refused or was reset on the way."""
        if self.manager is None:
            return
        stats = self.manager.stats
        refs = [block.ref for block in self.manager.policy.blocks.values()]
        assert stats.stores_in_flight == refs.count(-1)
        assert stats.blocks_pinned_by_loads == sum(ref > 0 for ref in refs)
        assert stats.loads_in_flight == sum(ref for ref in refs if ref > 0)
        left = stats.evicted_capacity_blocks + stats.evicted_clear_blocks
        assert stats.store_completed_blocks - left == sum(ref >= 0 for ref in refs)
        offered = stats.store_skipped_blocks + stats.store_not_admitted_blocks
        taken = stats.store_admitted_blocks + stats.store_refused_blocks
        assert stats.store_requested_blocks == offered + taken

    @invariant()
    def evicted_blocks_are_never_found(self) -> None:
        if self.manager is None:
            return
        for block_hash in self.evicted_since_stored:
            assert self.manager.lookup([block_hash]) == 0


ManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestManagerInvariants = ManagerMachine.TestCase
