"""The sidecar's read-only HTTP API: block statistics, the block index, the event feed, metrics.

Everything served is read from what the ingest thread keeps (the block index,
each publisher's state and latest stats frame, the event log); no route
changes what the workers see. Routes that read the index are plain functions,
which FastAPI runs on worker threads, because they wait on the ingest lock
and must not stall the event loop that serves the event stream.

Block hashes as text. Hashes are ints (traces, older vLLM) or bytes (vLLM's
sha256 hashes); JSON carries both as strings, by one rule that round-trips:

- an int is written in decimal (``"12345"``, ``"-7"``); text that is all
  digits (with an optional leading ``-``) is read as an int;
- bytes are written as ``0x`` and lower-case hex (``"0x9f00..."``); text is
  read as bytes when it is ``0x`` followed by an even number of hex digits,
  or exactly 64 hex digits without the prefix (a sha256 hash as vLLM logs it).

Anything else is a 422 naming the text. Ints are strings in JSON because
64-bit hashes exceed what JavaScript numbers hold exactly.

Authentication. With ``settings.token`` set, every route except the probes
(/healthz, /readyz, which orchestrators call without credentials) needs
``Authorization: Bearer <token>``, the OpenAPI page included.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from hmac import compare_digest
from threading import Lock
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Header, HTTPException, Path, Query, status
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import AfterValidator, BaseModel, Field, StrictInt
from starlette.types import ASGIApp, Receive, Scope, Send

from app.block_index import BlockEntry
from app.event_log import EventLog, LoggedEvent
from app.ingest import Ingestor, PublisherState
from app.settings import SidecarSettings
from app.static_files import mount_page
from app.wire_decode import DEFAULT_MEDIUM
from offload.telemetry.collector import SnapshotCollector
from offload.telemetry.metrics import Snapshot
from offload.wire.stats_frame import StatsFrame

CONNECTED_WITHIN_S = 10.0
"""A publisher counts as connected when a frame arrived this recently."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})
"""Routes served without the bearer token: probes carry no credentials, and the
page (which holds no data) must load before its script can send the token."""

OPEN_PREFIXES = ("/static/",)
"""The page's assets, open for the same reason."""

QUERY_TOKEN_PATHS = frozenset({"/api/v1/events/stream"})
"""Routes that also accept ``?token=``: a browser's EventSource cannot send headers."""

DEFAULT_PAGE = 100
"""Page size when a request names none (capped by settings.page_limit)."""

# --- block hashes as text -------------------------------------------------------------

_INT_TEXT = re.compile(r"-?[0-9]+")
_HEX_TEXT = re.compile(r"(?:0[xX](?:[0-9a-fA-F]{2})+|[0-9a-fA-F]{64})")


def parse_block_hash(text: str) -> bytes | int:
    """Read a hash written by ``render_block_hash`` (see the module doc for the rule)."""
    if _INT_TEXT.fullmatch(text):
        return int(text)
    if _HEX_TEXT.fullmatch(text):
        return bytes.fromhex(text.removeprefix("0x").removeprefix("0X"))
    raise ValueError(
        f"{text!r} is not a block hash: use decimal digits for an int hash, or 0x and an "
        "even number of hex digits (or exactly 64 hex digits) for a bytes hash"
    )


def render_block_hash(block_hash: object) -> str:
    return "0x" + block_hash.hex() if isinstance(block_hash, bytes) else str(block_hash)


def _hash_input(value: str | int) -> bytes | int:
    return value if isinstance(value, int) else parse_block_hash(value)


BlockHashText = Annotated[str, AfterValidator(parse_block_hash)]
BlockHashInput = Annotated[StrictInt | str, AfterValidator(_hash_input)]

# --- response models ------------------------------------------------------------------


class PublisherInfo(BaseModel):
    """One publisher's stream health and, once a stats frame arrived, its configuration."""

    name: str = Field(description="The publisher's PUB endpoint, as configured.")
    seen: bool
    connected: bool = Field(description=f"A frame arrived within {CONNECTED_WITHIN_S:g} s.")
    last_frame_at: float | None
    last_seq: int | None
    frames: int
    gaps: int
    missed: int
    restarts: int
    malformed: int
    replayed: int
    dropped: int | None = Field(description="Frames the publisher itself dropped.")
    engine_id: str | None
    rank: int | None
    policy: str | None
    capacity_blocks: int | None
    block_size: int | None


