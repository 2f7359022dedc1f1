"""How the sidecar reads a JSON request body: in one pass that refuses a key given twice and
converts no integer of more digits than a block hash has.

Python's reader converts every JSON integer, of up to 4,300 digits, though a
lookup's hash has at most ``MAX_DIGITS`` (the same number as text is refused
past them): a body of such numbers took many times a normal body's time to read,
and it was read twice, by FastAPI and again by the repeated-key check. Here a
longer integer stays its text (``LongInteger``), never converted, and the
field that gets one refuses it in a 422 whose ``loc`` names it
(app/api/hash_text.py). A key given twice in one object is found in the same
pass (app/api/body_errors.py says why it is refused), so a body is read once.

``JsonBodyRoute`` is FastAPI's documented way to give a route its own reading
of the body: its handlers get a ``JsonBodyRequest``, whose ``json()`` is this.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, Final

from fastapi import Request, Response
from fastapi.routing import APIRoute

from offload.decimal_text import MAX_DIGITS

_DIGITS_AS_NINES: Final = bytes.maketrans(b"0123456789", b"9" * 10)
_LONG_RUN: Final = b"9" * (MAX_DIGITS + 1)


class LongInteger(str):
    """A JSON integer of more than ``MAX_DIGITS`` digits, kept as its text."""


class RepeatedKey(Exception):
    """Raised at an object's second use of ``key``; not a ValueError, which the reader's own
    errors are."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key it gives twice."""
    record = dict(pairs)
    if len(record) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return record


def _integer(text: str) -> int | LongInteger:
    """A JSON integer: an int when it has at most ``MAX_DIGITS`` digits, else its text."""
    if len(text) - text.startswith("-") <= MAX_DIGITS:
        return int(text)
    return LongInteger(text)


def read_json(body: bytes) -> Any:
    """The body's JSON; raises RepeatedKey for a key given twice in one object, and what
    ``json.loads`` raises for a body that is no JSON.

    A Python call per integer would cost a full lookup body more than its reading, so
    ``_integer`` is called only when the body has a longer run of digits than
    ``MAX_DIGITS`` at all (a scan in C): ``json.loads`` reads UTF-16 and UTF-32 too, which
    the scan sees as UTF-8."""
    encoding = json.detect_encoding(body)
    utf8 = body
    if not encoding.startswith("utf-8"):
        utf8 = body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    long_run = _LONG_RUN in utf8.translate(_DIGITS_AS_NINES)
    return json.loads(body, object_pairs_hook=_object, parse_int=_integer if long_run else None)


class JsonBodyRequest(Request):
    """A request whose JSON body ``read_json`` reads."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = read_json(await self.body())
        return self._json


class JsonBodyRoute(APIRoute):
    """A route whose handler reads a JSON body with ``read_json``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def read_with_json_body(request: Request) -> Response:
            return await handler(JsonBodyRequest(request.scope, request.receive))

        return read_with_json_body
