"""The worker's hold of the sample: what it keeps, sheds and counts, in both forms.

The sampler's test is the real one (SpatialSampler); the C recorder and the
Python one get the same sequences and must hold the same bytes, which must
be msgspec's own encoding of the held requests.
"""

from __future__ import annotations

import sys

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from offload.insight.sampling import SpatialSampler
from offload.wire.sample_recorder import PySampleRecorder, SampleRecorder
from tests.support.native import require_a_build_toolchain
from tests.support.polling import wait_until

FORMS = [SampleRecorder, PySampleRecorder]
KEEP_ALL = SpatialSampler(1.0).sample
HOUR = 3600.0


def recorder(form: type, max_bytes: int = 1000, max_requests: int = 100,
             max_request_blocks: int = 100, period_s: float = HOUR):  # fmt: skip
    return form(KEEP_ALL, max_bytes, max_requests, max_request_blocks, period_s)


def packed(*requests: tuple[int, list]) -> bytes:
    """msgspec's msgpack of held requests, each (block_refs, sampled hashes)."""
    return msgspec.msgpack.encode([list(request) for request in requests])


def size(block_refs: int, sampled: list) -> int:
    """The bytes one held request takes: its msgpack, [block_refs, [hash, ...]]."""
    return len(msgspec.msgpack.encode([block_refs, sampled]))


def counters(held) -> tuple[int, int, int]:
    return held.bytes, held.shed_requests, held.shed_block_refs


def test_the_c_recorder_is_built_where_it_can_be() -> None:
    require_a_build_toolchain()
    assert SampleRecorder is not PySampleRecorder


def test_the_c_recorder_runs_a_c_tests_selection_and_calls_any_other_test() -> None:
    """The C test offers its selection in C (offload/sample_select.h); a wrapper around the
    same test does not, so the recorder calls it: both hold the same bytes."""
    if SampleRecorder is PySampleRecorder:
        pytest.skip("no C form built")
    test = SpatialSampler(0.3).sample
    selecting = SampleRecorder(test, 10**6, 100, 100, HOUR)
    calling = SampleRecorder(lambda hashes: test(hashes), 10**6, 100, 100, HOUR)
    assert selecting.selects_in_c and not calling.selects_in_c
    assert not PySampleRecorder(test, 10**6, 100, 100, HOUR).selects_in_c
    requests = [list(range(start, start + 100)) for start in range(0, 3000, 100)]
    requests += [[b"k%d" % i for i in range(start, start + 7)] for start in range(0, 70, 7)]
    for request in requests:
        selecting(request)
        calling(request)
    assert selecting.drain() == calling.drain()
    with pytest.raises(TypeError, match="cannot sample a block hash of type str"):
        selecting([1, "a"])


def test_a_c_selection_copied_onto_another_callable_is_not_run_on_it() -> None:
    """The selection reads its test's struct: run on an object of another type (one that
    copied the capsule) it read memory that object does not have. The recorder calls such a
    test, as the Python form does."""
    if SampleRecorder is PySampleRecorder:
        pytest.skip("no C form built")
    test = SpatialSampler(0.3).sample

    class Copycat:
        _c_select = test._c_select  # type: ignore[attr-defined]

        def __call__(self, hashes: list) -> list:
            return test(hashes)

    copied = SampleRecorder(Copycat(), 10**6, 100, 100, HOUR)
    python = PySampleRecorder(Copycat(), 10**6, 100, 100, HOUR)
    assert not copied.selects_in_c
    for start in range(0, 1000, 100):
        copied(list(range(start, start + 100)))
        python(list(range(start, start + 100)))
    assert copied.drain() == python.drain()


