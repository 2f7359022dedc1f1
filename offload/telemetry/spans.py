"""OpenTelemetry spans for the core, through the API package only.

Whoever embeds the core configures an SDK (standard ``OTEL_*`` variables).
Even a no-op span is too dear for a call made every scheduler step, so spans
are built only while a real tracer provider is installed, re-checked every
``RECHECK_EVERY`` calls.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

TRACER_NAME = "kvscope.offload"
RECHECK_EVERY = 4096

_tracer = trace.get_tracer(TRACER_NAME)


def _provider_installed() -> bool:
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


class SpanGate:
    """Answers "would a span be recorded?" for the price of a decrement."""

    __slots__ = ("_countdown", "_installed")

    def __init__(self) -> None:
        self._installed = _provider_installed()
        self._countdown = RECHECK_EVERY

    def active(self) -> bool:
        self._countdown -= 1
        if self._countdown <= 0:
            self._countdown = RECHECK_EVERY
            self._installed = _provider_installed()
        return self._installed


def record_span(
    name: str, seconds: float, attributes: Mapping[str, AttributeValue], end_ns: int | None = None
) -> None:
    """Record a finished span of ``seconds`` ending now (or at ``end_ns``).

    Spans are written after the fact because the work they describe may end
    on another thread than it began on (a transfer job), and because what
    they report (blocks evicted, bytes moved) is only known at the end.
    """
    end = time.time_ns() if end_ns is None else end_ns
    span = _tracer.start_span(name, start_time=end - int(seconds * 1e9), attributes=attributes)
    span.end(end_time=end)
