"""A query parameter or header that a route reads, given more than once, is a 400 naming it.

HTTP leaves which of two values counts open, and the sidecar's parts disagreed:
FastAPI read a query parameter's last value but a header's first, so
``?medium=CPU&medium=GPU`` was answered for GPU alone, and a proxy or cache in
front that read the first would have judged a different request than the one
answered. This is why the sidecar refuses a JSON key given twice
(app/api/body_errors.py) and a second Host header (app/api/guards/allowed_hosts.py).

Only names the route reads are refused (others it never looks at, and ``?token=``
is read by its own rule, app/api/deps.py). The credentials are refused alike, by the
token check itself before it compares them (``refuse_repeated_credentials``): the first
``Authorization`` field counted, where a proxy in front may have judged the request by
the other. Their values are never echoed. The answer is the validation errors'
shape (app/api/validation_errors.py), one error per name with its values, cut.
Looking up what a route reads walks its dependencies, so it is done only for a
request that repeats some name: the others pay one pass over their query and headers.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from fastapi import Request, params
from fastapi.dependencies.utils import get_flat_params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from app.api.session import COOKIE

REPEATED_PARAMETER: Final = "repeated_parameter"
"""The error type of a parameter given more than once."""


def _repeated(names: list[str]) -> set[str]:
    return {name for name, count in Counter(names).items() if count > 1}


def _read_names(route: APIRoute) -> tuple[list[str], list[str]]:
    """The query parameters and the headers (lower-case) that ``route`` reads, in order."""
    fields = get_flat_params(route.dependant)
    query = [f.alias for f in fields if isinstance(f.field_info, params.Query)]
    headers = [f.alias.lower() for f in fields if isinstance(f.field_info, params.Header)]
    return query, headers


async def refuse_repeated_parameters(request: Request) -> None:
    """A router's dependency, after its token check (an anonymous request learns nothing of
    what a route reads): a 400 when a query parameter or header its route reads is given
    more than once."""
    query = _repeated([name for name, _ in request.query_params.multi_items()])
    headers = _repeated([name.decode("latin-1") for name, _ in request.headers.raw])
    route = request.scope.get("route")
    if not (query or headers) or not isinstance(route, APIRoute):
        return
    read_query, read_headers = _read_names(route)
    errors = [
        _error("query", name, request.query_params.getlist(name))
        for name in read_query
        if name in query
    ] + [
        _error("header", name, request.headers.getlist(name))
        for name in read_headers
        if name in headers
    ]
    if errors:
        raise RequestValidationError(errors)


def refuse_repeated_credentials(request: Request) -> None:
    """A 400 when the request gives ``Authorization`` or the session cookie more than once
    (over every ``Cookie`` field, split as Starlette splits one), each value shown as
    ``REDACTED``."""
    authorizations = sum(name.lower() == b"authorization" for name, _ in request.headers.raw)
    cookies = sum(
        "=" in chunk and chunk.split("=", 1)[0].strip() == COOKIE
        for field in request.headers.getlist("cookie")
        for chunk in field.split(";")
    )
    errors = [
        _error(where, name, ["REDACTED"] * count)
        for where, name, count in (
            ("header", "authorization", authorizations),
            ("cookie", COOKIE, cookies),
        )
        if count > 1
    ]
    if errors:
        raise RequestValidationError(errors)


def _error(where: str, name: str, values: list[str]) -> dict[str, object]:
    return {
        "type": REPEATED_PARAMETER,
        "loc": (where, name),
        "msg": f"Input should be given once, not {len(values)} times: which value counts "
        "is not agreed, so send one",
        "input": values,
    }
