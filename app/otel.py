"""OpenTelemetry SDK set-up for kvscope's own processes, from ``OTEL_*`` variables.

The core (``offload``) only uses the API; a process that wants its spans
exported installs the SDK. Inside vLLM that is vLLM's (or
``opentelemetry-instrument``'s) job; for the processes ``kvscope`` starts
itself it is this module's. The SDK reads the standard variables for what
it owns (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_EXPORTER_OTLP_*``); this
module reads ``OTEL_SDK_DISABLED`` and ``OTEL_TRACES_EXPORTER``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

KNOWN_EXPORTERS = ("console", "otlp", "none")


class OtelConfigError(ValueError):
    """An OTEL_* variable kvscope cannot honour; the message names it."""


def configure_otel(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """Install a tracer provider when OTEL_TRACES_EXPORTER asks for one.

    Returns the provider (call ``shutdown()`` on exit to flush it), or None
    when tracing stays off: no exporter named, ``none``, or the SDK disabled.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    exporters = [_exporter(name) for name in names if name and name != "none"]
    if not exporters:
        return None
    service = environ.get("OTEL_SERVICE_NAME") or "kvscope"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        # stderr: kvscope's commands print their results on stdout.
        return ConsoleSpanExporter(out=sys.stderr)
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise OtelConfigError(
                "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: pip install 'kvscope[otlp]'"
            ) from None
        return OTLPSpanExporter()
    raise OtelConfigError(
        f"OTEL_TRACES_EXPORTER names an unknown exporter {name!r}; "
        f"kvscope knows: {', '.join(KNOWN_EXPORTERS)}"
    )
