"""The block-event feed: pages of recent events, and the same live as Server-Sent Events.

The stream has a router of its own because it alone also takes ``?token=``:
a browser's EventSource cannot send headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.sse import EventSourceResponse, ServerSentEvent

from app.api.deps import PageSize, Settings, State, require_token, require_token_or_query
from app.api.schemas import Event, EventPage

router = APIRouter(tags=["api"], dependencies=[Depends(require_token)])
stream_router = APIRouter(tags=["api"], dependencies=[Depends(require_token_or_query)])


@router.get("/events")
def events(state: State, *, since: Annotated[int, Query(ge=0)] = 0, limit: PageSize) -> EventPage:
    """Recent block events after id ``since``, oldest first (page on with the last id)."""
    log = state.event_log
    found = log.since(since, limit)
    return EventPage(
        events=[Event.of(logged) for logged in found],
        first_id=log.first_id(),
        last_id=log.last_id,
    )


@stream_router.get("/events/stream", response_class=EventSourceResponse)
async def event_stream(
    state: State,
    settings: Settings,
    last_event_id: Annotated[int | None, Header(ge=0)] = None,
) -> AsyncIterator[ServerSentEvent]:
    """Live block events as Server-Sent Events (`id:` is the event id).

    With `Last-Event-ID`, the held events after it come first. An id above
    the newest one comes from an earlier sidecar process, so everything held
    is sent. A keep-alive comment goes out after 15 s without events.
    """
    log = state.event_log
    cursor = log.last_id if last_event_id is None else last_event_id
    if cursor > log.last_id:
        cursor = 0
    while True:
        found = log.since(cursor, settings.page_limit)
        if not found:
            await log.wait_after(cursor)
            continue
        for logged in found:
            yield ServerSentEvent(data=Event.of(logged), id=str(logged.id))
        cursor = found[-1].id
