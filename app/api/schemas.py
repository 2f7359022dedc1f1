"""The API's request and response bodies, and how each is built from the sidecar's state."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, Field

from app.api.hash_text import BlockHashInput, render_block_hash
from app.api.strict_body import StrictBody
from app.decode import DEFAULT_MEDIUM
from app.state.block_index import BlockEntry
from app.state.event_log import LoggedEvent
from app.state.history import Kind, SeriesKey
from app.state.listener import ListenerState
from app.state.publisher import CONNECTED_WITHIN_S, PublisherState

MAX_LOOKUP_HASHES: Final = 16_384
"""Longest chain one lookup takes: a 256k-token prompt in blocks of 16."""

MAX_EVENT_HASHES: Final = 1_000
"""Most block hashes one served event lists (``block_count`` says how many it had). A
publisher may send one event of millions of hashes; rendering them all, for every
reader, would hold the server for seconds and send hundreds of megabytes."""


class PublisherInfo(BaseModel):
    """One publisher's stream health and, once a stats frame arrived, its configuration."""

    name: str = Field(
        description="Connect mode: the publisher's PUB endpoint, as configured. "
        "Listen mode: its stream, TOPIC@RANK."
    )
    mode: Literal["connect", "listen"] = Field(
        description="connect: the sidecar subscribed to the publisher's socket; "
        "listen: the publisher connected to the sidecar's listen socket."
    )
    seen: bool
    connected: bool = Field(description=f"A frame arrived within {CONNECTED_WITHIN_S:g} s.")
    last_frame_at: float | None
    last_seq: int | None
    frames: int
    gaps: int
    missed: int
    restarts: int
    malformed: int
    replayed: int = Field(description="Batches applied from the publisher's replay socket.")
    replays: dict[str, int] = Field(
        description="Replays asked of its replay socket, by how they ended: complete, "
        "timeout, deadline, oversize, malformed; unstarted: its socket could not be made "
        "(no file descriptor left, an endpoint ZMQ cannot connect to) and nothing was asked."
    )
    held_dropped: int = Field(
        description="Live frames dropped while a replay held them past replay_hold_bytes."
    )
    family_changes: int = Field(
        description="Times its connect socket was made again, or its replay endpoint "
        "switched, for the address family its host name came to resolve to while it was "
        "unheard (connect mode; 0 in listen mode)."
    )
    source_family_mismatches: int = Field(
        description="Times its connect or replay endpoint's host name came to resolve, while "
        "it was unheard, to addresses of the other family alone than the source address the "
        "endpoint leaves from (tcp://SOURCE:PORT;HOST:PORT), which ZMQ cannot connect "
        "across: the endpoint is retried until the name resolves to the source's family "
        "again. Each counted once until then."
    )
    dropped: int | None = Field(description="Frames the publisher itself dropped.")
    stats_ts: float | None = Field(
        description="When its latest stats frame was taken, by the publisher's clock: "
        "`ts` minus it is how far behind its worker's numbers are (clock skew included)."
    )
    engine_id: str | None
    rank: int | None
    policy: str | None
    capacity_blocks: int | None
    block_size: int | None

    @classmethod
    def of(cls, state: PublisherState, now: float) -> PublisherInfo:
        frame, worker = state.stats, state.worker
        return cls(
            name=state.name,
            mode=state.source.mode,
            seen=state.seen,
            connected=state.connected(now),
            last_frame_at=state.last_frame_at,
            last_seq=state.last_seq,
            frames=state.frames,
            gaps=state.gaps,
            missed=state.missed,
            restarts=state.restarts,
            malformed=state.malformed,
            replayed=state.replayed,
            replays={str(outcome): count for outcome, count in state.replays.items()},
            held_dropped=state.held_dropped,
            family_changes=state.family_changes,
            source_family_mismatches=state.source_family_mismatches,
            dropped=None if worker is None else worker.dropped_frames,
            stats_ts=None if frame is None else frame.ts,
            engine_id=None if frame is None else frame.engine_id,
            rank=None if frame is None else frame.rank,
            policy=None if frame is None else frame.config.policy,
            capacity_blocks=None if frame is None else frame.config.capacity_blocks,
            block_size=None if frame is None else frame.config.block_size,
        )


