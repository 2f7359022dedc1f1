"""The sidecar's read-only HTTP API, built over a ``SidecarState`` by ``create_app``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api.body_errors import install_body_errors
from app.api.event_stream import EventStreams
from app.api.guards import install_guards
from app.api.http_collector import HttpCollector
from app.api.http_counts import HttpCounts
from app.api.limits import HttpLimits
from app.api.metrics import Exposition
from app.api.page import mount_page
from app.api.response_buffers import ResponseBuffers
from app.api.routes import blocks, docs, events, history, insight, operations, stats
from app.api.validation_errors import install_validation_errors
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

- an int is written in decimal (`"12345"`, `"-7"`); text that is ASCII digits
  with no leading zero, at most 20 of them, with an optional leading `-` (not
  before `0`), is read as an int;
- bytes are written as `0x` and lower-case hex (`"0x9f00..."`); text is read as
  bytes when it is `0x` followed by an even number of hex digits, or exactly 64
  hex digits without the prefix (a sha256 hash as vLLM logs it).

Anything else is a 400 in a path, a 422 in a lookup's body. Ints are strings
in JSON because 64-bit hashes exceed what JavaScript numbers hold exactly.
`POST /api/v1/lookup` also takes JSON integers, of at most 20 digits too
(a longer one is a 422 naming its item).

**Numbers in URLs and headers** (`cursor`, `limit`, `since`, `resolution`,
`Last-Event-ID`) are ASCII digits 0-9 with no sign, space, underscore or
leading zero, at most 20 of them; anything else is a 400 whose `detail`
names the parameter (`loc`) and the problem (`msg`), as a 422's does. A
number so written but out of its bounds is a 422. A query parameter or
header that an operation reads, given more than once, is a 400 too
(`repeated_parameter`): which value counts would be a guess.

**Authentication.** When the sidecar is started with a token, every route
except the probes (`/healthz`, `/readyz`) needs `Authorization: Bearer
<token>`, this schema and the web page included; a missing or wrong token is
a 401, and two `Authorization` fields or session cookies are a 400
(`repeated_parameter`). In a browser, open `/?token=<token>` once: the answer sets a session
cookie (HttpOnly, SameSite=Strict) that the page and its requests then carry,
and redirects to `/`. The event stream also takes `?token=<token>`, since an
EventSource cannot send headers. Without the token, `/readyz` counts the
unseen publishers but does not name them.

**Limits.** A request body over 2 MiB is a 413; a lookup takes at most 16,384
hashes; an event lists at most 1,000 of its hashes (`block_count` says how many
it had); an events page stops at about 1 MiB; at most 256 event streams are
open (then 503), and a stream whose reader falls 1 MiB behind is ended (the
reader resumes with `Last-Event-ID`). While 256 MiB of answers wait for
clients still reading them, an answer that would pass that is a 503 with
`Retry-After`. Requests must name the sidecar by a
name it serves (`Host`; by default the loopback names and the address it
binds), except the probes'.
"""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.streams.close()


def create_app(
    settings: SidecarSettings, state: SidecarState, limits: HttpLimits | None = None
) -> FastAPI:
    """The sidecar's FastAPI application over ``state`` (which the ingest thread keeps).

    ``limits`` default to ``HttpLimits.from_settings(settings)``.
    """
    limits = HttpLimits.from_settings(settings) if limits is None else limits
    app = FastAPI(
        title="kvscope sidecar",
        summary="Live KV-cache block statistics, block index, event feed and metrics.",
        description=DESCRIPTION,
        openapi_url=None,  # served by routes.docs, behind the token
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan,
        # Starlette answered a path with a slash too many or too few with a 307 whose
        # Location it built from the Host header (and the scheme it was reached by): with
        # every name allowed (the 0.0.0.0 default), any Host was echoed into it. A path is
        # answered as written instead; the client has the one spelling it needs.
        redirect_slashes=False,
    )
    counts = HttpCounts()
    streams = EventStreams(state.event_log, limits, counts)
    buffers = ResponseBuffers(limits.response_buffer_bytes)
    app.state.settings = settings
    app.state.sidecar = state
    app.state.limits = limits
    app.state.counts = counts
    app.state.streams = streams
    app.state.response_buffers = buffers
    app.state.metrics = Exposition(state, HttpCollector(counts, streams, buffers))
    for router in (
        stats.router,
        history.router,
        insight.router,
        blocks.router,
        events.router,
        events.stream_router,
    ):
        app.include_router(router, prefix="/api/v1")
    app.include_router(operations.router)
    app.include_router(operations.probes)
    app.include_router(docs.router)
    mount_page(app)
    install_validation_errors(app)
    install_body_errors(app)
    install_guards(app, limits, counts, buffers)
    return app
