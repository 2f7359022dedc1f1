"""Why lookups miss: each reason produced by a scripted sequence and counted exactly, by
both forms of the attribution (C, and the Python one kvscope falls back to without a C
compiler), which are also held to each other on random sequences."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offload import CPUOffloadingManager, OffloadingEvent
from offload.cpu import manager as manager_module
from offload.cpu.miss_attribution import (
    REASONS,
    Generations,
    MissAttribution,
    PyGenerations,
    PyMissAttribution,
)
from tests.support.native import require_a_build_toolchain
from tests.support.stores import stored

FORMS = {"C": MissAttribution, "python": PyMissAttribution}


@pytest.fixture(autouse=True, params=sorted(FORMS))
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every manager a test builds attributes with this form."""
    monkeypatch.setattr(manager_module, "MissAttribution", FORMS[request.param])
    return request.param


def test_the_c_form_is_built_where_it_can_be() -> None:
    require_a_build_toolchain()
    assert MissAttribution is not PyMissAttribution
    assert Generations is not PyGenerations


def counts(manager: CPUOffloadingManager) -> tuple[dict, dict]:
    """Lookups and blocks per reason, the last miss's blocks charged (no store will split them)."""
    manager.misses.flush()
    lookups = {r: n for r, n in manager.misses.lookups.items() if n}
    blocks = {r: n for r, n in manager.misses.blocks.items() if n}
    return lookups, blocks


def test_a_block_never_stored_is_cold() -> None:
    manager = CPUOffloadingManager(16, 4)
    assert manager.lookup([1, 2, 3]) == 0
    assert counts(manager) == ({"cold": 1}, {"cold": 3})


def test_a_block_stored_then_evicted_for_room_is_evicted() -> None:
    manager = CPUOffloadingManager(16, 2)
    stored(manager, [1, 2])
    assert sorted(stored(manager, [3, 4])) == [1, 2]
    assert manager.lookup([1, 2]) == 0
    assert counts(manager) == ({"evicted": 1}, {"evicted": 2})


def test_a_block_being_written_is_in_flight() -> None:
    manager = CPUOffloadingManager(16, 4)
    manager.prepare_store([5])
    assert manager.lookup([5, 6]) == 0
    # blocks after the break that the tier does not hold go with the first miss's reason
    assert counts(manager) == ({"in_flight": 1}, {"in_flight": 2})


def test_stored_blocks_behind_the_break_are_prefix_lost() -> None:
    manager = CPUOffloadingManager(16, 4)
    stored(manager, [1])
    stored(manager, [2, 3], parent=1)
    stored(manager, [8])
    assert stored(manager, [9]) == [1]  # the chain's head was the least recent
    chain = [1, 2, 3, 4]
    assert manager.lookup(chain) == 0
    assert manager.misses.blocks["evicted"] == 0  # charged once the store shows what is held
    stored(manager, chain)  # as vLLM and the replay do: store what the lookup missed
    # 1 decides the loss (evicted); 2 and 3 are held but unreachable; 4 goes with 1
    assert counts(manager) == ({"evicted": 1}, {"evicted": 2, "prefix_lost": 2})


def test_a_miss_no_store_follows_is_charged_whole_at_the_next_miss() -> None:
    manager = CPUOffloadingManager(16, 4)
    stored(manager, [2])
    manager.lookup([1, 2])
    manager.lookup([5])
    assert manager.misses.blocks["cold"] == 2  # the first lookup's, all to its reason


def test_a_block_the_policy_refused_is_not_admitted() -> None:
    manager = CPUOffloadingManager(16, 2, "gated")
    stored(manager, [1, 2])
    for block_hash in range(10, 400):  # fill the tier's history until the gate closes
        out = manager.prepare_store([block_hash])
        if out is not None and out.block_hashes_to_store:
            manager.complete_store(out.block_hashes_to_store)
    refused = manager.stats.store_not_admitted_blocks
    assert refused > 0, "the gate never refused a first offer"
    offered_once = next(h for h in range(399, 9, -1) if h in manager.misses.refused)
    before = dict(manager.misses.lookups)
    assert manager.lookup([offered_once]) == 0
    assert manager.misses.lookups["not_admitted"] == before["not_admitted"] + 1


