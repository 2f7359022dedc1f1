"""Random call sequences on kvscope's manager and on vLLM 0.33's own, with LRU: every answer
and every event the same.

test_same_as_vllm.py scripts requests one after another; here Hypothesis
interleaves what vLLM's scheduler may interleave: several requests, loads
and stores in flight together and completed in any order, failed stores,
keys being written offered again, a store threshold (with offer counts
that forget), tiers of one block, and resets with jobs in flight (whose
completions vLLM then drops). After
every step both tiers answer a lookup of every key alike, and vLLM's own
stats series (usage, allocation sizes, threshold skips) read the same.
The same runs on a hybrid model's keys: two KV cache groups of 16- and 32-token chunks, a
chunk's copies in both groups sharing its position and raw hash, offered group after group.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from bench.tooling.vllm_config import kvscope_manager

HASH_TOKENS = 16


def _chunks(group: int, tokens: int, count: int) -> dict[OffloadKey, int]:
    """Group ``group``'s first ``count`` chunks of ``tokens`` tokens, each keyed as vLLM keys
    it (the hash of its last 16-token block, and the group) -> the token where it ends."""
    return {
        make_offload_key((end // HASH_TOKENS - 1).to_bytes(8, "big"), group): end
        for end in range(tokens, tokens * count + 1, tokens)
    }


ONE_GROUP = _chunks(0, 16, 8)
TWO_GROUPS = {**_chunks(0, 16, 6), **_chunks(1, 32, 2)}
"""Eight keys too, in vLLM's order (group after group); chunks at 32 and 64 in both groups."""
REQUESTS = 3
places = st.integers(0, len(ONE_GROUP) - 1)
requests = st.integers(0, REQUESTS - 1)


