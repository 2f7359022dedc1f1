"""Whole numbers that arrive as text (a query string, a header, an environment variable):
plain ASCII decimal digits, written as the sidecar writes them, or refused naming why.

Python's ``int`` and pydantic's lax mode read far more than digits: ``1_0``,
``+3``, `` 3 ``, ``3.0`` and, in ``int``, Arabic-Indic or full-width digits.
Each is a second spelling of a number the sidecar writes one way (an event
id, a cursor), which a cache, a log search or a proxy's rule keyed on the
text then misses. So a number is at most ``MAX_DIGITS`` ASCII digits, with
no sign and no leading zero (``0`` itself excepted); anything else is an
error of type ``INT_PARSING`` whose message names the problem. The type is
pydantic's own for text that is no integer, so a client that knew it still
reads it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from annotated_types import Ge, Le
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

MAX_DIGITS: Final = 20
"""Digits in the largest 64-bit unsigned number: every number the sidecar reads fits."""

POSITIVE_PATTERN: Final = rf"[1-9][0-9]{{0,{MAX_DIGITS - 1}}}"
"""A number above zero as the sidecar writes it."""

INT_PARSING: Final = "int_parsing"
"""The error type of text that is no whole number in this form."""

_DECIMAL: Final = re.compile(f"0|{POSITIVE_PATTERN}")
_FORM: Final = (
    f"plain decimal digits 0-9 (at most {MAX_DIGITS}; no sign, space, underscore or leading zero)"
)


def _problem(text: str) -> str | None:
    """What keeps ``text`` from being a whole number in the one form, in words; None if it is."""
    if len(text) > MAX_DIGITS:
        return f"it has more than {MAX_DIGITS} characters"
    if _DECIMAL.fullmatch(text):
        return None
    if not text:
        return "it is empty"
    if text[0] in "+-":
        return "it has a sign"
    for char in text:
        if char.isspace():
            return "it has white space"
        if char == "_":
            return "it has an underscore"
        if char.isdigit() and not char.isascii():
            return "it has a digit that is not ASCII 0-9"
        if not char.isdigit():
            return "it has a character that is not a digit"
    return "it has a leading zero"


def _strict(value: Any) -> Any:
    """Text read by the one rule; anything else (an int given by a caller) left to pydantic."""
    if not isinstance(value, str):
        return value
    problem = _problem(value)
    if problem is not None:
        raise PydanticCustomError(INT_PARSING, f"Input should be {_FORM}: {problem}")
    return int(value)


_RULE: Final = BeforeValidator(_strict)

MAX_DECIMAL: Final = 10**MAX_DIGITS - 1
"""The largest number the form can write."""

DecimalInt = Annotated[int, _RULE]
"""An int that text reaches only in the one form, for a model's field: pydantic applies its
``Field(ge=..., le=...)`` ahead of the rule."""


def decimal_int(low: int, high: int) -> Any:
    """The type of an int from ``low`` to ``high`` that text reaches only in the one form, for
    a FastAPI parameter.

    Give it no other bounds: a ``Query(ge=...)`` comes after the rule, where
    pydantic checks it but states it in the schema as ``ge`` (which no
    OpenAPI client reads) rather than ``minimum``; a ``Field(ge=...)`` comes
    ahead of these bounds, which replace it."""
    return Annotated[int, Ge(low), Le(high), _RULE]
