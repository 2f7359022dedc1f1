"""The admission gate's memory in both forms: the C one and the Python one hold the same.

tests/offload/test_admission.py holds the rule itself through the form in use;
here both forms get the same scripted and random sequences.
"""

from __future__ import annotations

import sys
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offload.cpu.policies.offer_history import (
    OFFERS_PER_SLOT,
    PROVEN_OFFERS,
    BaseOfferHistory,
    OfferHistory,
    PyOfferHistory,
)
from tests.support.c_key_tables import c_state, unlink_oldest
from tests.support.native import require_a_build_toolchain

FORMS = [BaseOfferHistory, PyOfferHistory]


def test_the_c_form_is_built_where_it_can_be() -> None:
    require_a_build_toolchain()
    assert BaseOfferHistory is not PyOfferHistory
    assert isinstance(OfferHistory(2), BaseOfferHistory)
    assert OfferHistory(2).limit == OFFERS_PER_SLOT * 2


@pytest.mark.parametrize("form", FORMS)
def test_offers_are_counted_and_the_least_recently_offered_forgotten(form: type) -> None:
    history = form(3, PROVEN_OFFERS)
    assert history.admit(["a", "b"], 1, free=0, oldest=1) == ([], 2)  # never offered before
    assert history.admit(["a"], 5, free=0, oldest=1) == (["a"], 0)  # offered at 1 >= oldest
    assert history.admit(["a"], 9, free=0, oldest=100) == (["a"], 0)  # the third offer: proven
    history.admit(["c", "d"], 10, free=0, oldest=None)  # "b", offered least recently, goes
    assert len(history) == 3
    assert history.admit(["b"], 11, free=0, oldest=0) == ([], 1)  # forgotten: a first offer
    assert history.admit(["a"], 12, free=0, oldest=100) == ([], 1)  # forgotten in its turn


@pytest.mark.parametrize("form", FORMS)
def test_blocks_are_told_apart_by_equality_not_by_their_hash(form: type) -> None:
    """-1 and -2 share a Python hash; equal ints or bytes built apart are one block."""
    history = form(10, PROVEN_OFFERS)
    history.admit([-1, 2**70, b"key" * 12], 1, free=0, oldest=None)
    assert history.admit([-2], 2, free=0, oldest=0) == ([], 1)  # never offered itself
    assert history.admit([-1, 2**70 + int("0"), bytes(b"key" * 12)], 3, free=0, oldest=1) == (
        [-1, 2**70, b"key" * 12],
        0,
    )
    assert len(history) == 4


@pytest.mark.parametrize("form", FORMS)
def test_an_unhashable_block_is_a_type_error(form: type) -> None:
    history = form(10, PROVEN_OFFERS)
    with pytest.raises(TypeError, match="unhashable"):
        history.admit([1, [2]], 1, free=5, oldest=None)


@pytest.mark.parametrize("form", FORMS)
def test_clear_forgets_every_offer_and_the_limit_stays(form: type) -> None:
    history = form(4, PROVEN_OFFERS)
    history.admit([1, 2, 3], 1, free=0, oldest=None)
    history.clear()
    assert len(history) == 0 and history.limit == 4
    assert history.admit([1], 2, free=0, oldest=0) == ([], 1)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("limit", "proven"), [(-1, 3), (5, 0)])
def test_a_bad_size_is_refused(form: type, limit: int, proven: int) -> None:
    with pytest.raises(ValueError, match="limit must be >= 0 and proven_offers >= 1"):
        form(limit, proven)


@pytest.mark.parametrize("form", [BaseOfferHistory, PyOfferHistory])
def test_both_history_forms_report_a_history_past_its_limit_in_the_same_words(
    form: type,
) -> None:
    history = form(8, 3)
    history.admit([1, 2, 3], 1, 0, None)
    if form is PyOfferHistory:
        history.limit = 2
        assert history.invariant_violations() == ["holds 3 blocks, over its limit of 2"]
        return
    with c_state(history) as state:
        state.limit = 2
        assert history.invariant_violations() == ["holds 3 blocks, over its limit of 2"]