class BothManagers(RuleBasedStateMachine):
    """The same calls on both; each request has a context per manager, as each engine would."""

    CHUNKS = ONE_GROUP
    """The prompt's keys, in the order offers name them -> where each chunk ends."""
    TOKENS_PER_BLOCK: int | tuple[int, ...] = 16

    @initialize(
        capacity=st.sampled_from([1, 3, 5]),
        threshold=st.sampled_from([0, 2]),
        tracked=st.sampled_from([3, 64_000]),
        publishing=st.booleans(),
    )
    def start(self, capacity: int, threshold: int, tracked: int, publishing: bool) -> None:
        """``tracked``: keys the threshold's offer counts hold (3: they forget some)."""
        extra = {"kvscope_endpoint": "tcp://127.0.0.1:*", "sample_rate": 1} if publishing else {}
        self.ours = kvscope_manager(
            capacity, "lru", True, threshold, tracked, self.TOKENS_PER_BLOCK, **extra
        )
        self.keys = list(self.CHUNKS)
        self.theirs = CPUOffloadingManager(
            capacity,
            "lru",
            enable_events=True,
            store_threshold=max(threshold, 1),
            max_tracker_size=tracked,
        )
        self.started = 0
        self.contexts = [self._new_request() for _ in range(REQUESTS)]
        self.loads: list[tuple[int, list[OffloadKey]]] = []
        self.stores: list[tuple[int, list[OffloadKey]]] = []

    def teardown(self) -> None:
        if hasattr(self, "ours"):
            self.ours.shutdown()

    def _new_request(self) -> tuple[ReqContext, ReqContext]:
        self.started += 1
        return self._context(f"ours-{self.started}"), self._context(f"theirs-{self.started}")

    def _context(self, name: str) -> ReqContext:
        """A request whose prompt holds every chunk of CHUNKS."""
        context = ReqContext(req_id=name)
        for key, end in self.CHUNKS.items():
            context.set_offload_key_position(key, end)
        return context

    def _both(self, method: str, request: int, *args: object) -> tuple[object, object]:
        ours, theirs = self.contexts[request]
        return (
            getattr(self.ours, method)(*args[:1], ours, *args[1:]),
            getattr(self.theirs, method)(*args[:1], theirs, *args[1:]),
        )

    @rule(request=requests, place=places)
    def lookup(self, request: int, place: int) -> None:
        ours, theirs = self._both("lookup", request, self.keys[place])
        assert ours == theirs

    @rule(request=requests, data=st.data())
    def prepare_load(self, request: int, data: st.DataObject) -> None:
        probe = ReqContext(req_id="probe")
        ready = [key for key in self.keys if self.theirs.lookup(key, probe) is LookupResult.HIT]
        if not ready:
            return
        keys = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3, unique=True))
        ours, theirs = self._both("prepare_load", request, keys)
        assert ours.block_ids.tolist() == theirs.block_ids.tolist()
        self.loads.append((request, keys))

    @rule(request=requests, chosen=st.lists(places, max_size=3, unique=True))
    def touch(self, request: int, chosen: list[int]) -> None:
        self._both("touch", request, [self.keys[place] for place in chosen])

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        request, keys = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
        self._both("complete_load", request, keys)

    @rule(request=requests, chosen=st.lists(places, max_size=4, unique=True))
    def prepare_store(self, request: int, chosen: list[int]) -> None:
        """An offer in prompt order, as vLLM makes one (chunks may be left out of it)."""
        ours, theirs = self._both("prepare_store", request, [self.keys[p] for p in sorted(chosen)])
        if theirs is None:
            assert ours is None
            return
        assert ours is not None
        assert ours.keys_to_store == theirs.keys_to_store
        assert ours.store_spec.block_ids.tolist() == theirs.store_spec.block_ids.tolist()
        assert ours.evicted_keys == theirs.evicted_keys
        if theirs.keys_to_store:
            self.stores.append((request, theirs.keys_to_store))

    @rule(request=requests, start=places, length=st.integers(1, 4))
    def store_a_run(self, request: int, start: int, length: int) -> None:
        """The common case: chunks one after another, stored, and the job done at once."""
        self.prepare_store(request, list(range(start, min(start + length, len(self.keys)))))
        if self.stores and self.stores[-1][0] == request:
            self._both("complete_store", request, self.stores.pop()[1])

    @precondition(lambda self: self.stores)
    @rule(data=st.data(), success=st.sampled_from([True, True, False]))
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        request, keys = self.stores.pop(data.draw(st.integers(0, len(self.stores) - 1)))
        self._both("complete_store", request, keys, success)

    @rule(request=requests)
    def finish(self, request: int) -> None:
        self._both("on_request_finished", request)
        self.contexts[request] = self._new_request()

    @rule()
    def reset(self) -> None:
        """vLLM's reset drops every job in flight: their completions never reach a manager."""
        self.ours.reset_cache()
        self.theirs.reset_cache()
        self.loads.clear()
        self.stores.clear()

    @rule()
    def take_events(self) -> None:
        ours = [(e.keys, e.removed, e.metadata_only) for e in self.ours.take_events()]
        theirs = [(e.keys, e.removed, e.metadata_only) for e in self.theirs.take_events()]
        assert ours == theirs

    @rule()
    def get_stats(self) -> None:
        """vLLM's own series (usage, allocation sizes, threshold skips), as vLLM reports them."""
        ours = self.ours.get_stats().data["data"]
        theirs = self.theirs.get_stats().data["data"]
        assert set(theirs) <= set(ours)
        for name, values in theirs.items():
            assert ours[name] == (values if isinstance(values[()], list) else pytest.approx(values))

    @invariant()
    def both_hold_the_same_blocks_in_the_same_state(self) -> None:
        probe = ReqContext(req_id="probe")
        ours = [self.ours.lookup(key, probe) for key in self.keys]
        assert ours == [self.theirs.lookup(key, probe) for key in self.keys]
        assert self.ours.core.invariant_violations() == []


class BothManagersOfTwoGroups(BothManagers):
    CHUNKS = TWO_GROUPS
    TOKENS_PER_BLOCK = (16, 32)


for machine in (BothManagers, BothManagersOfTwoGroups):
    machine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestBothManagers = BothManagers.TestCase
TestBothManagersOfTwoGroups = BothManagersOfTwoGroups.TestCase