@pytest.mark.parametrize("form", FORMS)
def test_sampled_requests_are_held_with_their_block_counts(form: type) -> None:
    sampler = SpatialSampler(0.25)
    held = form(sampler.sample, 10**6, 100, 100, HOUR)
    requests = [list(range(start, start + 40)) for start in range(0, 400, 40)]
    for request in requests:
        held(request)
    held([])  # no blocks: counts nothing
    requests_msgpack, count, unsampled_requests, unsampled_block_refs = held.drain()
    kept = [sampler.sample(r) for r in requests]
    assert msgspec.msgpack.decode(requests_msgpack) == [[40, k] for k in kept if k]
    assert count == len(kept) - kept.count([]) > 0
    assert unsampled_requests == kept.count([]) and unsampled_block_refs == 40 * kept.count([])
    assert held.bytes == 0 and held.drain() == (packed(), 0, 0, 0), "drained: it starts over"


@pytest.mark.parametrize("form", FORMS)
def test_a_request_that_would_overflow_a_bound_is_shed_whole_and_counted(form: type) -> None:
    budget = size(4, [1, 2, 3, 4]) + size(5, [5, 6, 7, 8, 9]) + size(1, [14])
    held = recorder(form, max_bytes=budget, max_request_blocks=5)
    held([1, 2, 3, 4, 5, 6])  # more blocks than a request may list
    assert counters(held) == (0, 1, 6)
    held([1, 2, 3, 4])
    held([5, 6, 7, 8, 9])
    held([300, 301])  # over the bytes left by one (ints from 128 take two bytes)
    assert counters(held) == (budget - size(1, [14]), 2, 8)
    held([14])  # fits exactly
    assert counters(held) == (budget, 2, 8)
    assert held.drain() == (packed((4, [1, 2, 3, 4]), (5, [5, 6, 7, 8, 9]), (1, [14])), 3, 0, 0)
    held([7])
    assert counters(held) == (size(1, [7]), 2, 8), "shed counts are cumulative across frames"


@pytest.mark.parametrize("form", FORMS)
def test_a_request_past_the_requests_a_frame_may_hold_is_shed(form: type) -> None:
    held = recorder(form, max_requests=2)
    for request in ([1], [2], [3, 4]):
        held(request)
    assert counters(held) == (2 * size(1, [1]), 1, 2)
    assert held.drain() == (packed((1, [1]), (1, [2])), 2, 0, 0)


@pytest.mark.parametrize("form", FORMS)
def test_the_bytes_held_are_the_requests_msgpack(form: type) -> None:
    held = recorder(form, max_bytes=size(2, [b"x" * 32, b"y" * 32]) + size(1, [b"z"]) - 1)
    held([b"x" * 32, bytearray(b"y" * 32)])
    assert held.bytes == size(2, [b"x" * 32, b"y" * 32]) == 71
    held([b"z"])  # one byte over
    assert counters(held) == (71, 1, 1)
    long = b"w" * 300  # bin16: a longer length field
    roomy = recorder(form, max_bytes=10**6, max_request_blocks=5000)
    wide = [-1, -33, -129, -40_000, -(2**40), 2**64 - 1]
    for request in ([long], wide, list(range(4000))):  # the last outgrows the first allocation
        roomy(request)
    assert roomy.drain()[0] == packed((1, [long]), (6, wide), (4000, list(range(4000))))


class _Key(bytes):
    """A bytes subclass, as a caller's own hash type might be."""


@pytest.mark.parametrize("form", FORMS)
def test_hashes_are_held_as_bytes_not_as_references(form: type) -> None:
    """The hold keeps no hash object alive, so a frame's wait costs the collector nothing; a
    bytes subclass's hashes are framed as plain bytes."""
    key = _Key(b"k" * 8)
    before = sys.getrefcount(key)
    held = recorder(form)
    held([key, b"j" * 8])
    assert sys.getrefcount(key) == before
    assert held.drain()[0] == packed((2, [b"k" * 8, b"j" * 8]))


@pytest.mark.parametrize("form", FORMS)
def test_a_frame_is_due_when_half_full_or_when_its_period_passed(form: type) -> None:
    held = recorder(form, max_bytes=2 * size(14, list(range(14))), max_requests=4)
    assert not held.due()
    held([1])
    assert not held.due()
    held([2])  # two of four requests
    assert held.due()
    held.drain()
    held(list(range(14)))  # half the bytes
    assert held.due()
    held.drain()
    assert not held.due(), "a drain starts the period over"
    quick = recorder(form, period_s=0.001)
    wait_until(quick.due, "the period passes")
    with pytest.raises(TypeError, match="takes"):
        held.due(1)  # type: ignore[call-arg]


