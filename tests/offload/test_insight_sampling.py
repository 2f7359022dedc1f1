"""The spatial sample: a block is in or out for good, at the rate asked."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offload.insight.sampling import PRIME, PySampleTest, SampleTest, SpatialSampler
from tests.support.native import require_a_build_toolchain


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_sequential_ids_are_kept_at_the_rate(rate: float) -> None:
    kept = len(SpatialSampler(rate).sample(list(range(200_000))))
    assert kept / 200_000 == pytest.approx(rate, rel=0.05)


def test_digests_are_kept_at_the_rate() -> None:
    digests = [hashlib.sha256(str(i).encode()).digest() for i in range(50_000)]
    assert len(SpatialSampler(0.1).sample(digests)) / 50_000 == pytest.approx(0.1, rel=0.05)


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=50), st.integers(0, 9))
def test_a_bytes_hash_is_sampled_as_the_int_of_its_first_8_bytes(
    request: list[bytes], seed: int
) -> None:
    """Whatever its length (a hash shorter than 8 bytes takes the slower path): the test
    reads the same int as ``is_sampled``, little-endian, for bytes and bytearray alike."""
    sampler = SpatialSampler(0.3, seed)
    expected = [
        h
        for h in request
        if int.from_bytes(h[:8], "little") * sampler.multiplier % PRIME < sampler.threshold
    ]
    assert sampler.sample(request) == expected
    assert [h for h in request if sampler.is_sampled(h)] == expected
    assert sampler.sample([bytearray(h) for h in request]) == [bytearray(h) for h in expected]


@given(st.lists(st.integers(0, 2**62), max_size=50), st.integers(0, 9))
def test_a_block_is_kept_wherever_it_appears_and_order_is_kept(
    request: list[int], seed: int
) -> None:
    sampler = SpatialSampler(0.3, seed)
    kept = sampler.sample(request)
    assert kept == [h for h in request if sampler.is_sampled(h)]
    assert SpatialSampler(0.3, seed).sample(list(reversed(request))) == kept[::-1]


def test_a_lower_rate_keeps_a_subset_and_seeds_draw_other_samples() -> None:
    blocks = list(range(20_000))
    wide = set(SpatialSampler(0.2, seed=3).sample(blocks))
    narrow = set(SpatialSampler(0.2, seed=3).narrowed(0.05).sample(blocks))
    assert narrow < wide
    assert set(SpatialSampler(0.2, seed=4).sample(blocks)) != wide


def test_rate_one_keeps_everything() -> None:
    assert SpatialSampler(1.0).sample([5, b"x", 7]) == [5, b"x", 7]


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, float("nan"), "0.1", True])
def test_a_bad_rate_is_refused_by_name(rate: object) -> None:
    with pytest.raises(ValueError, match="sampling rate must be"):
        SpatialSampler(rate)  # type: ignore[arg-type]


def test_narrowing_to_a_higher_rate_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cannot narrow a sample at rate 0\.1 to a higher"):
        SpatialSampler(0.1).narrowed(0.2)


def test_an_unsupported_hash_type_is_named() -> None:
    with pytest.raises(TypeError, match="cannot sample a block hash of type str"):
        SpatialSampler(0.5).sample(["abc"])


def test_the_c_test_is_built_where_it_can_be() -> None:
    require_a_build_toolchain()
    assert SampleTest is not PySampleTest


hashes_of_one_type = st.one_of(
    st.lists(st.integers(-(2**70), 2**70), max_size=40),
    st.lists(st.binary(max_size=40), max_size=40),
    st.lists(st.binary(max_size=40).map(bytearray), max_size=40),
    st.lists(st.one_of(st.integers(0, 2**64), st.binary(max_size=12)), max_size=40),
)


@given(hashes_of_one_type, st.integers(0, 9), st.sampled_from([0.01, 0.3, 0.999]))
def test_the_c_and_python_tests_keep_the_same_hashes(
    hashes: list[int | bytes], seed: int, rate: float
) -> None:
    """Ints beyond 64 bits and negative ones included (the C test's slow and floored paths),
    and requests mixing ints and bytes (each hash by its own type)."""
    sampler = SpatialSampler(rate, seed)
    python = PySampleTest(sampler.multiplier, sampler.threshold, PRIME)
    assert SampleTest(sampler.multiplier, sampler.threshold, PRIME)(hashes) == python(hashes)


@pytest.mark.parametrize("form", [SampleTest, PySampleTest])
@pytest.mark.parametrize(
    ("hashes", "named"),
    [
        ([1.5], "float"),
        ([1, 2, "abc"], "str"),
        ([b"ab", 3, True], "bool"),
        ([b"x", None], "NoneType"),
    ],
)
def test_either_form_names_an_unsupported_hash_type(form: type, hashes: list, named: str) -> None:
    """Wherever it sits: a str after ints is refused before a multiply repeats it."""
    with pytest.raises(TypeError, match=f"cannot sample a block hash of type {named}$"):
        form(663_000_000, 100, PRIME)(hashes)


def test_the_c_test_refuses_parameters_it_cannot_hold() -> None:
    if SampleTest is PySampleTest:
        pytest.skip("no C form built")
    with pytest.raises(ValueError, match="odd prime < 2\\*\\*32"):
        SampleTest(3, 100, 2**40)
    with pytest.raises(TypeError, match="one sequence of block hashes"):
        SampleTest(3, 100, PRIME)([1], [2])


class _Key(bytes):
    """A bytes subclass, as a caller's key type might be."""


def test_both_forms_sample_a_bytes_subclass_as_bytes() -> None:
    sampler = SpatialSampler(0.3)
    keys = [_Key(i.to_bytes(8, "little") + bytes(28)) for i in range(200)]
    python = PySampleTest(sampler.multiplier, sampler.threshold, PRIME)(keys)
    assert python == SampleTest(sampler.multiplier, sampler.threshold, PRIME)(keys)
    assert python == sampler.sample([bytes(k) for k in keys]) and 0 < len(python) < 200
