"""Numbers that arrive as text (a query string, a header, an environment variable, a string in
vLLM's ``kv_connector_extra_config``): plain ASCII decimal digits, written as kvscope writes
them, or refused naming why.

Python's ``int`` and ``float`` read far more than digits: ``1_0``, ``+3``,
`` 3 ``, ``3.0``, ``nan`` and, in ``int``, Arabic-Indic or full-width digits.
Each is a second spelling of a number kvscope writes one way (an event id, a
cursor, a rate), which a cache, a log search or a proxy's rule keyed on the
text then misses. So a whole number is at most ``MAX_DIGITS`` ASCII digits,
with no sign and no leading zero (``0`` itself excepted); anything else is a
ValueError whose message names the form and the problem.

Fractional numbers (a timestamp, a timeout, a sampling rate) follow the same
rule, with a minus sign, a fraction and an exponent as Python and JavaScript
print them (``0.5``, ``-2``, ``1732850000.25``, ``1e-05``): no plus sign,
space, underscore, ``inf`` or ``nan``; and none that reads as zero unless written as
one: a negative zero (``-0``, ``-0.0``) equals 0, so every lower bound of 0 took it
for 0, and ``1e-400`` is 0 to a double, so a rate written above zero read as "off".
A negative zero given as a float is refused by the same words (``NEGATIVE_ZERO``).

The rule lives in the core, below every layer, because both sides read such
text: the worker its vLLM settings, the sidecar its URLs, headers and
``KVSCOPE_*`` variables (``app/decimal_text.py`` makes pydantic rules of it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final, TypeVar

MAX_DIGITS: Final = 20
"""Digits in the largest 64-bit unsigned number: every number kvscope reads fits."""

POSITIVE_PATTERN: Final = rf"[1-9][0-9]{{0,{MAX_DIGITS - 1}}}"
"""A number above zero as kvscope writes it."""

MAX_FLOAT_CHARS: Final = 64
"""Longest fractional number read: far past any double's shortest spelling (24)."""

NEGATIVE_ZERO: Final = "it is a negative zero (0 is written without a sign)"
"""Why -0 is refused, as text or as a float."""

T = TypeVar("T")

_DECIMAL: Final = re.compile(f"0|{POSITIVE_PATTERN}")
_FRACTIONAL: Final = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NONZERO_DIGIT: Final = re.compile(r"[1-9]")
_FORM: Final = (
    f"plain decimal digits 0-9 (at most {MAX_DIGITS}; no sign, space, underscore or leading zero)"
)
_FLOAT_FORM: Final = (
    "a decimal number such as 2, 0.5 or 1e-05 (ASCII digits; no plus sign, space, "
    "underscore, inf or nan)"
)


def _problem(text: str) -> str | None:
    """What keeps ``text`` from being a whole number in the one form, in words; None if it is."""
    if len(text) > MAX_DIGITS:
        return f"it has more than {MAX_DIGITS} characters"
    if _DECIMAL.fullmatch(text):
        return None
    return _character_problem(text, "0123456789", "+-") or "it has a leading zero"


def _float_problem(text: str) -> str | None:
    """What keeps ``text`` from being a number in the fractional form; None if it is."""
    if len(text) > MAX_FLOAT_CHARS:
        return f"it has more than {MAX_FLOAT_CHARS} characters"
    if not _FRACTIONAL.fullmatch(text):
        return _character_problem(text, "0123456789.eE+-", "+") or "it is not in that form"
    if float(text) != 0:
        return None
    if _NONZERO_DIGIT.search(re.split("[eE]", text)[0]):
        return "it is too small: a double reads it as 0"
    return NEGATIVE_ZERO if text.startswith("-") else None


def is_negative_zero(number: float) -> bool:
    """Whether ``number`` is -0.0: equal to 0, so every lower bound of 0 takes it, yet not
    the 0 kvscope writes (``NEGATIVE_ZERO`` says why it is refused)."""
    return number == 0 and math.copysign(1.0, number) < 0


def _character_problem(text: str, allowed: str, signs: str) -> str | None:
    """The first thing wrong with ``text``'s characters (a leading one of ``signs`` is wrong
    too), if any."""
    if not text:
        return "it is empty"
    if text[0] in signs:
        return "it has a sign" if signs == "+-" else "it has a plus sign"
    for char in text:
        if char.isspace():
            return "it has white space"
        if char == "_":
            return "it has an underscore"
        if char.isdigit() and not char.isascii():
            return "it has a digit that is not ASCII 0-9"
        if char not in allowed:
            return "it has a character that is not a digit"
    return None


def whole_number(text: str) -> int:
    """``text`` read as a whole number in the one form; a ValueError naming the form and what
    is wrong otherwise (for readers other than pydantic: the command line, vLLM's settings)."""
    return _read(text, _problem, _FORM, int)


def fractional_number(text: str) -> float:
    """``text`` read as a number in the fractional form; a ValueError as ``whole_number``'s."""
    return _read(text, _float_problem, _FLOAT_FORM, float)


def _read(
    text: str, problem_of: Callable[[str], str | None], form: str, convert: Callable[[str], T]
) -> T:
    problem = problem_of(text)
    if problem is not None:
        raise ValueError(f"{form}: {problem}")
    return convert(text)