def test_the_c_history_reports_a_block_out_of_its_recency_order() -> None:
    history = BaseOfferHistory(8, 3)
    history.admit([1, 2, 3], 1, 0, None)
    with c_state(history) as state:
        assert unlink_oldest(state, "recency") == 1
        assert history.invariant_violations() == [
            "block 1 is held but in none of the recency order"
        ]


keys = st.one_of(st.integers(-40, 40), st.binary(min_size=1, max_size=3))
calls = st.lists(
    st.tuples(
        st.lists(keys, max_size=12),
        st.integers(0, 3),  # time passing before the call
        st.integers(0, 6),  # free slots
        st.one_of(st.none(), st.integers(-5, 5)),  # how far back the horizon reaches
        st.integers(0, 9),  # 0: both forget everything first
    ),
    max_size=40,
)


@given(calls, st.integers(0, 30), st.integers(1, 4))
def test_the_c_and_python_forms_hold_the_same(calls: list, limit: int, proven: int) -> None:
    histories = [form(limit, proven) for form in FORMS]
    now = 0
    for block_hashes, step, free, back, clear in calls:
        if clear == 0:
            for history in histories:
                history.clear()
        now += step
        oldest = None if back is None else now - back + 0.5
        results = [history.admit(block_hashes, now, free, oldest) for history in histories]
        assert results[0] == results[1]
        assert len(histories[0]) == len(histories[1]) <= limit
        assert histories[0].invariant_violations() == histories[1].invariant_violations() == []


@pytest.mark.parametrize("form", FORMS)
def test_an_offer_far_beyond_the_limit_leaves_no_memory_behind(form: type) -> None:
    """One store of many more blocks than the history remembers (a huge request offered to a
    small tier) must not leave tables sized for it: blocks are forgotten as they come."""
    history = form(4, PROVEN_OFFERS)
    history.admit(list(range(8)), 0, 0, None)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        history.admit(list(range(100, 100_100)), 1, 0, None)
        assert len(history) == 4
        assert tracemalloc.get_traced_memory()[0] - before < 64 * 1024
    finally:
        tracemalloc.stop()


class _Unequal:
    """A block whose equality raises (its hash is 7's)."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise ArithmeticError("no comparing")


@pytest.mark.parametrize("form", FORMS)
def test_offers_forgets_and_failures_hold_no_reference_to_a_block(form: type) -> None:
    """No block is held once forgotten, whether it left by the limit or by clear(), was
    offered again as an equal copy, or an offer failed beside it: a reference the C form kept
    would keep every block of a long run alive."""
    blocks = [b"block %d" % i for i in range(40)]
    copies = [bytes(bytearray(block)) for block in blocks]  # equal, but other objects
    before = [sys.getrefcount(block) for block in blocks + copies]
    history = form(16, PROVEN_OFFERS)
    for step in range(1, 30):
        history.admit(blocks[step % 20 : step % 20 + 12], step, 2, step - 3)
        history.admit(copies[step % 7 : step % 7 + 5], step, 0, None)  # offered again
    history.admit([*blocks[:3], 7], 30, 0, None)
    with pytest.raises(TypeError, match="unhashable"):
        history.admit([*blocks[3:6], [1], *blocks[6:9]], 31, 0, None)
    with pytest.raises(ArithmeticError, match="no comparing"):
        history.admit([*blocks[9:12], _Unequal()], 32, 0, None)
    history.clear()
    assert [sys.getrefcount(block) for block in blocks + copies] == before


class _Clearing:
    """A block whose equality empties the history that compares it (then claims a match)."""

    history: object = None

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        self.history.clear()  # type: ignore[attr-defined]
        return True


def test_a_block_whose_equality_changes_the_history_is_looked_up_again() -> None:
    """As a dict's lookup is: the match it claimed was in a table that is gone (the C form read
    the emptied table's entries through it). The C form only: the Python form's OrderedDict.pop
    crashes CPython on such a block (python/cpython#142637, open)."""
    require_a_build_toolchain()
    history = BaseOfferHistory(8, PROVEN_OFFERS)
    _Clearing.history = history
    first, second = _Clearing(), _Clearing()
    history.admit([first], 1, 0, None)
    assert history.admit([second], 2, 0, 1) == ([], 1)  # a first offer, in the emptied history
    assert len(history) == 1
    assert history.invariant_violations() == []