class StatsResponse(BaseModel):
    """Live totals over every publisher; ``*_per_s`` are null until two stats frames are seen."""

    ts: float
    blocks_by_medium: dict[str, int]
    bytes_by_medium: dict[str, int]
    tracked_blocks: int
    max_blocks: int
    overflow: int
    hit_ratio: float | None = Field(description="lookup_hit_blocks / lookup_blocks.")
    lookup_hit_blocks: int
    lookup_blocks: int
    evictions: dict[str, int] = Field(description="Evicted blocks by reason.")
    stores_completed: int
    loads: int
    stores_per_s: float | None
    loads_per_s: float | None
    evictions_per_s: float | None
    transfer_bytes_per_s: dict[str, float] = Field(description="By direction.")
    events_per_s: float
    publishers: list[PublisherInfo]


class Block(BaseModel):
    block_hash: str
    media: list[str]
    publishers: list[str]
    block_size: int | None
    first_stored: float
    last_stored: float
    hits: int = Field(description="Loads back to the GPU from a lower tier.")
    seq: int


class BlockPage(BaseModel):
    blocks: list[Block]
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page.")


class LookupRequest(BaseModel):
    block_hashes: list[BlockHashInput] = Field(description="A prompt's block-hash chain.")


class LookupResponse(BaseModel):
    runs: dict[str, int] = Field(description="Per medium, the chain's leading run held there.")
    break_index: int = Field(description="The first block held nowhere.")


class Event(BaseModel):
    id: int
    publisher: str
    seq: int = Field(description="The publisher's batch sequence number.")
    ts: float = Field(description="The batch's timestamp, by the publisher's clock.")
    kind: Literal["stored", "removed", "cleared"]
    medium: str | None = Field(description="Null for `cleared` (every medium).")
    block_hashes: list[str]
    block_size: int | None
    parent_block_hash: str | None


class EventPage(BaseModel):
    events: list[Event]
    first_id: int = Field(description="The oldest id still held; older ones were dropped.")
    last_id: int


class Readiness(BaseModel):
    ready: bool
    unseen: list[str]


def _block(entry: BlockEntry) -> Block:
    return Block(
        block_hash=render_block_hash(entry.block_hash),
        media=list(entry.media),
        publishers=list(entry.publishers),
        block_size=entry.block_size,
        first_stored=entry.first_stored,
        last_stored=entry.last_stored,
        hits=entry.hits,
        seq=entry.seq,
    )


def _event(logged: LoggedEvent) -> Event:
    event = logged.event
    parent = event.parent_block_hash
    return Event(
        id=logged.id,
        publisher=logged.publisher,
        seq=logged.seq,
        ts=logged.ts,
        kind=event.kind,
        medium=None if event.kind == "cleared" else event.medium or DEFAULT_MEDIUM,
        block_hashes=[render_block_hash(h) for h in event.block_hashes],
        block_size=event.block_size,
        parent_block_hash=None if parent is None else render_block_hash(parent),
    )


# --- worker counters from stats frames ------------------------------------------------


def _total(frame: StatsFrame, name: str) -> float:
    return sum(sample.value for sample in frame.counters if sample.name == name)


