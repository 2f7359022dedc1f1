"""A miniature model in both forms: the C one and the Python one hold the same.

tests/offload/test_miniature.py holds what a model does through the form in use; here both
forms get the same scripted and random requests, and keys that run code against the model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from math import inf
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offload.cpu.policies.miniature import Candidate, Miniature
from offload.cpu.policies.miniature_model import BaseMiniature, PyMiniature, py_sampled, sampled
from offload.cpu.policies.offer_history import (
    OFFERS_PER_SLOT,
    PROVEN_OFFERS,
    BaseOfferHistory,
    PyOfferHistory,
)
from tests.support.c_key_tables import NEWEST, c_state, key_of, unlink_oldest
from tests.support.native import require_a_build_toolchain

FORMS = [(BaseMiniature, BaseOfferHistory), (PyMiniature, PyOfferHistory)]


def new_model(
    form: tuple[type, type],
    slots: int,
    horizon: float | None,
    protected_slots: int = 0,
    admit_continuations: bool = False,
    turnovers: int = 1,
) -> PyMiniature:
    """A model of the form, with an offer history of the same form."""
    model_type, history_type = form
    offers = history_type(OFFERS_PER_SLOT * slots, PROVEN_OFFERS)
    return model_type(slots, horizon, protected_slots, admit_continuations, offers, turnovers)


def state_of(model: PyMiniature) -> tuple:
    return (
        model.hits,
        list(model.probation),
        list(model.protected),
        model.age,
        len(model),
        len(model.offers),
    )


def test_the_c_form_is_built_where_it_can_be() -> None:
    require_a_build_toolchain()
    assert BaseMiniature is not PyMiniature and sampled is not py_sampled
    assert isinstance(Miniature(4, Candidate(2, 0.25)), BaseMiniature)


@pytest.mark.parametrize("form", FORMS)
def test_a_scripted_run_stores_touches_protects_and_evicts(form: tuple[type, type]) -> None:
    model = new_model(form, 4, None, protected_slots=2)
    model.run([1, 2, 3], 1.0, False)
    assert list(model.probation) == [3, 2, 1]  # head newest, the run's last block oldest
    model.run([1, 2], 0.5, False)  # both held: a hit of 2, reused into protected
    assert model.hits == 2.0
    assert list(model.protected) == [2, 1] and list(model.probation) == [3]
    model.run([7, 8, 9], 1.0, False)  # room for 3: 3 goes first, then protected's oldest
    assert 3 not in model and 2 not in model and 1 in model
    assert len(model) == 4 and model.age is None  # half a turnover evicted: no age yet
    model.run([10, 11], 1.0, False)
    assert model.age is not None


@pytest.mark.parametrize("form", FORMS)
def test_a_sample_without_the_requests_end_demotes_nothing(form: tuple[type, type]) -> None:
    ends, middle = new_model(form, 8, None), new_model(form, 8, None)
    for request in ([1, 2], [5, 6]):
        ends.run(request, 1.0, False)
        middle.run(request, 1.0, False, False)  # each request went on, unsampled
    assert list(ends.probation) == [6, 2, 1, 5]  # 6 ended the prompt: first to go
    assert list(middle.probation) == [2, 1, 6, 5]  # 6 stands where the tier keeps it
    with pytest.raises(TypeError, match="run"):
        middle.run([1], 1.0, False, True, None)


@pytest.mark.parametrize("form", FORMS)
def test_a_repeated_block_in_a_request_is_offered_once(form: tuple[type, type]) -> None:
    model = new_model(form, 8, None)
    model.run([5, 6, 5, 6, 7], 1.0, False)
    assert sorted(model.probation) == [5, 6, 7] and len(model) == 3


@pytest.mark.parametrize("form", FORMS)
def test_a_bad_size_or_horizon_is_refused_by_name(form: tuple[type, type]) -> None:
    with pytest.raises(ValueError, match="slots must be >= 1"):
        new_model(form, 0, None)
    with pytest.raises(ValueError, match="protected_slots in"):
        new_model(form, 4, None, protected_slots=5)
    with pytest.raises(ValueError, match="horizon must be None or > 0"):
        new_model(form, 4, 0.0)


@pytest.mark.parametrize("form", FORMS)
def test_turnovers_too_many_to_reach_keep_the_age_unpublished(form: tuple[type, type]) -> None:
    """turnovers * slots past 2**63 (the C form's counter) is still never reached: its product
    overflowed to a negative bound, which the first eviction passed, publishing an age."""
    model = new_model(form, 2, None, turnovers=2**62)
    for block in range(6):
        model.run([block], 1.0, False)
    assert len(model) == 2 and model.age is None


@pytest.mark.parametrize("form", FORMS)
def test_an_unhashable_block_is_a_type_error_and_the_model_still_runs(
    form: tuple[type, type],
) -> None:
    model = new_model(form, 4, 2)
    model.run([1, 2], 1.0, False)
    with pytest.raises(TypeError, match="unhashable"):
        model.run([1, [3]], 1.0, False)
    model.run([1, 2], 1.0, False)
    assert 1 in model and 2 in model and len(model) == 2


def test_an_unhashable_block_behind_a_miss_changes_neither_form() -> None:
    """The C form hashes a request whole before it runs it; the Python form counted the
    request's hits (decaying the count) and only then met the unhashable block."""
    models = [new_model(form, 4, 2) for form in FORMS]
    for model in models:
        model.run([1, 2], 1.0, False)
        model.run([1, 2], 1.0, False)
        before = state_of(model)
        with pytest.raises(TypeError, match="unhashable"):
            model.run([9, [3]], 0.5, False)
        assert state_of(model) == before
    assert state_of(models[0]) == state_of(models[1])


class _Meddler:
    """A key whose hash runs the model holding it, or whose equality raises."""

    model: object = None

    def __init__(self, raise_on_eq: bool) -> None:
        self.raise_on_eq = raise_on_eq

    def __hash__(self) -> int:
        if not self.raise_on_eq:
            self.model.run([1], 1.0, False)  # type: ignore[attr-defined]
        return 3

    def __eq__(self, other: object) -> bool:
        if self.raise_on_eq:
            raise ArithmeticError("no comparing")
        return self is other


def test_the_c_form_refuses_a_call_back_from_a_keys_hash_and_stays_whole() -> None:
    require_a_build_toolchain()
    model = new_model(FORMS[0], 4, None)
    _Meddler.model = model
    with pytest.raises(RuntimeError, match="called back while it runs a request"):
        model.run([_Meddler(False)], 1.0, False)
    model.run([1, 2], 1.0, False)
    assert len(model) == 2


class _Finalizer:
    """A key whose finalizer runs the structure that held it."""

    def __init__(self, run: Callable[[], object]) -> None:
        self.run = run

    def __del__(self) -> None:
        self.run()


def test_a_keys_finalizer_finds_a_reinitialised_model_whole_and_new() -> None:
    require_a_build_toolchain()
    model = new_model(FORMS[0], 4, None)
    model.run([_Finalizer(lambda: model.run([1], 1.0, False))], 1.0, False)
    model.__init__(4, None, 0, False, model.offers, 1)  # type: ignore[misc]
    assert list(model.probation) == [1]  # the finalizer's request, in the new model


def test_a_keys_finalizer_finds_a_reinitialised_history_whole_and_new() -> None:
    require_a_build_toolchain()
    history = BaseOfferHistory(8, PROVEN_OFFERS)
    history.admit([_Finalizer(lambda: history.admit([1], 2, 0, None))], 1, 0, None)
    history.__init__(8, PROVEN_OFFERS)  # type: ignore[misc]
    assert len(history) == 1 and history.admit([1], 3, 0, 1.5) == ([1], 0)  # offered at 2


@pytest.mark.parametrize("form", FORMS)
def test_a_key_whose_equality_raises_leaves_the_model_whole(form: tuple[type, type]) -> None:
    model = new_model(form, 4, None, protected_slots=2)
    model.run([3, 4], 1.0, False)  # 3 hashes as the meddler does: a compare follows
    with pytest.raises(ArithmeticError, match="no comparing"):
        model.run([_Meddler(True), 4], 1.0, False)
    assert len(model) == len(model.probation) + len(model.protected) <= model.slots
    model.run([3, 4], 1.0, False)
    assert 3 in model and 4 in model


@pytest.mark.parametrize("form", FORMS)
def test_runs_evictions_and_failures_hold_no_reference_to_a_block(
    form: tuple[type, type],
) -> None:
    """No block is held once the model and its history forgot it, whether it was evicted,
    demoted, refused or stored, or a request failed beside it: a reference the C form kept
    would keep every block of a long run alive."""
    blocks = [b"block %d" % i for i in range(30)]
    before = [sys.getrefcount(block) for block in blocks]
    model = new_model(form, 6, 2, protected_slots=3, admit_continuations=True)
    for step in range(60):
        start = step * 7 % 24
        model.run(blocks[start : start + 5], 0.9, step % 3 == 0, step % 2 == 0)
    assert model.age is not None  # the gate was on: some blocks were refused
    model.run([3, *blocks[:2]], 1.0, True)  # a continuation: stored whatever the gate
    assert 3 in model  # so a meddler, hashed as 3, is compared
    with pytest.raises(TypeError, match="unhashable"):
        model.run([*blocks[2:5], [1]], 1.0, False)
    with pytest.raises(ArithmeticError, match="no comparing"):
        model.run([*blocks[5:8], _Meddler(True)], 1.0, False)
    model.clear()
    assert [sys.getrefcount(block) for block in blocks] == before


class _KeptVerdict:
    """An offer history that admits everything and keeps the list it returns."""

    def __init__(self) -> None:
        self.admitted: list[object] = []

    def admit(self, blocks: list, now: int, free: int, oldest: object) -> tuple[list, int]:
        self.admitted = list(blocks)
        return self.admitted, 0

    def clear(self) -> None:
        self.admitted = []


class _EmptiesTheVerdict:
    """A block whose hash empties the offer history's kept verdict while it is stored."""

    def __init__(self, offers: _KeptVerdict) -> None:
        self.offers = offers

    def __hash__(self) -> int:
        self.offers.admitted.clear()
        return 5


@pytest.mark.parametrize("model_type", [BaseMiniature, PyMiniature])
def test_a_verdict_emptied_while_it_is_stored_stores_what_was_read(model_type: type) -> None:
    """The C form read the admitted list by the length it had before a block's hash emptied
    it (memory the list had freed); both forms store what they read before, and stop."""
    offers = _KeptVerdict()
    model = model_type(6, 2.0, 0, False, offers, 1)
    meddler = _EmptiesTheVerdict(offers)
    model.run([b"a", b"b", b"c", meddler], 1.0, False, False)
    assert list(model.probation) == [meddler]
    assert model.invariant_violations() == []


keys = st.one_of(st.integers(-20, 60), st.binary(min_size=1, max_size=2))
requests = st.lists(
    st.tuples(
        st.lists(keys, max_size=10),
        st.sampled_from([1.0, 0.9, 0.5]),  # decay
        st.booleans(),  # the tier held the head
        st.booleans(),  # the sample holds the request's end
        st.integers(0, 30),  # 0: both clear first
    ),
    max_size=60,
)


def corruptible_model(form: type) -> Any:
    """A model with blocks in both segments, whole."""
    history = BaseOfferHistory if form is BaseMiniature else PyOfferHistory
    model = form(4, None, 1, False, history(8, 3), 1)
    model.run([1, 2, 3], 1.0, False)
    model.run([1, 4], 1.0, False)  # 1 protected; 2, 3, 4 in probation (4 demoted last)
    assert list(model.protected) == [1]
    assert model.invariant_violations() == []
    return model


def test_the_c_model_reports_a_block_in_neither_segment() -> None:
    model = corruptible_model(BaseMiniature)
    with c_state(model) as state:
        lost = unlink_oldest(state, "probation")
        assert model.invariant_violations() == [
            f"block {lost!r} is held but in none of probation, protected"
        ]
    assert model.invariant_violations() == []


def test_the_c_model_reports_a_block_marked_as_in_the_other_segment() -> None:
    model = corruptible_model(BaseMiniature)
    with c_state(model) as state:
        index = state.probation.end[NEWEST]
        state.table.entries[index].count = 1  # PROTECTED
        assert model.invariant_violations() == [
            f"block {key_of(state, index)!r} is in probation but marked as in another list"
        ]


def test_the_c_model_reports_a_segment_miscounted_and_a_table_miscounted() -> None:
    model = corruptible_model(BaseMiniature)
    with c_state(model) as state:
        state.protected.length += 1
        state.table.count += 1
        assert model.invariant_violations() == [
            "protected counts 2 blocks but links 1",
            "the table counts 5 blocks but holds 4",
            "holds 5 blocks, over its 4 slots",
            "protected holds 2 blocks, over its 1 slots",
        ]


def test_the_c_model_reports_a_block_linked_into_both_segments() -> None:
    model = corruptible_model(BaseMiniature)
    with c_state(model) as state:
        shared = state.probation.end[NEWEST]
        protected = state.protected.end[NEWEST]
        state.table.entries[protected].toward[NEWEST] = shared
        state.protected.end[NEWEST] = shared
        state.protected.length += 1
        problems = model.invariant_violations()
        assert f"block {key_of(state, shared)!r} is in both probation and protected" in problems


def test_the_python_model_reports_a_block_in_both_segments() -> None:
    model = corruptible_model(PyMiniature)
    model.probation[1] = 0
    assert model.invariant_violations() == [
        "block 1 is in both probation and protected",
        "holds 5 blocks, over its 4 slots",  # the block counts twice
    ]


@pytest.mark.parametrize("form", [BaseMiniature, PyMiniature])
def test_both_model_forms_report_a_model_past_its_slots_in_the_same_words(form: type) -> None:
    model = corruptible_model(form)
    if form is PyMiniature:
        model.slots, model.protected_slots = 3, 0
        assert model.invariant_violations() == [
            "holds 4 blocks, over its 3 slots",
            "protected holds 1 blocks, over its 0 slots",
        ]
        return
    with c_state(model) as state:
        state.slots, state.protected_slots = 3, 0
        assert model.invariant_violations() == [
            "holds 4 blocks, over its 3 slots",
            "protected holds 1 blocks, over its 0 slots",
        ]


@given(
    requests,
    st.integers(1, 12),
    st.sampled_from([None, 1, 2, inf]),
    st.floats(0.0, 1.0),
    st.booleans(),
    st.integers(0, 2),
)
def test_the_c_and_python_forms_hold_the_same(
    calls: list,
    slots: int,
    horizon: float | None,
    protected_share: float,
    admit_continuations: bool,
    turnovers: int,
) -> None:
    protected_slots = int(protected_share * slots)
    models = [
        new_model(form, slots, horizon, protected_slots, admit_continuations, turnovers)
        for form in FORMS
    ]
    for request, decay, continues, ends, clear in calls:
        for model in models:
            if clear == 0:
                model.clear()
            model.run(request, decay, continues, ends)
        assert state_of(models[0]) == state_of(models[1])
        assert len(models[0]) <= slots and len(models[0].protected) <= models[0].protected_slots
        for model in models:
            assert model.invariant_violations() == model.offers.invariant_violations() == []


@given(
    st.lists(st.one_of(st.integers(-(2**70), 2**70), st.binary(max_size=4), st.text(max_size=3))),
    st.sampled_from([0, 1, 3, 15, 2**20 - 1, 2**31 - 1]),
)
def test_both_forms_sample_the_same_blocks(block_hashes: list, mask: int) -> None:
    assert sampled(block_hashes, mask) == py_sampled(block_hashes, mask)


def test_a_sample_of_a_quarter_keeps_about_a_quarter_of_sequential_ids() -> None:
    kept = sampled(range(40_000), 3)
    assert 9_000 < len(kept) < 11_000 and kept == sorted(kept)
