"""pydantic's rules for numbers that arrive as text (a query string, a header, an environment
variable), by the one rule of ``offload/decimal_text.py``: text outside it is an error of
pydantic's own type for text that is no number (``INT_PARSING``, ``FLOAT_PARSING``), so a
client that knew that type still reads it, with a message naming the problem.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Final

from annotated_types import Ge, Le
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from offload.decimal_text import MAX_DIGITS, fractional_number, whole_number

INT_PARSING: Final = "int_parsing"
"""The error type of text that is no whole number in this form."""

FLOAT_PARSING: Final = "float_parsing"
"""The error type of text that is no number in the fractional form."""


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