def test_a_request_longer_than_the_tier_is_no_room_not_cold() -> None:
    """A tier refuses to store a request with more blocks than it holds (it cannot make room
    without evicting the request's own): asked for again, its blocks were charged as cold,
    a first sighting, which they are not."""
    manager = CPUOffloadingManager(16, 4)
    chain = [1, 2, 3, 4, 5, 6]
    assert manager.lookup(chain) == 0
    assert manager.prepare_store(chain) is None
    assert manager.stats.store_refused_blocks == len(chain)
    assert counts(manager) == ({"cold": 1}, {"cold": 6})  # the first sighting
    assert manager.lookup(chain) == 0
    assert manager.lookup(chain[:3]) == 0  # a shorter prompt sharing its head
    assert counts(manager) == ({"cold": 1, "no_room": 2}, {"cold": 6, "no_room": 9})
    stored(manager, chain[:3])  # it fits: stored, then found
    assert manager.lookup(chain[:3]) == 3


def test_hits_count_no_miss_and_a_reset_forgets_evictions() -> None:
    manager = CPUOffloadingManager(16, 2)
    stored(manager, [1, 2])
    assert manager.lookup([1, 2]) == 2
    assert counts(manager) == ({}, {})
    stored(manager, [3, 4])
    manager.reset()
    assert manager.lookup([1]) == 0
    assert counts(manager) == ({"cold": 1}, {"cold": 1})
    assert set(manager.misses.lookups) == set(REASONS)


@pytest.mark.parametrize("generations", [Generations, PyGenerations])
def test_the_memory_of_evictions_keeps_between_one_and_two_horizons(generations: type) -> None:
    remembered = generations(horizon=100)
    for start in range(0, 1000, 10):
        remembered.add(range(start, start + 10))
        assert len(remembered) <= 200
    assert all(h in remembered for h in range(900, 1000))  # the last horizon's worth
    assert 0 not in remembered


@pytest.mark.parametrize("generations", [Generations, PyGenerations])
def test_a_batch_past_the_horizon_keeps_the_memory_within_two_horizons(
    generations: type,
) -> None:
    """One store may refuse far more blocks than the horizon holds (a long prompt offered to
    a small tier: the sidecar's shadow tiers, in the Python form, get them off the network);
    the memory still holds at most two horizons' worth, the newest of them."""
    remembered = generations(horizon=4)
    remembered.add([100])
    remembered.add(range(1000))
    assert len(remembered) <= 8
    assert all(h in remembered for h in range(996, 1000))
    assert 100 not in remembered and 0 not in remembered


def test_stored_events_name_each_runs_parent() -> None:
    manager = CPUOffloadingManager(16, 8, enable_events=True)
    stored(manager, [1, 3])
    manager.take_events()
    stored(manager, [2, 3, 4, 5], parent=1)  # 3 is held: runs [2] under 1, [4, 5] under 3
    assert manager.take_events() == [
        OffloadingEvent([2], 16, "CPU", False, 1),
        OffloadingEvent([4, 5], 16, "CPU", False, 3),
    ]
    out = manager.prepare_store([7, 8], parent=6)
    assert out is not None
    manager.complete_store([8])  # a run completed from its middle: 8 still follows 7
    manager.complete_store([7])
    assert manager.take_events() == [
        OffloadingEvent([8], 16, "CPU", False, 7),
        OffloadingEvent([7], 16, "CPU", False, 6),
    ]


@pytest.mark.parametrize(
    ("completions", "runs"),
    [
        ([([1, 3], True), ([2], True)], [([1], 0), ([3], 2), ([2], 1)]),
        ([([1], False), ([2, 3], True)], [([2, 3], 1)]),
        ([([3, 2, 1], True)], [([3], 2), ([2], 1), ([1], 0)]),
    ],
    ids=["a block left out", "the head failed", "in reverse"],
)
def test_a_store_completed_in_parts_announces_runs_of_its_chain(
    completions: list[tuple[list[int], bool]], runs: list[tuple[list[int], int]]
) -> None:
    """However the blocks of one store become readable, each stored event is a run of the
    chain under the block before it: never blocks apart in the chain as one run, nor a
    block after the chain's first as its start."""
    manager = CPUOffloadingManager(16, 8, enable_events=True)
    assert manager.prepare_store([1, 2, 3], parent=0) is not None
    for block_hashes, success in completions:
        manager.complete_store(block_hashes, success)
    events = manager.take_events()
    assert [(e.block_hashes, e.parent_block_hash) for e in events] == runs


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("miss"),
            st.integers(0, 3),
            st.integers(0, 30),
            st.integers(1, 9),
            st.booleans(),
            st.sampled_from([1, 16, 32, 2**31 - 1]),
        ),
        st.tuples(
            st.just("stored"),
            st.lists(st.integers(0, 30), max_size=3),
            st.integers(0, 9),
            st.lists(st.integers(0, 30), max_size=1),
            st.lists(st.integers(0, 30), max_size=1),
            st.lists(st.integers(0, 30), max_size=2),
        ),
        st.tuples(st.just("evicted"), st.lists(st.integers(0, 30), max_size=6)),
        st.tuples(st.just("refused"), st.lists(st.integers(0, 30), max_size=6)),
        st.tuples(st.just("no_room"), st.lists(st.integers(0, 30), max_size=6)),
        st.tuples(st.just("reset")),
    ),
    max_size=60,
)


