"""The sidecar's HTTP app over a state the test feeds itself, in process or on a real socket.

Tests of the HTTP side need events in the log, not a publisher: they record
decoded batches straight into the ``SidecarState`` (what the ingest thread
does), and read them back through ``create_app`` as a client would, either
through fastapi's TestClient or from uvicorn on loopback (``serving``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.api.limits import HttpLimits
from app.decode import DecodedBatch, DecodedEvent
from app.server import HttpServer, http_server
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LISTEN = "tcp://127.0.0.1:*"
"""Listen mode with nothing declared: no publisher to wait for, so /readyz is ready."""


def sidecar_app(limits: HttpLimits | None = None, **settings: Any) -> tuple[FastAPI, SidecarState]:
    """An app over a fresh state (listen mode unless ``settings`` name publishers)."""
    if "connect" not in settings:
        settings.setdefault("listen", [LISTEN])
    config = SidecarSettings(**settings)
    state = SidecarState.from_settings(config)
    return create_app(config, state, limits), state


def in_process(app: FastAPI) -> TestClient:
    """TestClient under a name the Host check serves (its own ``testserver`` is refused)."""
    return TestClient(app, base_url="http://localhost")


@contextmanager
def serving(
    app: FastAPI, log_level: str = "warning", send_buffer: int | None = None
) -> Iterator[str]:
    """``app`` under uvicorn on a free loopback port; yields its base URL.

    ``send_buffer`` fixes each connection's kernel send buffer (``SO_SNDBUF``, which
    accepted sockets take from the listening one): Linux grows it to megabytes on
    loopback, where a test needs what a client leaves unread to stay in the server's own.
    """
    server = http_server(app, "127.0.0.1", 0, log_level)
    if send_buffer is not None:
        for sock in server.bound:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    with HttpServer(server) as served:
        yield served.url


def served_views(
    state: SidecarState, endpoint: str
) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], dict[str, Any]]:
    """What /metrics (each sample by name and sorted labels) and /api/v1/stats (the one
    publisher, ``endpoint``) show of a state an ingestor fills."""
    app = create_app(SidecarSettings(connect=[endpoint]), state)
    with in_process(app) as http:
        metrics = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(http.get("/metrics").text)
            for sample in family.samples
        }
        (publisher,) = http.get("/api/v1/stats").json()["publishers"]
    return metrics, publisher


def record(state: SidecarState, events: int, hashes: int = 2, first_hash: int = 0) -> None:
    """One batch of ``events`` stored events of ``hashes`` int hashes each, as ingest records."""
    batch = DecodedBatch(
        1.0,
        0,
        [
            DecodedEvent("stored", list(range(start, start + hashes)), "CPU", 16)
            for start in range(first_hash, first_hash + events * hashes, hashes)
        ],
    )
    state.event_log.record("test-publisher", state.event_log.last_id, batch)


def sse_events(response: httpx.Response, count: int) -> Iterator[dict[str, Any]]:
    """Parse Server-Sent Events off a streaming response until ``count`` have arrived."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line:
            key, _, value = line.partition(": ")
            fields[key] = value
            continue
        if "data" in fields:
            yield {"id": int(fields["id"]), **json.loads(fields["data"])}
            count -= 1
            if count == 0:
                return
        fields = {}
