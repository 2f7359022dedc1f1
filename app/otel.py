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
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from opentelemetry import trace

from offload.shown import shown, shown_repr

if TYPE_CHECKING:  # the SDK is imported only where tracing is on (configure_otel)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

KNOWN_EXPORTERS = ("console", "otlp", "none")

_BSP_VARIABLES = {
    "max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE",
    "schedule_delay_millis": "OTEL_BSP_SCHEDULE_DELAY",
    "max_export_batch_size": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "export_timeout_millis": "OTEL_BSP_EXPORT_TIMEOUT",
}
"""The variables behind the batch span processor's arguments, which its errors name."""

MAX_BSP_VALUE: Final = 2**31 - 1
"""The largest ``OTEL_BSP_*`` value taken: the SDK takes any integer, but a queue size past
a C ``ssize_t`` raised OverflowError as it was set up (a traceback), and a delay past
what ``threading`` waits stopped its export thread, every span then dropped. This is 24
days of milliseconds, and a queue far past any memory."""


class OtelConfigError(ValueError):
    """An OTEL_* variable kvscope cannot honour; the message names it."""


def configure_otel(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """Install a tracer provider when OTEL_TRACES_EXPORTER asks for one.

    Returns the provider (call ``shutdown()`` on exit to flush it), or None
    when tracing stays off: no exporter named, ``none``, or the SDK disabled.
    The SDK is imported only then: it reads some variables (the span limits)
    as it is imported, and a bad one must not break a command that traces
    nothing. A value the SDK refuses is an ``OtelConfigError`` naming it.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    names = [name for name in names if name and name != "none"]
    if not names:
        return None
    for variable in _BSP_VARIABLES.values():
        _check_integer(environ, variable)
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        service = environ.get("OTEL_SERVICE_NAME") or "kvscope"
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        for name in names:
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    except OtelConfigError:
        raise
    except ValueError as exc:
        raise _refused(exc) from None
    trace.set_tracer_provider(provider)
    return provider


def _check_integer(environ: Mapping[str, str], variable: str) -> None:
    """The SDK logs a traceback for a batch processor variable that is not an integer, and
    goes on with its default: refused here instead, like any other bad setting; so is one
    past ``MAX_BSP_VALUE`` (the SDK's own checks refuse those too small)."""
    value = environ.get(variable)
    if value is None:
        return
    try:
        number = int(value)
    except ValueError:
        raise OtelConfigError(f"{variable} must be an integer, got {shown_repr(value)}") from None
    if number > MAX_BSP_VALUE:
        raise OtelConfigError(
            f"{variable} must be at most {MAX_BSP_VALUE}, got {shown_repr(number)}"
        )


def _refused(exc: ValueError) -> OtelConfigError:
    """The SDK's error, naming the variable where the SDK names the argument it set, on one
    line cut to length: the SDK's message quotes the value as given."""
    pattern = r"\b(" + "|".join(_BSP_VARIABLES) + r")\b"
    message = shown(re.sub(pattern, lambda match: _BSP_VARIABLES[match[1]], str(exc)).rstrip("."))
    if "OTEL_" in message:
        return OtelConfigError(message)
    return OtelConfigError(f"the OpenTelemetry SDK refused the OTEL_* settings: {message}")


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

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
        f"OTEL_TRACES_EXPORTER names an unknown exporter {shown_repr(name)}; "
        f"kvscope knows: {', '.join(KNOWN_EXPORTERS)}"
    )