class ListenerInfo(BaseModel):
    """The listen socket: where publishers connect, and the frames no publisher took."""

    endpoints: list[str] = Field(description="Bound endpoints (wildcard ports resolved).")
    frames: int = Field(description="Frames received on the listen socket.")
    malformed: int = Field(description="Frames skipped before they named a stream.")
    refused: int = Field(description="Frames of new streams once max_publishers are tracked.")
    publishers: int = Field(description="Listen-mode publishers tracked.")
    max_publishers: int
    connections: int = Field(
        description="Peers admitted (their handshake accepted) and still connected."
    )
    max_connections: int
    refused_connections: int = Field(
        description="Handshakes refused while max_connections peers were admitted (each "
        "refused peer connects again, and may be counted again, every 5 s)."
    )
    max_connections_per_host: int = Field(
        description="Most peers admitted at once from one IP address (ipc:// peers: no limit "
        "but max_connections)."
    )
    refused_host_connections: int = Field(
        description="Handshakes refused while their host had max_connections_per_host peers "
        "admitted (each refused peer connects again, and may be counted again, every 5 s)."
    )
    allow: list[str] = Field(
        description="The networks a peer must connect from (KVSCOPE_LISTEN_ALLOW); empty: any."
    )
    refused_addresses: int = Field(
        description="Handshakes refused for good: the peer's address is outside `allow`."
    )
    shed_connections: int = Field(
        description="Connections counted as admitted before their handshake ended, 16 per "
        "max_connections place being unsettled already (a peer opening connections faster "
        "than handshakes end): each holds a place until it closes."
    )
    stream_moves: int = Field(
        description="Frames of a stream from another host than its last: its locations "
        "moved to that host's share (a count that climbs: two peers send under one name)."
    )
    stream_move_resets: int = Field(
        description="Of those, moves whose new host's share could not take the stream's "
        "locations: what the stream held was forgotten."
    )

    @classmethod
    def of(cls, listener: ListenerState, publishers: list[PublisherState]) -> ListenerInfo:
        return cls(
            endpoints=list(listener.bound),
            frames=listener.frames,
            malformed=listener.malformed,
            refused=listener.refused,
            publishers=sum(p.source.mode == "listen" for p in publishers),
            max_publishers=listener.max_publishers,
            connections=listener.connections,
            max_connections=listener.max_connections,
            refused_connections=listener.refused_connections,
            max_connections_per_host=listener.max_connections_per_host,
            refused_host_connections=listener.refused_host_connections,
            allow=[str(network) for network in listener.allow],
            refused_addresses=listener.refused_addresses,
            shed_connections=listener.shed_connections,
            stream_moves=listener.stream_moves,
            stream_move_resets=listener.stream_move_resets,
        )


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
    listener: ListenerInfo | None = Field(description="Null unless the sidecar listens.")


class BlockInfo(BaseModel):
    block_hash: str
    media: list[str]
    publishers: list[str]
    block_size: int | None
    first_stored: float
    last_stored: float
    hits: int = Field(description="Loads back to the GPU from a lower tier.")
    seq: int

    @classmethod
    def of(cls, entry: BlockEntry) -> BlockInfo:
        return cls(
            block_hash=render_block_hash(entry.block_hash),
            media=list(entry.media),
            publishers=list(entry.publishers),
            block_size=entry.block_size,
            first_stored=entry.first_stored,
            last_stored=entry.last_stored,
            hits=entry.hits,
            seq=entry.seq,
        )


class BlockPage(BaseModel):
    blocks: list[BlockInfo]
    next_cursor: int | None = Field(
        description="Pass as `cursor` for the next page; null only when the listing is done "
        "(a short or empty page may have one)."
    )