@given(operations, st.integers(1, 4))
def test_the_two_forms_count_alike(script: list[tuple], capacity: int) -> None:
    """Small int hashes, which the C form keys exactly; refusals and evictions come in
    batches, as the manager's stores give them, which may turn a generation part way."""
    forms = [MissAttribution(capacity, 1), PyMissAttribution(capacity, 1)]
    for step in script:
        for attribution in forms:
            match step:
                case ("miss", hits, block_hash, lost, in_flight, block_tokens):
                    block_hashes = [-1] * hits + [block_hash] * lost
                    attribution.miss(block_hashes, hits, in_flight, block_tokens)
                case ("stored", requested, held, refused, evicted, no_room):
                    attribution.stored(requested, held, refused, evicted, no_room)
                case ("evicted", hashes):
                    attribution.stored([], 0, [], hashes)
                case ("refused", hashes):
                    attribution.stored([], 0, hashes, [])
                case ("no_room", hashes):
                    attribution.stored([], 0, [], [], hashes)
                case ("reset",):
                    attribution.reset()
        c, python = forms
        assert c.lookups == python.lookups
        assert c.blocks == python.blocks
        assert c.tokens == python.tokens
        assert c.remembered == python.remembered


chains = st.lists(
    st.tuples(st.integers(0, 400), st.integers(1, 12), st.booleans()), min_size=1, max_size=200
)


@given(chains, st.integers(1, 6))
def test_managers_of_either_form_count_a_workload_alike(
    requests: list[tuple[int, int, bool]], capacity: int
) -> None:
    """Both forms behind a gated tier (which refuses and evicts whole batches) on one random
    workload: look up a chain, store what missed, complete the store or leave it in flight."""
    managers = []
    for form in FORMS.values():
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(manager_module, "MissAttribution", form)
            managers.append(CPUOffloadingManager(16, capacity, "gated"))
    for start, length, completes in requests:
        chain = list(range(start, start + length))
        for manager in managers:
            hits = manager.lookup(chain)
            out = manager.prepare_store(chain[hits:], parent=chain[hits - 1] if hits else None)
            if out is not None and completes:
                manager.complete_store(out.block_hashes_to_store)
    c, python = (manager.misses for manager in managers)
    for attribution in (c, python):
        attribution.flush()
    assert (c.lookups, c.blocks, c.tokens) == (python.lookups, python.blocks, python.tokens)
    assert c.remembered == python.remembered


@pytest.mark.parametrize("generations", [Generations, PyGenerations])
def test_an_unhashable_hash_is_refused_and_what_was_remembered_stays(generations: type) -> None:
    remembered = generations(horizon=10)
    remembered.add([1, 2])
    with pytest.raises(TypeError, match="unhashable"):
        remembered.add([[3]])
    assert 1 in remembered and 2 in remembered


def test_attribution_off_counts_nothing_and_changes_nothing_else() -> None:
    """``attribute_misses=False`` (the benchmark's baseline): the same tier, no reasons."""
    on = CPUOffloadingManager(16, 3, "gated")
    off = CPUOffloadingManager(16, 3, "gated", attribute_misses=False)
    for manager in (on, off):
        for request in ([1, 2], [3, 4, 5], [1, 2, 6], [7], [3, 4], [1, 8]):
            hits = manager.lookup(request)
            stored(manager, request[hits:], parent=request[hits - 1] if hits else None)
    on.misses.flush()
    off.misses.flush()
    assert sum(on.misses.lookups.values()) > 0
    assert not any(off.misses.lookups.values()) and not any(off.misses.blocks.values())
    assert off.misses.remembered == 0
    counts = [
        {name: getattr(m.stats, name) for name in m.stats.__slots__ if name.endswith("_blocks")}
        for m in (on, off)
    ]
    assert counts[0] == counts[1]


class _SameHash:
    """Distinct keys with one hash value."""

    def __hash__(self) -> int:
        return 7


