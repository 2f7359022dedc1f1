"""422 bodies that always render, and never echo more than a little of what was sent.

FastAPI's own 422 echoes each error's ``input``. A JSON body may carry
``NaN``, ``Infinity`` or ``1e400`` (Python's json module reads them), which
strict JSON cannot write back: the 422 became a 500 with a traceback. And an
input may be a whole list of thousands of hashes. So an input that is not
plain finite JSON, or whose JSON is over ``MAX_ECHO_CHARS``, is echoed as a
short string instead. JSON's ``\\ud800`` escapes decode to lone surrogates,
which UTF-8 cannot write either: in an input, or in a location (a body's
own keys), they are echoed escaped.

Text in the URL or a header that is no number or block hash in the one form
the sidecar writes (``TEXT_FORM_ERRORS``) is a 400 in the same shape: the
request is malformed, as a body that is no JSON is (app/api/body_errors.py),
while a value read well that breaks a bound (a ``limit`` over the page
limit) stays a 422, as a body's fields are. So is a parameter given twice
(app/api/repeated_parameters.py).
"""

from __future__ import annotations

import json
from typing import Any, Final

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.api.hash_text import BLOCK_HASH_PARSING
from app.api.repeated_parameters import REPEATED_PARAMETER
from app.decimal_text import FLOAT_PARSING, INT_PARSING

MAX_ECHO_CHARS: Final = 200

TEXT_FORM_ERRORS: Final = frozenset(
    (INT_PARSING, FLOAT_PARSING, BLOCK_HASH_PARSING, REPEATED_PARAMETER)
)
"""Error types of text that is not in its form, or given twice: a 400 when the text came in
the URL or a header."""

MALFORMED_TEXT: Final[dict[int | str, dict[str, str]]] = {
    400: {
        "description": "A number or block hash in the URL or a header is not in its form, "
        "or a parameter is given more than once."
    }
}
"""The answer every route with such a parameter documents."""


def echoable(value: Any) -> Any:
    """``value`` if it writes as strict UTF-8 JSON within ``MAX_ECHO_CHARS``, else a short
    text of it."""
    plain = jsonable_encoder(value)
    if isinstance(plain, str):
        return _cut(plain.encode("utf-8", "backslashreplace").decode())
    try:
        json.dumps(plain, allow_nan=False, ensure_ascii=False).encode()
    except ValueError:  # NaN, an infinity or a lone surrogate (UnicodeEncodeError) inside
        pass
    else:
        if len(json.dumps(plain)) <= MAX_ECHO_CHARS:
            return plain
    return _cut(json.dumps(plain))  # ASCII: surrogates escaped


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "..."


async def validation_error(_request: Request, error: Exception) -> JSONResponse:
    """FastAPI's 422 body (``{"detail": [...]}``), each error's ``input`` made echoable; a
    400 where the URL or a header holds text not in its form."""
    assert isinstance(error, RequestValidationError)
    details = []
    code = status.HTTP_422_UNPROCESSABLE_CONTENT
    for detail in error.errors():
        if detail["type"] in TEXT_FORM_ERRORS and detail["loc"][:1] != ("body",):
            code = status.HTTP_400_BAD_REQUEST
        shown = {key: value for key, value in detail.items() if key not in ("input", "ctx", "loc")}
        shown["loc"] = [echoable(part) for part in detail["loc"]]
        if "input" in detail:
            shown["input"] = echoable(detail["input"])
        if "ctx" in detail:
            shown["ctx"] = {key: echoable(value) for key, value in detail["ctx"].items()}
        details.append(shown)
    return JSONResponse({"detail": jsonable_encoder(details)}, code)


def install_validation_errors(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
