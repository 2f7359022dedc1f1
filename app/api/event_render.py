"""Logged events as JSON bytes, a byte budget at a time: what /events and the stream send.

Rendering is the costly part of serving events (a model and a hex string per
hash), so it is done once per event and never on the event loop: /events
runs in the threadpool, the stream renders in ``RenderPool``'s threads. Each
call stops at its byte budget (after one event at least, so a reader always
moves on), and one event is bounded by ``MAX_EVENT_HASHES``: no request, and
no resuming stream, makes the server render or hold more than a budget at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from app.api.schemas import Event
from app.state.event_log import LoggedEvent


class Rendered(NamedTuple):
    """Events rendered in id order: their ids and their JSON, one item each."""

    ids: list[int]
    texts: list[bytes]

    @property
    def size(self) -> int:
        return sum(map(len, self.texts))


def render(events: Iterable[LoggedEvent], budget: int) -> Rendered:
    """The leading events whose JSON fits ``budget`` bytes (the first whatever its size)."""
    out = Rendered([], [])
    size = 0
    for logged in events:
        text = Event.of(logged).model_dump_json().encode()
        if out.ids and size + len(text) > budget:
            break
        out.ids.append(logged.id)
        out.texts.append(text)
        size += len(text)
    return out


def page_json(events: Rendered, first_id: int, last_id: int) -> bytes:
    """An ``EventPage`` as JSON, from events already rendered (a model would render them again)."""
    return b'{"events":[%b],"first_id":%d,"last_id":%d}' % (
        b",".join(events.texts),
        first_id,
        last_id,
    )


def sse_frames(events: Rendered) -> bytes:
    """The events as Server-Sent Events (``id:`` the event id; the JSON has no line breaks)."""
    return b"".join(
        b"id: %d\ndata: %b\n\n" % (event_id, text)
        for event_id, text in zip(events.ids, events.texts, strict=True)
    )
