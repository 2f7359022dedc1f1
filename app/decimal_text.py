"""Numbers that arrive as text (a query string, a header, an environment variable): plain
ASCII decimal digits, written as the sidecar writes them, or refused naming why.

Python's ``int`` and pydantic's lax mode read far more than digits: ``1_0``,
``+3``, `` 3 ``, ``3.0`` and, in ``int``, Arabic-Indic or full-width digits.
Each is a second spelling of a number the sidecar writes one way (an event
id, a cursor), which a cache, a log search or a proxy's rule keyed on the
text then misses. So a number is at most ``MAX_DIGITS`` ASCII digits, with
no sign and no leading zero (``0`` itself excepted); anything else is an
error of type ``INT_PARSING`` whose message names the problem. The type is
pydantic's own for text that is no integer, so a client that knew it still
reads it.

Fractional numbers (a timestamp, a timeout) follow the same rule, with a
minus sign, a fraction and an exponent as Python and JavaScript print them
(``0.5``, ``-2``, ``1732850000.25``, ``1e-05``): no plus sign, space,
underscore, ``inf`` or ``nan``; such text is an error of type
``FLOAT_PARSING``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Final, TypeVar

from annotated_types import Ge, Le
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

MAX_DIGITS: Final = 20
"""Digits in the largest 64-bit unsigned number: every number the sidecar reads fits."""

POSITIVE_PATTERN: Final = rf"[1-9][0-9]{{0,{MAX_DIGITS - 1}}}"
"""A number above zero as the sidecar writes it."""

INT_PARSING: Final = "int_parsing"
"""The error type of text that is no whole number in this form."""

FLOAT_PARSING: Final = "float_parsing"
"""The error type of text that is no number in the fractional form."""

MAX_FLOAT_CHARS: Final = 64
"""Longest fractional number read: far past any double's shortest spelling (24)."""

T = TypeVar("T")

_DECIMAL: Final = re.compile(f"0|{POSITIVE_PATTERN}")
_FRACTIONAL: Final = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
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
    if _FRACTIONAL.fullmatch(text):
        return None
    return _character_problem(text, "0123456789.eE+-", "+") or "it is not in that form"


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
    is wrong otherwise (for readers other than pydantic: the command line)."""
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


def _text_rule(read: Callable[[str], object], error_type: str) -> BeforeValidator:
    """A pydantic rule that reads text with ``read``, as an error of ``error_type`` naming the
    problem; anything else (a number given by a caller) is left to pydantic."""

    def check(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return read(value)
        except ValueError as exc:
            raise PydanticCustomError(error_type, f"Input should be {exc}") from None

    return BeforeValidator(check)


_RULE: Final = _text_rule(whole_number, INT_PARSING)

MAX_DECIMAL: Final = 10**MAX_DIGITS - 1
"""The largest number the form can write."""

DecimalInt = Annotated[int, _RULE]
"""An int that text reaches only in the one form, for a model's field: pydantic applies its
``Field(ge=..., le=...)`` ahead of the rule."""

DecimalFloat = Annotated[float, _text_rule(fractional_number, FLOAT_PARSING)]
"""A float that text reaches only in the fractional form, for a model's field or a FastAPI
parameter (bounds as for ``DecimalInt``)."""


def decimal_int(low: int, high: int) -> Any:
    """The type of an int from ``low`` to ``high`` that text reaches only in the one form, for
    a FastAPI parameter.

    Give it no other bounds: a ``Query(ge=...)`` comes after the rule, where
    pydantic checks it but states it in the schema as ``ge`` (which no
    OpenAPI client reads) rather than ``minimum``; a ``Field(ge=...)`` comes
    ahead of these bounds, which replace it."""
    return Annotated[int, Ge(low), Le(high), _RULE]
