"""Numbers from kv_connector_extra_config: what JSON gives is accepted, every bad value named."""

from __future__ import annotations

import re

import pytest

from offload.cpu.config import ConfigError, positive_int


@pytest.mark.parametrize(
    ("value", "number"), [(4e9, 4_000_000_000), ("250", 250), ("0", 0), (7, 7)]
)
def test_values_parsed_from_json_are_accepted(value: object, number: int) -> None:
    assert positive_int("cpu_bytes_to_use", value, minimum=0) == number


def test_a_minimum_of_zero_admits_zero() -> None:
    assert positive_int("store_threshold", "0", minimum=0) == 0


def test_a_negative_zero_is_refused_as_text_and_as_a_float() -> None:
    """-0.0 equals 0, so a minimum of 0 took it while the text "-0" was refused: the two
    spellings of one value now meet the same answer, naming the key."""
    for value, problem in (("-0", "it has a sign"), (-0.0, "it is a negative zero")):
        with pytest.raises(ConfigError) as caught:
            positive_int("store_threshold", value, minimum=0)
        assert f"store_threshold={value!r} is not a whole number" in str(caught.value)
        assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cpu_bytes_to_use", 0, "cpu_bytes_to_use=0 must be at least 1"),
        ("cpu_bytes_to_use", -5, "cpu_bytes_to_use=-5 must be at least 1"),
        ("cpu_bytes_to_use", "lots", "cpu_bytes_to_use='lots' is not a whole number"),
        ("cpu_bytes_to_use", 1.5, "cpu_bytes_to_use=1.5 is not a whole number"),
        ("cpu_bytes_to_use", True, "cpu_bytes_to_use=True is not a whole number"),
        ("cpu_bytes_to_use", None, "cpu_bytes_to_use=None is not a whole number"),
        ("num_cpu_blocks", "0", "num_cpu_blocks='0' must be at least 1"),
        ("num_cpu_blocks", "-3", "num_cpu_blocks='-3' is not a whole number: .*: it has a sign"),
        ("num_cpu_blocks", [4], r"num_cpu_blocks=\[4\] is not a whole number"),
        ("num_cpu_blocks", "1_000", "num_cpu_blocks='1_000' is not a whole number"),
        ("num_cpu_blocks", "\u0661\u0662", "is not a whole number"),  # Arabic-Indic 12
        ("num_cpu_blocks", "0x10", "num_cpu_blocks='0x10' is not a whole number"),
        ("num_cpu_blocks", "9" * 5000, "num_cpu_blocks='9999.*: it has more than 20 char"),
    ],
)
def test_every_bad_value_is_one_clear_error_naming_the_key(
    key: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        positive_int(key, value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (" 32 ", "it has white space"),
        ("32\n", "it has white space"),
        ("+32", "it has a sign"),
        ("0032", "it has a leading zero"),
        ("32.0", "it has a character that is not a digit"),
        ("", "it is empty"),
    ],
)
def test_text_is_read_by_the_one_rule_the_sidecar_reads_numbers_by(text: str, problem: str) -> None:
    """int() took each of these as 32 (or refused "" naming no key): second spellings of a
    number that the ``KVSCOPE_*`` variables and the HTTP API refuse."""
    with pytest.raises(ConfigError, match=f"num_cpu_blocks=.* is not a whole number: .*{problem}"):
        positive_int("num_cpu_blocks", text)


@pytest.mark.parametrize(("value", "number"), [(322122547.2, 322122547), (4e9, 4_000_000_000)])
def test_a_byte_size_in_float_bytes_is_floored_as_vllm_floors_it(value: float, number: int) -> None:
    assert positive_int("cpu_bytes_to_use", value, floor=True) == number


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1.5, "cpu_bytes_to_use=-1.5 must be at least 1"),
        (0.5, "cpu_bytes_to_use=0.5 must be at least 1"),
        (float("inf"), "cpu_bytes_to_use=inf is not a whole number"),
        (float("nan"), "cpu_bytes_to_use=nan is not a whole number"),
    ],
)
def test_a_floored_value_out_of_bounds_is_named_as_given(value: float, message: str) -> None:
    """The bound holds for the floored number, but the error names what the user wrote:
    -1.5 was named as the -2 it floors to, a value nobody gave."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        positive_int("cpu_bytes_to_use", value, floor=True)
