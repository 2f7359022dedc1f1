"""What routes depend on: the sidecar's state, its settings, its metrics, and the bearer token.

``create_app`` stores the state, settings and exposition on ``app.state``; routes
ask for them through these dependencies rather than closing over them. They
are coroutines: each only reads an attribute or compares a token, so it runs
on the event loop, where a plain function would take a trip through the
thread pool per request (and, while the ingest thread is busy, a wait for
the interpreter at each end of it).
"""

from __future__ import annotations

from hmac import compare_digest
from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request, Security, status
from fastapi.exceptions import RequestValidationError
from fastapi.security import APIKeyCookie, APIKeyQuery, HTTPBearer

from app.api.event_stream import EventStreams
from app.api.limits import HttpLimits
from app.api.metrics import Exposition
from app.api.repeated_parameters import refuse_repeated_credentials
from app.api.session import COOKIE, session_value
from app.decimal_text import decimal_int
from app.settings import MAX_PAGE_LIMIT, SidecarSettings
from app.state.sidecar import SidecarState

DEFAULT_PAGE = 100
"""Page size when a request names none (capped by settings.page_limit)."""

_PageLimit = decimal_int(1, MAX_PAGE_LIMIT)


async def get_state(request: Request) -> SidecarState:
    return request.app.state.sidecar


async def get_settings(request: Request) -> SidecarSettings:
    return request.app.state.settings


async def get_exposition(request: Request) -> Exposition:
    return request.app.state.metrics


async def get_streams(request: Request) -> EventStreams:
    return request.app.state.streams


async def get_limits(request: Request) -> HttpLimits:
    return request.app.state.limits


State = Annotated[SidecarState, Depends(get_state)]
Settings = Annotated[SidecarSettings, Depends(get_settings)]
Metrics = Annotated[Exposition, Depends(get_exposition)]
Streams = Annotated[EventStreams, Depends(get_streams)]
Limits = Annotated[HttpLimits, Depends(get_limits)]

UNAUTHORIZED: dict[int | str, dict[str, str]] = {
    401: {"description": "A token is set and the request does not carry it."}
}
"""The answer every guarded router documents."""


def page_size(
    settings: Settings,
    limit: Annotated[
        _PageLimit | None,
        Query(
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

# Declared for the OpenAPI schema (its security schemes); the checks below read the
# request themselves, comparing bytes in constant time.
_BEARER = HTTPBearer(auto_error=False, description="`Authorization: Bearer <token>`.")
_SESSION = APIKeyCookie(
    name=COOKIE,
    auto_error=False,
    description="Set by `GET /?token=<token>`, for the page in a browser.",
)
_QUERY = APIKeyQuery(
    name="token",
    auto_error=False,
    description="The event stream only: a browser's EventSource cannot send headers.",
)


async def require_token(
    request: Request,
    settings: Settings,
    _bearer: Annotated[object, Security(_BEARER)] = None,
    _session: Annotated[object, Security(_SESSION)] = None,
) -> None:
    """With a token configured: ``Authorization: Bearer <token>`` or the page's session cookie."""
    check_token(request, settings)


async def require_token_or_query(
    request: Request,
    settings: Settings,
    _bearer: Annotated[object, Security(_BEARER)] = None,
    _session: Annotated[object, Security(_SESSION)] = None,
    _query: Annotated[object, Security(_QUERY)] = None,
) -> None:
    """As ``require_token``, or ``?token=``: a browser's EventSource cannot send headers."""
    check_token(request, settings, query=True)


def is_authorized(request: Request, settings: SidecarSettings) -> bool:
    """Whether the request may read what the token guards (always, without a token)."""
    try:
        check_token(request, settings)
    except (HTTPException, RequestValidationError):  # a 401, or a credential given twice
        return False
    return True


def check_token(request: Request, settings: SidecarSettings, *, query: bool = False) -> None:
    """Refuse (401) unless the first credential the request carries is the token.

    In order: the Authorization header (its bytes as sent), the session
    cookie, and, with ``query``, ``?token=``. A wrong one is refused even
    when a later one would be right. The header or the cookie given twice is a 400
    (``repeated_parameter``) before anything is compared: which one counts is not agreed.
    """
    if settings.token is None:
        return
    refuse_repeated_credentials(request)
    token = settings.token.get_secret_value()
    header = request.headers.get("authorization")
    cookie = request.cookies.get(COOKIE)
    given = query_token(request) if query else None
    if header is not None:
        scheme, _, credentials = header.encode("latin-1").partition(b" ")
        _verify(scheme.lower() == b"bearer", credentials.strip(), token.encode())
    elif cookie is not None:
        _verify(True, cookie.encode(), session_value(token).encode())
    elif given is not None:
        _verify(True, given.encode(), token.encode())
    else:
        _refuse('Bearer realm="kvscope"', "missing bearer token")


async def login_token(request: Request, settings: Settings) -> str | None:
    """The token of a ``/?token=`` login, checked before any cookie (a stale one is replaced);
    None, after the usual check, when the request is no login."""
    given = query_token(request)
    if given is None or settings.token is None:
        check_token(request, settings)
        return None
    _verify(True, given.encode(), settings.token.get_secret_value().encode())
    return given


def query_token(request: Request) -> str | None:
    """The first non-empty ``?token=``, or None."""
    return next((token for token in request.query_params.getlist("token") if token), None)


def _verify(scheme_ok: bool, given: bytes, expected: bytes) -> None:
    if not (compare_digest(given, expected) and scheme_ok):
        _refuse('Bearer realm="kvscope", error="invalid_token"', "invalid token")


def _refuse(challenge: str, detail: str) -> None:
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": challenge}
    )