def test_the_c_form_reads_equal_hash_values_as_one_hash() -> None:
    """Its documented cost: it keeps hash values, not objects (vLLM's digests collide with a
    1 in 2**64 chance; ints from 0 to 2**61 - 2 never). The Python form keeps the objects."""
    if Generations is PyGenerations:
        pytest.skip("no C form built")
    first, second = _SameHash(), _SameHash()
    remembered, exact = Generations(horizon=4), PyGenerations(horizon=4)
    for generations in (remembered, exact):
        generations.add([first])
    assert second in remembered and second not in exact
    remembered.add([5])  # an int's hash is itself modulo 2**61 - 1: exact below that only
    assert 6 not in remembered and 5 + (2**61 - 1) in remembered


class _Int(int):
    """An int subclass: the C form reads only exact ints without a call."""


@pytest.mark.parametrize(
    "key",
    [
        0,
        1,
        2**30 - 1,
        2**30,
        2**60 - 1,
        2**60,
        2**61 - 2,
        2**61 - 1,
        2**64,
        -1,
        -2,
        -(2**40),
        True,
        _Int(12),
        _Int(-1),
    ],
)
def test_the_c_form_keys_an_int_by_its_python_hash_on_every_path(key: int) -> None:
    """Small ints are read straight from the object, the rest through the C API: both keep
    what hash() says (so the read-through path agrees with it across the digit boundaries)."""
    if Generations is PyGenerations:
        pytest.skip("no C form built")
    remembered = Generations(horizon=4)
    remembered.add([key])
    assert key in remembered
    assert hash(key) in remembered  # the same hash value
    other = hash(key) + 3  # -1 and -2 share a hash value: step past both
    assert hash(other) != hash(key) and other not in remembered


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
def test_a_miss_is_charged_by_what_was_remembered_at_it(form: type) -> None:
    """The store after a miss may refuse or evict its break block: that miss stays cold
    (the C form finds a miss's reason later, when it settles, and must still agree)."""
    attribution = form(4, 1)
    attribution.miss([7, 8, 9], 0, False)
    attribution.stored([7, 8, 9], 1, [7], [])  # 9 was held; 7 is refused now
    assert attribution.lookups["cold"] == 1 and attribution.lookups["not_admitted"] == 0
    assert attribution.blocks["cold"] == 2 and attribution.blocks["prefix_lost"] == 1
    attribution.miss([6, 7], 1, False)
    attribution.stored([], 0, [], [7])  # evicted after it was refused: the miss came first
    assert attribution.lookups["not_admitted"] == 1 and attribution.lookups["evicted"] == 0


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
def test_each_miss_counts_its_own_blocks_tokens(form: type) -> None:
    """Inside vLLM a hybrid model's groups differ in tokens per chunk: each lookup names
    its own, and its blocks, split or not, count that many tokens each."""
    attribution = form(4, 1)
    attribution.miss([7, 8, 9], 0, False, 32)
    attribution.stored([7, 8, 9], 1, [], [])  # 9 held behind the break
    attribution.miss([5, 6], 1, False, block_tokens=16)
    attribution.miss([4], 0, in_flight=True)  # no size named: tokens count blocks
    attribution.flush()
    assert attribution.blocks == {
        **dict.fromkeys(REASONS, 0),
        "cold": 3,
        "prefix_lost": 1,
        "in_flight": 1,
    }
    assert attribution.tokens == {
        **dict.fromkeys(REASONS, 0),
        "cold": 2 * 32 + 16,
        "prefix_lost": 32,
        "in_flight": 1,
    }


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
@pytest.mark.parametrize("block_tokens", [0, -16, 2**31])
def test_a_block_size_out_of_range_is_refused_and_changes_nothing(
    form: type, block_tokens: int
) -> None:
    attribution = form(4, 1)
    attribution.miss([5, 6], 1, False, 16)
    with pytest.raises(
        ValueError, match=f"block_tokens must be from 1 to 2147483647, got {block_tokens}"
    ):
        attribution.miss([7, 8], 0, False, block_tokens)
    attribution.flush()
    assert attribution.lookups["cold"] == 1
    assert (attribution.blocks["cold"], attribution.tokens["cold"]) == (1, 16)


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
@pytest.mark.parametrize("hits", [-1, 2, 3])
def test_a_miss_past_its_lookup_is_refused_and_changes_nothing(form: type, hits: int) -> None:
    attribution = form(4, 1)
    attribution.miss([5, 6], 1, False)
    with pytest.raises(ValueError, match=rf"0 <= hits < len\(block_hashes\), got {hits} of 2"):
        attribution.miss([7, 8], hits, False)
    attribution.flush()
    assert attribution.lookups["cold"] == 1 and attribution.blocks["cold"] == 1