class LookupRequest(StrictBody):
    block_hashes: list[BlockHashInput] = Field(
        max_length=MAX_LOOKUP_HASHES, description="A prompt's block-hash chain."
    )


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
    block_hashes: list[str] = Field(
        description=f"The event's first {MAX_EVENT_HASHES} block hashes (all, when fewer)."
    )
    block_count: int = Field(description="How many block hashes the event carried.")
    block_size: int | None
    parent_block_hash: str | None
    group: int | None = Field(
        default=None,
        description="The KV cache group whose copy of the blocks this is (vLLM's group_idx: "
        "a hybrid model holds a block once per group); null where the publisher names none.",
    )

    @classmethod
    def of(cls, logged: LoggedEvent) -> Event:
        event = logged.event
        parent = event.parent_block_hash
        shown = event.block_hashes[:MAX_EVENT_HASHES]
        return cls(
            id=logged.id,
            publisher=logged.publisher,
            seq=logged.seq,
            ts=logged.ts,
            kind=event.kind,
            medium=None if event.kind == "cleared" else event.medium or DEFAULT_MEDIUM,
            block_hashes=[render_block_hash(h) for h in shown],
            block_count=len(event.block_hashes),
            block_size=event.block_size,
            parent_block_hash=None if parent is None else render_block_hash(parent),
            group=event.group,
        )


class EventPage(BaseModel):
    """Events after ``since``, up to ``limit`` and about a megabyte: page on with the last id."""

    events: list[Event]
    first_id: int = Field(description="The oldest id still held; older ones were dropped.")
    last_id: int


class Liveness(BaseModel):
    status: Literal["ok", "ingest stopped"] = Field(
        description="ok; or ingest stopped (a 503): the ingest thread ended, no publisher is "
        "read, and only a restart brings the sidecar back (its log says why)."
    )


class Readiness(BaseModel):
    ready: bool
    unseen_count: int = Field(description="Publishers not heard from yet.")
    unseen: list[str] | None = Field(
        description="Their names; null to a request without the token, when one is set: "
        "the probes are open, the publishers' addresses are not."
    )


class HistorySeries(BaseModel):
    """One series' values, one per ``HistoryResponse.times`` entry (null: no sample there)."""

    publisher: str | None = Field(description="Null for the sidecar as a whole.")
    metric: str = Field(
        description="blocks, bytes (gauges, by medium); lookup_hit_blocks, lookup_blocks, "
        "stores_completed, loads, dropped_frames, evictions (by reason), frames, gaps, missed, "
        "restarts, malformed, held_dropped (counters); stores_per_s, loads_per_s, "
        "evictions_per_s, transfer_bytes_per_s (by direction) (gauges); for the sidecar: "
        "tracked_blocks, events_per_s (gauges), overflow, events (counters)."
    )
    labels: dict[str, str] = Field(description="medium, reason or direction, where it has one.")
    kind: Literal["gauge", "counter"] = Field(
        description="gauge: a point is the mean of its interval's samples; counter: the total "
        "at its interval's end (subtract points for increases; a drop is a restart)."
    )
    values: list[float | None]

    @classmethod
    def of(cls, key: SeriesKey, kind: Kind, values: list[float | None]) -> HistorySeries:
        return cls(
            publisher=key.publisher,
            metric=key.metric,
            labels=dict(key.labels),
            kind=kind,
            values=values,
        )


class HistoryResponse(BaseModel):
    """The aggregates over time at one resolution, from ``since`` on, oldest first."""

    resolution_s: int = Field(description="Seconds each point covers.")
    resolutions_s: list[int] = Field(description="The resolutions kept, finest first.")
    retention_s: list[int] = Field(description="How far back each resolution reaches.")
    times: list[float] = Field(description="Each point's interval start, unix seconds.")
    series: list[HistorySeries] = Field(description="Those with a value in the window.")
    max_series: int
    refused: int = Field(description="Readings dropped because max_series series were kept.")
