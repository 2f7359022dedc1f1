"""The block index: paged listing, one block, and how much of a prompt's chain is cached."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status

from app.api.body_errors import plain_body
from app.api.deps import UNAUTHORIZED, PageSize, State, check_token, require_token
from app.api.hash_text import BlockHashText
from app.api.json_body import JsonBodyRoute
from app.api.repeated_parameters import refuse_repeated_parameters
from app.api.schemas import BlockInfo, BlockPage, LookupRequest, LookupResponse
from app.api.validation_errors import MALFORMED_TEXT
from app.decimal_text import MAX_DECIMAL, decimal_int


class _TokenFirstRoute(JsonBodyRoute):
    """A route that checks the token before it reads a request body, then as every route does.

    FastAPI reads and parses a body before any dependency runs, the token's included, so
    a lookup without the token had its body parsed and was told what was wrong with it (a
    422 for no JSON, a 400 naming a key given twice) instead of a 401."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def token_first(request: Request) -> Response:
            check_token(request, request.app.state.settings)
            return await handler(request)

        return token_first


router = APIRouter(
    tags=["api"],
    dependencies=[Depends(require_token), Depends(refuse_repeated_parameters)],
    responses=UNAUTHORIZED,
    route_class=_TokenFirstRoute,  # the lookup's body
)

_Cursor = decimal_int(0, MAX_DECIMAL)


@router.get("/blocks", responses=MALFORMED_TEXT)
def blocks(
    state: State,
    *,
    medium: str | None = None,
    publisher: str | None = None,
    cursor: Annotated[
        _Cursor | None, Query(description="`next_cursor` of the previous page.")
    ] = None,
    limit: PageSize,
) -> BlockPage:
    """Indexed blocks in order of first store; the cursor survives blocks coming and going.

    A page examines at most 16,000 entries of the index's listing (blocks since removed
    included), so under a filter few blocks match it may hold fewer than `limit` blocks,
    even none, and still have a `next_cursor`: follow it until it is null."""
    with state.lock:
        entries, next_cursor = state.index.page(medium, publisher, cursor, limit)
    return BlockPage(blocks=[BlockInfo.of(entry) for entry in entries], next_cursor=next_cursor)


@router.get(
    "/blocks/{block_hash}", responses={**MALFORMED_TEXT, 404: {"description": "Not indexed."}}
)
async def block(state: State, block_hash: Annotated[BlockHashText, Path()]) -> BlockInfo:
    """One block: where it is held, since when, how often reloaded.

    A coroutine (one dictionary read), as the dependencies are (app/api/deps.py); the
    listing above stays a function for the thread pool, since a page can scan
    ``PAGE_SCAN`` entries of the index."""
    with state.lock:
        entry = state.index.get(block_hash)
    if entry is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "block not indexed")
    return BlockInfo.of(entry)


@router.post(
    "/lookup",
    dependencies=[Depends(plain_body)],
    responses={
        400: {
            "description": "The body is not UTF-8 text, has a content encoding, or gives a "
            "key twice in one object."
        },
        413: {"description": "The body is over the sidecar's limit."},
        415: {"description": "The body is not labelled `Content-Type: application/json`."},
    },
)
async def lookup(state: State, request: LookupRequest) -> LookupResponse:
    """How much of a prompt's block chain is cached, per medium, and where it breaks.

    A coroutine: the walk is bounded (at most `MAX_LOOKUP_HASHES` hashes)."""
    with state.lock:
        match = state.index.lookup_prefix(request.block_hashes)
    return LookupResponse(runs=match.runs, break_index=match.break_index)