@pytest.mark.parametrize("form", FORMS)
def test_a_bad_hash_changes_nothing_held(form: type) -> None:
    sample = SpatialSampler(0.5).sample
    held = form(sample, 1000, 100, 100, HOUR)
    request = list(range(20))
    held(request)
    before = counters(held)
    with pytest.raises(TypeError, match="cannot sample a block hash of type str"):
        held([*request, "abc"])
    assert counters(held) == before
    assert held.drain() == (packed((20, sample(request))), 1, 0, 0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("request_hashes", "named"),
    [([1, b"ab"], "bytes in a request of int"), ([b"ab", 1], "int in a request of bytes"),
     (["abc"], "str in a request of str"), ([b"ab", 1.5], "float in a request of bytes"),
     ([2**64, b"ab"], "bytes in a request of int")],
)  # fmt: skip
def test_a_request_a_frame_could_not_carry_is_refused_by_its_types(
    form: type, request_hashes: list, named: str
) -> None:
    """At rate 1 nothing else looks at the hashes' types first. Every type is checked before
    any value: a mix is named as one even behind an int too wide to frame."""
    held = recorder(form)
    held([1, 2])
    with pytest.raises(TypeError, match=f"all ints or all bytes: found {named}$"):
        held(request_hashes)
    assert counters(held) == (size(2, [1, 2]), 0, 0)
    assert held.drain() == (packed((2, [1, 2])), 1, 0, 0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("wide", [2**64, -(2**63) - 1, 2**200])
def test_an_int_hash_msgpack_cannot_carry_is_refused(form: type, wide: int) -> None:
    held = recorder(form)
    held([1, 2])
    with pytest.raises(OverflowError, match=r"from -2\*\*63 to 2\*\*64 - 1"):
        held([3, wide])
    assert counters(held) == (size(2, [1, 2]), 0, 0)
    assert held.drain() == (packed((2, [1, 2])), 1, 0, 0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ((0, 1, 1, 1.0), "max_bytes"),
        ((1, 0, 1, 1.0), "max_requests"),
        ((1, 1, -5, 1.0), "max_request_blocks"),
        ((1, 1, 1, 0.0), "period_s"),
        ((1, 1, 1, float("nan")), "period_s"),
    ],
)
def test_a_bad_limit_is_refused_by_name(form: type, limits: tuple, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        form(KEEP_ALL, *limits)


one_type_requests = st.one_of(
    st.lists(st.lists(st.integers(-(2**64), 2**64), max_size=12), max_size=30),
    st.lists(st.lists(st.binary(max_size=300), max_size=12), max_size=30),
)


def _outcome(held, request: list) -> str | None:
    """The error's type a request raised, or None."""
    try:
        held(request)
    except (TypeError, OverflowError) as error:
        return type(error).__name__
    return None


@given(
    one_type_requests,
    st.sets(st.integers(0, 29)),
    st.integers(1, 400),
    st.integers(1, 6),
    st.integers(1, 10),
    st.sampled_from([0.3, 1.0]),
)
def test_the_c_and_python_recorders_hold_the_same(
    requests: list, drains: set[int], max_bytes: int, max_requests: int,
    max_request_blocks: int, rate: float,
) -> None:  # fmt: skip
    sample = SpatialSampler(rate).sample
    forms = [form(sample, max_bytes, max_requests, max_request_blocks, HOUR) for form in FORMS]
    for index, request in enumerate(requests):
        assert _outcome(forms[0], request) == _outcome(forms[1], request)
        assert counters(forms[0]) == counters(forms[1])
        assert forms[0].due() == forms[1].due()
        if index in drains:
            assert forms[0].drain() == forms[1].drain()
    assert forms[0].drain() == forms[1].drain()
