"""The HTTP side's own metrics on /metrics: what its limits refused or shed, the event
streams open and the response bytes held.

Read at scrape time from the objects the HTTP side counts in (``HttpCounts``,
``EventStreams``, ``ResponseBuffers``), not from the sidecar's state: the app builds them,
and ``Exposition`` (app/api/metrics.py) registers this collector beside the state's.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.api.event_stream import EventStreams
from app.api.http_counts import HttpCounts
from app.api.response_buffers import ResponseBuffers


class HttpCollector(Collector):
    """What the HTTP side refused or shed, the event streams open, the events rendered for
    their backlogs and the response bytes held (``HttpLimits``)."""

    def __init__(self, counts: HttpCounts, streams: EventStreams, buffers: ResponseBuffers) -> None:
        self._counts = counts
        self._streams = streams
        self._buffers = buffers

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            "kvscope_sidecar_http_refused",
            "Requests refused by a limit: body_too_large (413), host_not_allowed (400), "
            "sse_clients_full (503), headers_too_large (431), connections_full (503), "
            "malformed_request (400, bytes the HTTP parser refuses or a request target not "
            "served; 501, a transfer coding before chunked), response_buffer_full "
            "(503, an answer that would pass the bytes held for clients still reading), "
            "pipeline_too_large (503, a request that would take those sent ahead of their "
            "answers past max_header_bytes together); "
            "connections closed: headers_timeout (no complete head in time), body_timeout (no "
            "complete body in time), send_timeout "
            "(a response its client stopped reading), send_too_slow (a response its client "
            "read slower than min_send_bytes_per_s), pipeline_full (too many requests "
            "sent ahead of their answers).",
            labels=["reason"],
        )
        for reason, count in self._counts.refused.items():
            refused.add_metric([reason], count)
        yield refused
        yield CounterMetricFamily(
            "kvscope_sidecar_sse_shed",
            "Event-stream readers dropped for falling a queue's worth behind.",
            self._counts.sse_shed,
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_sse_backlog_events",
            "Events rendered for the backlogs of readers resuming from an older Last-Event-ID, "
            "rendered per reader (the live broadcast is rendered once for all); none once the "
            "reader is shed.",
            self._counts.sse_backlog_events,
        )
        yield GaugeMetricFamily(
            "kvscope_sidecar_sse_clients", "Event streams open.", len(self._streams)
        )
        yield GaugeMetricFamily(
            "kvscope_sidecar_http_response_buffer_bytes",
            "Response bytes held for clients still reading them: buffers of connections past "
            "64 KiB unsent, and answers admitted but not yet written. An answer that would "
            "take it past response_buffer_bytes (an answer other than /metrics: past its "
            "seven eighths) is refused (response_buffer_full).",
            self._buffers.held(),
        )
