"""What the HTTP side refused or dropped, counted for /metrics (``kvscope_sidecar_http_*``).

Every limit in ``HttpLimits`` that turns a request or a connection away or
drops a reader adds one here, so an operator sees a limit being hit rather than guessing
from clients' errors; the events rendered for resuming readers' backlogs are counted here
too, as they are rendered per reader rather than once for all. Counts change on the event
loop only; /metrics reads them from a worker thread, and a read of an int is atomic in
CPython.
"""

from __future__ import annotations

from collections import Counter
from typing import Final, Literal, get_args

Refusal = Literal[
    "body_too_large",
    "host_not_allowed",
    "sse_clients_full",
    "headers_too_large",
    "headers_timeout",
    "body_timeout",
    "send_timeout",
    "send_too_slow",
    "connections_full",
    "pipeline_full",
    "pipeline_too_large",
    "malformed_request",
    "response_buffer_full",
]

REFUSALS: Final[tuple[Refusal, ...]] = get_args(Refusal)


class HttpCounts:
    """Requests refused, by reason, event-stream readers shed for reading too slowly, and the
    events rendered for resuming readers' backlogs (each reader's its own, apart from the
    broadcast rendered once for all)."""

    def __init__(self) -> None:
        self.refused: Counter[Refusal] = Counter(dict.fromkeys(REFUSALS, 0))
        self.sse_shed = 0
        self.sse_backlog_events = 0

    def refuse(self, reason: Refusal) -> None:
        self.refused[reason] += 1
