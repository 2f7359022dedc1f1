"""The sidecar's read-only HTTP API, built over a ``SidecarState`` by ``create_app``."""

from __future__ import annotations

from fastapi import FastAPI

from app.api.metrics import metrics_registry
from app.api.page import mount_page
from app.api.routes import blocks, docs, events, operations, stats
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState

DESCRIPTION = """\
Live statistics of the KV-cache blocks that kvscope workers and vLLM engines
report on their KV-event streams: where each block is held (GPU, CPU, ...) and
by which publisher, how much of a prompt's prefix is cached, the events as they
arrive, and every worker's Prometheus metrics. Nothing here changes what the
workers do.

**Block hashes as text.** Hashes are ints (traces, older vLLM) or bytes
(vLLM's sha256 hashes); JSON carries both as strings, by one rule that
round-trips:

- an int is written in decimal (`"12345"`, `"-7"`); text that is all digits
  (with an optional leading `-`) is read as an int;
- bytes are written as `0x` and lower-case hex (`"0x9f00..."`); text is read as
  bytes when it is `0x` followed by an even number of hex digits, or exactly 64
  hex digits without the prefix (a sha256 hash as vLLM logs it).

Anything else is a 422 naming the text. Ints are strings in JSON because
64-bit hashes exceed what JavaScript numbers hold exactly. `POST
/api/v1/lookup` also takes JSON integers.

**Authentication.** When the sidecar is started with a token, every route
except the probes (`/healthz`, `/readyz`) needs `Authorization: Bearer
<token>`, this documentation included; a missing or wrong token is a 401. The
event stream also takes `?token=<token>`, since a browser's EventSource cannot
send headers. The web page at `/` holds no data and loads without a token.
"""


def create_app(settings: SidecarSettings, state: SidecarState) -> FastAPI:
    """The sidecar's FastAPI application over ``state`` (which the ingest thread keeps)."""
    app = FastAPI(
        title="kvscope sidecar",
        summary="Live KV-cache block statistics, block index, event feed and metrics.",
        description=DESCRIPTION,
        openapi_url=None,  # served by routes.docs, behind the token
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.sidecar = state
    app.state.metrics = metrics_registry(state)
    for router in (stats.router, blocks.router, events.router, events.stream_router):
        app.include_router(router, prefix="/api/v1")
    app.include_router(operations.router)
    app.include_router(operations.probes)
    app.include_router(docs.router)
    mount_page(app)
    return app
