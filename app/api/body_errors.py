"""400s (and a 415) that say what was wrong with a body that could not be read as JSON.

FastAPI answers every failure to read a JSON body, other than a syntax
error, with one text ("There was an error parsing the body") and chains the
cause, which says what the client got wrong: bytes that are not UTF-8 (a
compressed body, too: the sidecar decodes no content encoding), JSON nested
past the interpreter's recursion limit, or a key given twice in one object
(app/api/json_body.py finds it while reading). This handler names it;
nothing of the body is echoed.

A body labelled with a content encoding is refused whether or not its bytes happen to
read as JSON (``plain_body``): they are then not what the client meant to send, or the
label is wrong, and reading them either way would be a guess. So is a body whose JSON
gives one key twice in an object: JSON leaves which one counts open (Python's reader
keeps the last, others the first), so a proxy that checked one and the sidecar that
answered the other would disagree on what was asked.

A body not labelled as JSON (no ``Content-Type``, ``text/plain``, or the
``application/x-www-form-urlencoded`` that ``curl -d`` sends) is a 415 saying so:
FastAPI passed its bytes to the model unread, and the 422 said "Input should be a
valid dictionary or object" of a body that was one.
"""

from __future__ import annotations

import email.message
from typing import Final

from fastapi import FastAPI, Request, Response, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.api.json_body import RepeatedKey
from offload.shown import shown_repr

UNREAD: Final = "There was an error parsing the body"
"""FastAPI's detail for a body it could not read (fastapi/routing.py)."""

ENCODED: Final = "the body has a content encoding; send it uncompressed, as plain JSON"

NOT_JSON: Final = (
    "the body is not labelled as JSON (its Content-Type is missing or another type); "
    "send it with Content-Type: application/json"
)


def _labelled_json(request: Request) -> bool:
    """Whether the ``Content-Type`` is one FastAPI reads a body as JSON by (fastapi/routing.py):
    ``application/json`` or ``application/*+json``."""
    value = request.headers.get("content-type")
    if not value:
        return False
    message = email.message.Message()
    message["content-type"] = value
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _encoded(request: Request) -> bool:
    """Whether a ``Content-Encoding`` field says other than ``identity``: each field is read
    (the first alone was, so ``identity`` ahead of ``gzip`` passed a body labelled compressed
    as plain)."""
    fields = request.headers.getlist("content-encoding")
    return any(value.strip().lower() != "identity" for value in fields)


async def plain_body(request: Request) -> None:
    """A route's dependency: a 415 for a body not labelled as JSON (an empty one is left to
    the model, which names the body missing); a 400 for a body with a content encoding that
    read as JSON (one that did not is ``why_unread``'s)."""
    body = await request.body()
    if body and not _labelled_json(request):
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, NOT_JSON)
    if _encoded(request):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, ENCODED)


def why_unread(request: Request, cause: BaseException | None) -> str:
    """The problem with a JSON body that could not be read, in words."""
    if _encoded(request):
        return ENCODED
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 (byte {cause.start} is not)"
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply"
    if isinstance(cause, RepeatedKey):
        return (
            f"the body's JSON gives the key {shown_repr(cause.key)} twice in one object; JSON "
            "leaves which one counts open, so send it once"
        )
    return UNREAD


async def unread_body(request: Request, error: Exception) -> Response:
    """A 400 naming the problem for a body FastAPI could not read; other HTTP errors as
    FastAPI answers them."""
    assert isinstance(error, HTTPException)
    if error.status_code == status.HTTP_400_BAD_REQUEST and error.detail == UNREAD:
        detail = why_unread(request, error.__cause__)
        return JSONResponse({"detail": detail}, status.HTTP_400_BAD_REQUEST)
    return await http_exception_handler(request, error)


def install_body_errors(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, unread_body)