class _Meddler:
    """A key whose hash and equality run Python code against the attribution holding it."""

    def __init__(self, attribution: object, victim: list[object]) -> None:
        self.attribution = attribution
        self.victim = victim

    def __hash__(self) -> int:
        self.victim.clear()  # the list being added from
        self.attribution.stored([], 0, [], list(range(100, 140)))  # type: ignore[attr-defined]
        return 11

    def __eq__(self, other: object) -> bool:
        self.attribution.miss([12345], 0, False)  # type: ignore[attr-defined]
        return True


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
def test_keys_that_run_code_while_hashed_or_compared_corrupt_nothing(form: type) -> None:
    """A key's __hash__ empties the list being added and adds to the same memory; its __eq__
    makes another miss mid-store. Every count stays whole and the memory still answers."""
    attribution = form(4, 16)
    evicted: list[object] = []
    meddler = _Meddler(attribution, evicted)
    evicted += [meddler, 1, 2, 3]
    attribution.stored([], 0, [], evicted)
    attribution.miss([meddler], 0, False)
    twin = _Meddler(attribution, [])
    attribution.stored([twin, 9], 1, [], [])  # the split's compare makes a new miss
    attribution.flush()
    assert all(count >= 0 for count in attribution.lookups.values())
    assert sum(attribution.lookups.values()) == 2  # each miss once
    assert sum(attribution.blocks.values()) == 2  # each lost one block, charged once
    assert attribution.remembered >= 40


class _MissOnRelease:
    """A break block whose finalizer makes another miss, on the attribution that let it go."""

    def __init__(self, attribution: object, then: object) -> None:
        self.attribution = attribution
        self.then = then

    def __hash__(self) -> int:
        return 21

    def __del__(self) -> None:
        self.attribution.miss([self.then], 0, False)  # type: ignore[attr-defined]


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
def test_a_miss_made_as_the_last_break_block_is_let_go_is_counted_and_not_kept(
    form: type,
) -> None:
    """The next miss releases the last one's break block, whose finalizer makes a miss: the C
    form put its own over that one, never counting its lookup and keeping its block."""
    attribution = form(4, 16)
    then = 10**30  # an int of its own, its references counted
    before = sys.getrefcount(then)
    attribution.miss([_MissOnRelease(attribution, then)], 0, False)
    attribution.miss([5, 6], 0, False)
    attribution.flush()
    attribution.reset()
    assert sum(attribution.lookups.values()) == 3  # each miss once
    assert sys.getrefcount(then) == before


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
def test_a_reason_judged_at_the_lookup_is_the_one_charged_later(form: type) -> None:
    """vLLM counts a lookup once its request is scheduled, after other requests' stores
    may have refused the block: the reason judged at the lookup is the one charged."""
    attribution = form(4, 1)
    attribution.stored([], 0, [5], [6])
    assert [attribution.reason(key) for key in (5, 6, 7)] == ["not_admitted", "evicted", "cold"]
    judged = attribution.reason(7)
    attribution.stored([7], 0, [7], [])  # refused after the lookup, before it is charged
    attribution.miss([7], 0, False, 16, reason=judged)
    attribution.flush()
    assert attribution.lookups["cold"] == 1 and attribution.lookups["not_admitted"] == 0
    assert (attribution.blocks["cold"], attribution.tokens["cold"]) == (1, 16)


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
def test_both_forms_take_a_stores_arguments_by_position_only(form: type) -> None:
    """The C form reads ``stored``'s arguments by position; the Python form took them by
    name too (``no_room=``), so a call one form took the other refused."""
    attribution = form(4, 1)
    attribution.stored([], 0, [], [], [5])
    with pytest.raises(TypeError):
        attribution.stored([], 0, [], [], no_room=[6])
    assert attribution.reason(5) == "no_room"
    assert attribution.reason(6) == "cold"


@pytest.mark.parametrize("form", [MissAttribution, PyMissAttribution])
@pytest.mark.parametrize(
    ("reason", "in_flight"),
    [("in_flight", False), ("prefix_lost", False), ("warm", False), (1, False), ("cold", True)],
)
def test_a_reason_no_lookup_is_judged_by_is_refused_and_changes_nothing(
    form: type, reason: object, in_flight: bool
) -> None:
    attribution = form(4, 1)
    attribution.miss([5, 6], 1, False)
    with pytest.raises(
        ValueError, match="reason must be 'cold', 'evicted', 'not_admitted' or 'no_room'"
    ):
        attribution.miss([7, 8], 0, in_flight, reason=reason)
    attribution.flush()
    assert attribution.lookups == {**dict.fromkeys(attribution.lookups, 0), "cold": 1}
    assert attribution.blocks["cold"] == 1