def _by_label(frame: StatsFrame, name: str, label: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for sample in frame.counters:
        if sample.name == name:
            key = sample.labels.get(label, "")
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def _rate(before: float, after: float, seconds: float) -> float | None:
    """A counter's rate, or None over no time or across a reset (a restarted worker)."""
    return (after - before) / seconds if seconds > 0 and after >= before else None


def _sum_known(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


class _FrameHistory:
    """Each publisher's two most recent distinct stats frames, for counter rates.

    The ingest thread keeps only the latest frame, so the pair is sampled
    when the API reads it: a rate spans the frames seen at consecutive reads,
    which is the average since the previous read when frames come faster.
    A new frame also declares its tier's bytes per block to the index.
    """

    def __init__(self, ingestor: Ingestor) -> None:
        self._ingestor = ingestor
        self._lock = Lock()
        self._pairs: dict[str, tuple[StatsFrame | None, StatsFrame]] = {}

    def pairs(self) -> list[tuple[StatsFrame | None, StatsFrame]]:
        with self._lock:
            for name, state in self._ingestor.states.items():
                frame = state.stats
                previous = self._pairs.get(name)
                if frame is None or (previous is not None and previous[1] is frame):
                    continue
                self._pairs[name] = (None if previous is None else previous[1], frame)
                self._declare_block_bytes(name, frame)
            return list(self._pairs.values())

    def _declare_block_bytes(self, publisher: str, frame: StatsFrame) -> None:
        block_bytes = frame.config.bytes_per_block
        if block_bytes is None:
            return
        for sample in frame.gauges:
            if sample.name == "kvscope_blocks_capacity" and "medium" in sample.labels:
                with self._ingestor.lock:
                    self._ingestor.index.set_block_bytes(
                        publisher, sample.labels["medium"], block_bytes
                    )


def _worker_stats(pairs: list[tuple[StatsFrame | None, StatsFrame]]) -> dict[str, object]:
    """The StatsResponse fields that come from the workers' counters."""
    latest = [frame for _previous, frame in pairs]
    hits = sum(_total(frame, "kvscope_lookup_hit_blocks_total") for frame in latest)
    asked = sum(_total(frame, "kvscope_lookup_blocks_total") for frame in latest)
    evictions: dict[str, int] = {}
    for frame in latest:
        for reason, value in _by_label(frame, "kvscope_evicted_blocks_total", "reason").items():
            evictions[reason] = evictions.get(reason, 0) + int(value)

    def rates(name: str) -> float | None:
        return _sum_known(
            [
                _rate(_total(before, name), _total(after, name), after.ts - before.ts)
                for before, after in pairs
                if before is not None
            ]
        )

    transfer: dict[str, float] = {}
    for before, after in pairs:
        if before is None:
            continue
        moved = _by_label(before, "kvscope_transfer_bytes_total", "direction")
        for direction, value in _by_label(
            after, "kvscope_transfer_bytes_total", "direction"
        ).items():
            rate = _rate(moved.get(direction, 0.0), value, after.ts - before.ts)
            if rate is not None:
                transfer[direction] = transfer.get(direction, 0.0) + rate
    return {
        "hit_ratio": hits / asked if asked else None,
        "lookup_hit_blocks": int(hits),
        "lookup_blocks": int(asked),
        "evictions": evictions,
        "stores_completed": int(
            sum(_total(frame, "kvscope_store_completed_blocks_total") for frame in latest)
        ),
        "loads": int(sum(_total(frame, "kvscope_load_blocks_total") for frame in latest)),
        "stores_per_s": rates("kvscope_store_completed_blocks_total"),
        "loads_per_s": rates("kvscope_load_blocks_total"),
        "evictions_per_s": rates("kvscope_evicted_blocks_total"),
        "transfer_bytes_per_s": transfer,
    }


def _publisher_info(state: PublisherState, now: float) -> PublisherInfo:
    frame = state.stats
    return PublisherInfo(
        name=state.endpoints.name,
        seen=state.seen,
        connected=state.last_frame_at is not None
        and now - state.last_frame_at <= CONNECTED_WITHIN_S,
        last_frame_at=state.last_frame_at,
        last_seq=state.last_seq,
        frames=state.frames,
        gaps=state.gaps,
        missed=state.missed,
        restarts=state.restarts,
        malformed=state.malformed,
        replayed=state.replayed,
        dropped=None
        if frame is None
        else int(_total(frame, "kvscope_publisher_dropped_frames_total")),
        engine_id=None if frame is None else frame.engine_id,
        rank=None if frame is None else frame.rank,
        policy=None if frame is None else frame.config.policy,
        capacity_blocks=None if frame is None else frame.config.capacity_blocks,
        block_size=None if frame is None else frame.config.block_size,
    )


# --- Prometheus ------------------------------------------------------------------------

_PUBLISHER_COUNTERS = (
    ("kvscope_sidecar_frames_total", "Frames received (KV batches and stats).", "frames"),
    ("kvscope_sidecar_gaps_total", "Jumps in a publisher's sequence numbers.", "gaps"),
    ("kvscope_sidecar_missed_batches_total", "Batches lost in gaps, not replayable.", "missed"),
    ("kvscope_sidecar_restarts_total", "Times a publisher's sequence went back.", "restarts"),
    ("kvscope_sidecar_malformed_frames_total", "Frames or events skipped as malformed.",
     "malformed"),
    ("kvscope_sidecar_replayed_batches_total", "Batches fetched from replay sockets.",
     "replayed"),
)  # fmt: skip


class _SidecarCollector(Collector):
    """The sidecar's own health, read at scrape time from the ingest state."""

    def __init__(self, ingestor: Ingestor, event_log: EventLog) -> None:
        self._ingestor = ingestor
        self._event_log = event_log

    def describe(self) -> list[Metric]:
        return []  # families appear on the first scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        states = list(self._ingestor.states.values())
        for name, help_text, attribute in _PUBLISHER_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["publisher"])
            for state in states:
                family.add_metric([state.endpoints.name], getattr(state, attribute))
            yield family
        lag = GaugeMetricFamily(
            "kvscope_sidecar_ingest_lag_seconds",
            "Seconds since the publisher's last frame (absent until its first).",
            labels=["publisher"],
        )
        now = time.time()
        for state in states:
            if state.last_frame_at is not None:
                lag.add_metric([state.endpoints.name], now - state.last_frame_at)
        yield lag
        index = self._ingestor.index
        with self._ingestor.lock:
            tracked, overflow = len(index), index.overflow
        yield GaugeMetricFamily("kvscope_sidecar_tracked_blocks", "Blocks indexed.", tracked)
        yield GaugeMetricFamily(
            "kvscope_sidecar_tracked_blocks_max", "Most blocks the index holds.", index.max_blocks
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_index_overflow_total", "Blocks refused by a full index.", overflow
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_events_total", "Block events received.", self._event_log.last_id
        )


def _worker_snapshots(ingestor: Ingestor) -> Iterator[tuple[Snapshot, Mapping[str, str]]]:
    """Every publisher's latest stats frame, labelled with who sent it."""
    for name, state in ingestor.states.items():
        frame = state.stats
        if frame is not None:
            snapshot = Snapshot(frame.counters, frame.gauges, frame.histograms)
            yield snapshot, {"publisher": name, "engine": frame.engine_id, "rank": str(frame.rank)}


def metrics_registry(ingestor: Ingestor, event_log: EventLog) -> CollectorRegistry:
    """A registry of its own, so two sidecars in one process (tests) never collide."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: _worker_snapshots(ingestor)))
    registry.register(_SidecarCollector(ingestor, event_log))
    return registry


# --- authentication --------------------------------------------------------------------


class BearerToken:
    """Pure ASGI middleware (it never buffers, so the event stream passes through)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self._app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if given is None and path in QUERY_TOKEN_PATHS:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if "token" in query:
                given = b"Bearer " + query["token"][0].encode()
        if given is None:
            challenge, detail = 'Bearer realm="kvscope"', "missing bearer token"
        else:
            scheme, _, credentials = given.partition(b" ")
            if scheme.lower() == b"bearer" and compare_digest(credentials.strip(), self._token):
                await self._app(scope, receive, send)
                return
            challenge, detail = 'Bearer realm="kvscope", error="invalid_token"', "invalid token"
        response = JSONResponse(
            {"detail": detail},
            status.HTTP_401_UNAUTHORIZED,
            headers={"WWW-Authenticate": challenge},
        )
        await response(scope, receive, send)


# --- the application -------------------------------------------------------------------


def create_app(settings: SidecarSettings, ingestor: Ingestor, event_log: EventLog) -> FastAPI:
    """The sidecar's FastAPI application over an (already built) ingestor and event log."""
    app = FastAPI(
        title="kvscope sidecar",
        summary="Live KV-cache block statistics, block index, event feed and metrics.",
        description=__doc__,
    )
    if settings.token is not None:
        app.add_middleware(BearerToken, token=settings.token.get_secret_value())
    app.include_router(_api_router(settings, ingestor, event_log), prefix="/api/v1")
    app.include_router(_ops_router(ingestor, event_log))
    mount_page(app)
    return app


def _api_router(settings: SidecarSettings, ingestor: Ingestor, event_log: EventLog) -> APIRouter:
    router = APIRouter(tags=["api"])
    index = ingestor.index
    history = _FrameHistory(ingestor)

    def limit_query() -> Any:
        """The ``limit`` parameter, capped by settings (a 422 names the cap when exceeded)."""
        return Query(
            min(DEFAULT_PAGE, settings.page_limit),
            ge=1,
            le=settings.page_limit,
            description=f"Page size, at most {settings.page_limit}.",
        )

    @router.get("/stats")
    def stats() -> StatsResponse:
        """Blocks and bytes per medium, hit ratio, evictions, rates and publisher health."""
        worker = _worker_stats(history.pairs())
        now = time.time()
        with ingestor.lock:
            blocks, size = index.blocks_by_medium(), index.bytes_by_medium()
            tracked, overflow = len(index), index.overflow
        return StatsResponse(
            ts=now,
            blocks_by_medium=blocks,
            bytes_by_medium=size,
            tracked_blocks=tracked,
            max_blocks=index.max_blocks,
            overflow=overflow,
            events_per_s=event_log.events_per_s(),
            publishers=[_publisher_info(state, now) for state in ingestor.states.values()],
            **worker,
        )

    @router.get("/blocks")
    def blocks(
        medium: str | None = None,
        publisher: str | None = None,
        cursor: int | None = Query(None, description="`next_cursor` of the previous page."),
        limit: int = limit_query(),
    ) -> BlockPage:
        """Indexed blocks in order of first store; the cursor survives blocks coming and going."""
        with ingestor.lock:
            entries, next_cursor = index.page(medium, publisher, cursor, limit)
        return BlockPage(blocks=[_block(entry) for entry in entries], next_cursor=next_cursor)

    @router.get("/blocks/{block_hash}", responses={404: {"description": "Not indexed."}})
    def block(block_hash: Annotated[BlockHashText, Path()]) -> Block:
        """One block: where it is held, since when, how often reloaded."""
        with ingestor.lock:
            entry = index.get(block_hash)
        if entry is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "block not indexed")
        return _block(entry)

    @router.post("/lookup")
    def lookup(request: LookupRequest) -> LookupResponse:
        """How much of a prompt's block chain is cached, per medium, and where it breaks."""
        with ingestor.lock:
            match = index.lookup_prefix(request.block_hashes)
        return LookupResponse(runs=match.runs, break_index=match.break_index)

    @router.get("/events")
    def events(since: Annotated[int, Query(ge=0)] = 0, limit: int = limit_query()) -> EventPage:
        """Recent block events after id ``since``, oldest first (page on with the last id)."""
        found = event_log.since(since, limit)
        return EventPage(
            events=[_event(logged) for logged in found],
            first_id=event_log.first_id(),
            last_id=event_log.last_id,
        )

    @router.get("/events/stream", response_class=EventSourceResponse)
    async def event_stream(
        last_event_id: Annotated[int | None, Header(ge=0)] = None,
    ) -> AsyncIterator[ServerSentEvent]:
        """Live block events as Server-Sent Events (`id:` is the event id).

        With `Last-Event-ID`, the held events after it come first. An id above
        the newest one comes from an earlier sidecar process, so everything held
        is sent. A keep-alive comment goes out after 15 s without events.
        """
        cursor = event_log.last_id if last_event_id is None else last_event_id
        if cursor > event_log.last_id:
            cursor = 0
        while True:
            found = event_log.since(cursor, settings.page_limit)
            if not found:
                await event_log.wait_after(cursor)
                continue
            for logged in found:
                yield ServerSentEvent(data=_event(logged), id=str(logged.id))
            cursor = found[-1].id

    return router


def _ops_router(ingestor: Ingestor, event_log: EventLog) -> APIRouter:
    router = APIRouter(tags=["operations"])
    registry = metrics_registry(ingestor, event_log)

    @router.get("/metrics", response_class=Response)
    def metrics() -> Response:
        """Prometheus exposition: every worker's metrics, labelled, and the sidecar's own."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        """Liveness: 200 while the process serves."""
        return {"status": "ok"}

    @router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
    def readyz() -> JSONResponse:
        """Readiness: 200 once every publisher has been heard from, else 503 naming the rest."""
        unseen = [name for name, state in ingestor.states.items() if not state.seen]
        body = Readiness(ready=not unseen, unseen=unseen)
        code = status.HTTP_503_SERVICE_UNAVAILABLE if unseen else status.HTTP_200_OK
        return JSONResponse(body.model_dump(), code)

    return router
