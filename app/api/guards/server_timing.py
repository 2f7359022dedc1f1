"""``Server-Timing`` on every response: how long the sidecar took, as the browser can read it.

A browser's own timing of a request includes its queueing, its network stack
and whatever else shares the machine; this header carries the sidecar's part
alone (from the request's arrival at the app to its response headers), so a
page's requests can be held against the API's latency in the server's own
measure. Browsers show it in their developer tools and expose it to the page
through Resource Timing's ``serverTiming``; it reveals nothing but a duration.
"""

from __future__ import annotations

import time

from app.api.guards.response_headers import Header, ResponseHeaders


class ServerTiming(ResponseHeaders):
    """Add ``server-timing: app;dur=MILLISECONDS`` to every HTTP response."""

    def arrived(self) -> float:
        return time.perf_counter()

    def headers(self, began: float) -> tuple[Header, ...]:
        took = (time.perf_counter() - began) * 1e3
        return ((b"server-timing", f"app;dur={took:.3f}".encode()),)
