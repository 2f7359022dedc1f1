"""The block-event feed: pages of recent events, and the same live as Server-Sent Events.

The stream has a router of its own because it alone also takes ``?token=``:
a browser's EventSource cannot send headers. Both render events off the
event loop and within a byte budget (app/api/event_render.py,
app/api/event_stream.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status

from app.api.declared_body import declares_body
from app.api.deps import (
    UNAUTHORIZED,
    Limits,
    PageSize,
    State,
    Streams,
    require_token,
    require_token_or_query,
)
from app.api.event_render import page_json, render
from app.api.event_stream import EventStreamResponse
from app.api.repeated_parameters import refuse_repeated_parameters
from app.api.schemas import EventPage
from app.api.validation_errors import MALFORMED_TEXT
from app.decimal_text import decimal_int

router = APIRouter(
    tags=["api"],
    dependencies=[Depends(require_token), Depends(refuse_repeated_parameters)],
    responses=UNAUTHORIZED,
)
stream_router = APIRouter(
    tags=["api"],
    dependencies=[Depends(require_token_or_query), Depends(refuse_repeated_parameters)],
    responses=UNAUTHORIZED,
)

MAX_EVENT_ID: Final = 2**63 - 1
"""The largest id a request may name (ids count events from 1 in one process)."""

EventId = decimal_int(0, MAX_EVENT_ID)
"""``since`` and ``Last-Event-ID``: one type, so the two read an id alike."""

_STREAM_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    **MALFORMED_TEXT,
    200: {
        "description": "Server-Sent Events: `id:` the event id, `data:` an `Event` as JSON.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    413: {"description": "The request declares a body: a stream takes none."},
    503: {"description": "As many streams are open as the sidecar serves; retry later."},
}


@router.get("/events", response_model=EventPage, responses=MALFORMED_TEXT)
def events(
    state: State,
    limits: Limits,
    *,
    since: Annotated[EventId, Query()] = 0,
    limit: PageSize,
) -> Response:
    """Recent block events after id ``since``, oldest first (page on with the last id).

    A page stops short of ``limit`` rather than pass about a megabyte.
    """
    page = state.event_log.page(since, limit)
    rendered = render(page.events, limits.events_response_bytes)
    body = page_json(rendered, page.first_id, page.last_id)
    return Response(body, media_type="application/json")


@stream_router.get(
    "/events/stream",
    status_code=200,
    response_class=EventStreamResponse,
    responses=_STREAM_RESPONSES,
)
async def event_stream(
    request: Request,
    streams: Streams,
    last_event_id: Annotated[EventId | None, Header()] = None,
) -> EventStreamResponse:
    """Live block events as Server-Sent Events (`id:` is the event id).

    With `Last-Event-ID`, the held events after it come first. An id above
    the newest one comes from an earlier sidecar process, so everything held
    is sent. A keep-alive comment goes out after 15 s without events. A
    reader that falls a megabyte behind is dropped, and resumes with
    `Last-Event-ID` (its EventSource does so by itself).
    """
    if declares_body(request.headers.raw):
        # Refused before the stream starts: the stream reads its request only to see the
        # client go, so a body past the limit was refused there, mid-stream, as a traceback.
        streams.counts.refuse("body_too_large")
        raise HTTPException(
            status.HTTP_413_CONTENT_TOO_LARGE,
            "an event stream takes no request body",
            {"Connection": "close"},
        )
    return EventStreamResponse(streams, streams.join(last_event_id))
