"""A page of /api/v1/events while the ingest thread records: one moment of the log.

A page's ``first_id`` (the oldest id held) and ``last_id`` (the newest) tell a
reader what it lost and how far the log reaches; read apart from the page's
events, a record in between made a page that contradicts itself: a
``first_id`` past its own first event (a loss reported for events it holds) or
a ``last_id`` short of its own last event. fastapi's TestClient drives the real
app over a real state (tests/support/http_app.py); a second thread records as
ingest does.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.http_app import in_process, record, sidecar_app
from tests.support.interleaving import readings_while

pytestmark = pytest.mark.timeout(120)


def test_a_page_read_while_events_are_recorded_never_contradicts_itself() -> None:
    app, state = sidecar_app(event_buffer=50)
    record(state, events=50)
    with in_process(app) as http:

        def page() -> dict[str, Any]:
            response = http.get("/api/v1/events")  # since 0: everything held, one page
            assert response.status_code == 200, response.text
            return response.json()

        pages = readings_while(lambda: record(state, events=5), page, 300)
    contradictions = [
        (body["first_id"], ids[0], ids[-1], body["last_id"])
        for body in pages
        if (ids := [event["id"] for event in body["events"]])
        and not body["first_id"] == ids[0] <= ids[-1] == body["last_id"]
    ]
    assert contradictions == []
