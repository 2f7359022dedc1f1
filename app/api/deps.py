"""What routes depend on: the sidecar's state, its settings, its metrics, and the bearer token.

``create_app`` stores the state, settings and registry on ``app.state``; routes
ask for them through these dependencies rather than closing over them.
"""

from __future__ import annotations

from hmac import compare_digest
from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry

from app.settings import MAX_PAGE_LIMIT, SidecarSettings
from app.state.sidecar import SidecarState

DEFAULT_PAGE = 100
"""Page size when a request names none (capped by settings.page_limit)."""


def get_state(request: Request) -> SidecarState:
    return request.app.state.sidecar


def get_settings(request: Request) -> SidecarSettings:
    return request.app.state.settings


def get_registry(request: Request) -> CollectorRegistry:
    return request.app.state.metrics


State = Annotated[SidecarState, Depends(get_state)]
Settings = Annotated[SidecarSettings, Depends(get_settings)]
Registry = Annotated[CollectorRegistry, Depends(get_registry)]


def page_size(
    settings: Settings,
    limit: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_PAGE_LIMIT,
            description=f"Page size (default {DEFAULT_PAGE}), at most the sidecar's page_limit.",
        ),
    ] = None,
) -> int:
    """The ``limit`` parameter, capped by settings (a 422 names the cap when exceeded)."""
    if limit is None:
        return min(DEFAULT_PAGE, settings.page_limit)
    if limit > settings.page_limit:
        raise RequestValidationError(
            [
                {
                    "type": "less_than_equal",
                    "loc": ("query", "limit"),
                    "msg": f"Input should be less than or equal to {settings.page_limit}",
                    "input": limit,
                    "ctx": {"le": settings.page_limit},
                }
            ]
        )
    return limit


PageSize = Annotated[int, Depends(page_size)]


def require_token(request: Request, settings: Settings) -> None:
    """With a token configured, the request must carry ``Authorization: Bearer <token>``."""
    _check(settings, _authorization(request))


def require_token_or_query(request: Request, settings: Settings) -> None:
    """As ``require_token``, or ``?token=``: a browser's EventSource cannot send headers."""
    given = _authorization(request)
    if given is None:
        tokens = [token for token in request.query_params.getlist("token") if token]
        if tokens:
            given = b"Bearer " + tokens[0].encode()
    _check(settings, given)


def _authorization(request: Request) -> bytes | None:
    given = request.headers.get("authorization")
    return None if given is None else given.encode("latin-1")  # the header's bytes, as sent


def _check(settings: SidecarSettings, given: bytes | None) -> None:
    if settings.token is None:
        return
    if given is None:
        challenge, detail = 'Bearer realm="kvscope"', "missing bearer token"
    else:
        scheme, _, credentials = given.partition(b" ")
        expected = settings.token.get_secret_value().encode()
        if scheme.lower() == b"bearer" and compare_digest(credentials.strip(), expected):
            return
        challenge, detail = 'Bearer realm="kvscope", error="invalid_token"', "invalid token"
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": challenge}
    )
