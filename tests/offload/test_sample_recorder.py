"""The worker's hold of the sample: what it keeps, sheds and counts, in both forms.

The sampler's test is the real one (SpatialSampler); the C recorder and the
Python one get the same sequences and must hold the same things.
"""

from __future__ import annotations

import gc

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


def counters(held) -> tuple[int, int, int]:
    return held.bytes, held.shed_requests, held.shed_block_refs


def test_the_c_recorder_is_built_where_it_can_be() -> None:
    require_a_build_toolchain()
    assert SampleRecorder is not PySampleRecorder


@pytest.mark.parametrize("form", FORMS)
def test_sampled_requests_are_held_with_their_block_counts(form: type) -> None:
    sampler = SpatialSampler(0.25)
    held = form(sampler.sample, 10**6, 100, 100, HOUR)
    requests = [list(range(start, start + 40)) for start in range(0, 400, 40)]
    for request in requests:
        held(request)
    held([])  # no blocks: counts nothing
    refs, sampled, unsampled_requests, unsampled_block_refs = held.drain()
    kept = [sampler.sample(r) for r in requests]
    assert sampled == [k for k in kept if k] and refs == [40] * len(sampled)
    assert unsampled_requests == kept.count([]) and unsampled_block_refs == 40 * kept.count([])
    assert held.bytes == 0 and held.drain() == ([], [], 0, 0), "drained: it starts over"


@pytest.mark.parametrize("form", FORMS)
def test_a_request_that_would_overflow_a_bound_is_shed_whole_and_counted(form: type) -> None:
    held = recorder(form, max_bytes=9 * 10, max_requests=3, max_request_blocks=5)
    held([1, 2, 3, 4, 5, 6])  # more blocks than a request may list
    assert counters(held) == (0, 1, 6)
    held([1, 2, 3, 4])
    held([5, 6, 7, 8, 9, 10, 11][:5])  # 4 + 5 int hashes fit in 90 bytes...
    held([12, 13])  # ...two more do not
    assert counters(held) == (81, 2, 8)
    held([14])  # the third request fits
    held([15])  # a fourth is one request too many
    assert counters(held) == (90, 3, 9)
    refs, sampled, _, _ = held.drain()
    assert refs == [4, 5, 1] and sampled == [[1, 2, 3, 4], [5, 6, 7, 8, 9], [14]]
    assert counters(held) == (0, 3, 9), "shed counts are cumulative across frames"


@pytest.mark.parametrize("form", FORMS)
def test_bytes_hashes_are_priced_by_their_size(form: type) -> None:
    held = recorder(form, max_bytes=2 * 34 + 1)
    held([b"x" * 32, b"y" * 32])
    assert held.bytes == 68
    held([b"z"])  # 3 bytes: over by 2
    assert counters(held) == (68, 1, 1)


@pytest.mark.parametrize("form", FORMS)
def test_a_frame_is_due_when_half_full_or_when_its_period_passed(form: type) -> None:
    held = recorder(form, max_bytes=36, max_requests=4)
    assert not held.due()
    held([1])
    assert not held.due()
    held([2])  # two of four requests
    assert held.due()
    held.drain()
    held([1, 2])  # 18 of 36 bytes
    assert held.due()
    held.drain()
    assert not held.due(), "a drain starts the period over"
    quick = recorder(form, period_s=0.001)
    wait_until(quick.due, "the period passes")


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
    assert held.drain() == ([20], [sample(request)], 0, 0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("request_hashes", "named"),
    [([1, b"ab"], "bytes in a request of int"), ([b"ab", 1], "int in a request of bytes"),
     (["abc"], "str in a request of str"), ([b"ab", 1.5], "float in a request of bytes")],
)  # fmt: skip
def test_a_request_a_frame_could_not_carry_is_refused_by_its_types(
    form: type, request_hashes: list, named: str
) -> None:
    """At rate 1 nothing else looks at the hashes' types first."""
    held = recorder(form)
    held([1, 2])
    with pytest.raises(TypeError, match=f"all ints or all bytes: found {named}$"):
        held(request_hashes)
    assert counters(held) == (18, 0, 0) and held.drain() == ([2], [[1, 2]], 0, 0)


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
    st.lists(st.lists(st.integers(0, 2**64), max_size=12), max_size=30),
    st.lists(st.lists(st.binary(max_size=40), max_size=12), max_size=30),
)


@given(
    one_type_requests,
    st.sets(st.integers(0, 29)),
    st.integers(1, 200),
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
        for held in forms:
            held(request)
        assert counters(forms[0]) == counters(forms[1])
        assert forms[0].due() == forms[1].due()
        if index in drains:
            assert forms[0].drain() == forms[1].drain()
    assert forms[0].drain() == forms[1].drain()


class _Key(bytes):
    """A bytes subclass: its instances may refer to other objects."""


def test_the_c_recorder_leaves_hashes_that_refer_to_nothing_out_of_the_collectors_walks() -> None:
    """A held list of exact ints or exact bytes can be in no reference cycle, so the garbage
    collector is spared it; a list holding a subclass's instances stays tracked."""
    if SampleRecorder is PySampleRecorder:
        pytest.skip("no C form built")
    held = recorder(SampleRecorder)
    for request in ([1, 2], [b"a" * 8], [_Key(b"b" * 8)]):
        held(request)
    _, sampled, _, _ = held.drain()
    assert [gc.is_tracked(hashes) for hashes in sampled] == [False, False, True]
