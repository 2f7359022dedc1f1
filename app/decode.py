"""Decode KV-event frames from kvscope workers and from vLLM's own publisher, of any era.

vLLM's wire format changed shape across releases; every shape is read into one
small internal form (``DecodedBatch`` of ``DecodedEvent``) by msgspec, in one
pass. A payload that is no batch raises ``MalformedFrame``; a bad event is
skipped and counted, the rest of its batch kept (so a batch with a bad event
is decoded event by event, and may hold no more events than well-formed ones
of its size could be). The shapes: docs/PROTOCOL.md.

What a peer sends is bounded here, where its bytes enter (offload/wire/labels.py):
a medium is a short name of plain characters, a bytes block hash 1 to 64
bytes, ``ts`` a finite number, a rank a 32-bit integer. An event that breaks a
bound is malformed like any other; a batch whose ``ts`` or rank does is no batch.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Final, Literal, Protocol

import msgspec

from offload.telemetry.metrics import SPECS
from offload.wire.framing import MalformedFrame
from offload.wire.labels import BlockHash, Finite, Medium, Rank
from offload.wire.stats_frame import InvalidStatsFrame, StatsFrame, decode_stats_frame
from offload.wire.untrusted import decode

DEFAULT_MEDIUM: Final = "GPU"
"""The medium of an event that names none: vLLM's GPU prefix cache."""

EventKind = Literal["stored", "removed", "cleared"]


class DecodedEvent(msgspec.Struct, frozen=True, gc=False):
    """One event, whatever era it came from.

    ``block_hashes`` is empty for "cleared"; ``block_size`` and
    ``parent_block_hash`` are known only for "stored". ``medium`` None means
    ``DEFAULT_MEDIUM`` (the GPU). ``group``: the KV cache group whose copy of
    the blocks this is (vLLM's ``group_idx``: a hybrid model keeps one copy of
    a block per group, each stored and removed on its own, in vLLM's GPU pool
    and in kvscope's CPU tier alike); None where the publisher names none
    (one group).
    """

    kind: EventKind
    block_hashes: list[BlockHash]
    medium: str | None = None
    block_size: int | None = None
    parent_block_hash: BlockHash | None = None
    group: int | None = None


class DecodedBatch(msgspec.Struct, frozen=True, gc=False):
    """One frame's events in publish order, and how many events were skipped."""

    ts: float
    rank: int | None
    events: list[DecodedEvent]
    malformed: int = 0


# --- wire shapes ------------------------------------------------------------------
# Only the fields the sidecar reads are typed; token ids and the LoRA id stay
# undecoded Raw spans. Array-like structs ignore trailing elements past their
# last field, which is what makes every later release's extra fields harmless.


_BlockSize = Annotated[int, msgspec.Meta(ge=0, le=2**32)]
_Group = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class _ArrayStored(msgspec.Struct, array_like=True, tag="BlockStored", gc=False):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: msgspec.Raw
    block_size: _BlockSize
    lora_id: msgspec.Raw = msgspec.Raw()
    medium: Medium | None = None


class _ArrayRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved", gc=False):
    block_hashes: list[BlockHash]
    medium: Medium | None = None


class _ArrayCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared", gc=False):
    pass


class _MapStored(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    block_size: _BlockSize | None = None
    medium: Medium | None = None
    group_idx: _Group | None = None


class _MapRemoved(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: list[BlockHash]
    medium: Medium | None = None
    group_idx: _Group | None = None


class _MapCleared(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


_ArrayEvent = _ArrayStored | _ArrayRemoved | _ArrayCleared
_MapEvent = _MapStored | _MapRemoved | _MapCleared
_WireEvent = _ArrayEvent | _MapEvent


class _MapEventsBatch(msgspec.Struct, array_like=True, gc=False):
    ts: Finite
    events: list[_MapEvent]
    data_parallel_rank: Rank | None = None


class _ArrayEventsBatch(msgspec.Struct, array_like=True, gc=False):
    ts: Finite
    events: list[_ArrayEvent]
    data_parallel_rank: Rank | None = None


class _LooseBatch(Protocol):
    """The batch with its events left undecoded, to decode them one by one."""

    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None


MIN_EVENT_BYTES: Final = 15
"""The fewest bytes a well-formed event takes: ``["BlockRemoved", []]`` (an array-era removal
of no block, its medium left off)."""


@cache
def _loose_decoders(most_events: int) -> tuple[msgspec.msgpack.Decoder[Any], ...]:
    """Decoders of a ``_LooseBatch`` in the array form and the map form, refusing more than
    ``most_events`` events (a power of two: a few dozen decoders at most are ever built).

    Each undecoded event costs an object of 64 bytes whatever its own length, so
    the batch's count is checked (from its array header, before anything is
    made) against what its size allows: a 16 MB frame of one-byte events made
    16 million of them, a gigabyte, and took 90 s to skip.
    """
    fields = [
        ("ts", Finite),
        ("events", Annotated[list[msgspec.Raw], msgspec.Meta(max_length=most_events)]),
        ("data_parallel_rank", Rank | None, None),
    ]
    return tuple(
        msgspec.msgpack.Decoder(msgspec.defstruct("_LooseBatch", fields, array_like=form, gc=False))
        for form in (True, False)
    )


# Map events first: every vLLM since 0.26 and every kvscope worker send them.
_BATCH_DECODERS: Final = (
    msgspec.msgpack.Decoder(_MapEventsBatch),
    msgspec.msgpack.Decoder(_ArrayEventsBatch),
)
_ARRAY_EVENT_DECODER: Final = msgspec.msgpack.Decoder(_ArrayEvent)
_MAP_EVENT_DECODER: Final = msgspec.msgpack.Decoder(_MapEvent)
_MSGPACK_MAP_HEADERS: Final = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def decode_kv_payload(payload: bytes) -> DecodedBatch:
    """Decode one KV-event payload of any vLLM era (or kvscope's).

    Raises ``MalformedFrame`` when the payload is not a batch; skips and
    counts malformed events inside a batch (see the module doc).
    """
    for decoder in _BATCH_DECODERS:
        try:
            batch = decode(decoder, payload)
        except msgspec.DecodeError:
            continue
        return DecodedBatch(
            batch.ts, batch.data_parallel_rank, [_normalise(event) for event in batch.events]
        )
    return _decode_event_by_event(payload)


def _decode_event_by_event(payload: bytes) -> DecodedBatch:
    """The slow path: a batch whose events are not all of one era and well formed."""
    loose = _decode_loose(payload)
    events = []
    for raw in loose.events:
        event = _decode_event(raw)
        if event is not None:
            events.append(_normalise(event))
    return DecodedBatch(
        loose.ts, loose.data_parallel_rank, events, malformed=len(loose.events) - len(events)
    )


def _decode_loose(payload: bytes) -> _LooseBatch:
    """The batch with its events undecoded: at most one event per ``MIN_EVENT_BYTES`` of the
    payload, rounded up to a power of two."""
    most_events = 1 << (len(payload) // MIN_EVENT_BYTES).bit_length()
    errors: dict[str, None] = {}  # ordered and without repeats
    for decoder in _loose_decoders(most_events):
        try:
            return decode(decoder, payload)
        except msgspec.DecodeError as error:
            errors[str(error)] = None
    raise MalformedFrame(
        f"not a KV event batch ([ts, events, rank?]): {'; '.join(errors)} "
        f"({len(payload)} bytes, starting {bytes(payload[:16]).hex()})"
    )


def _decode_event(raw: msgspec.Raw) -> _WireEvent | None:
    """One event of either era, or None when it is not a known, well-formed event."""
    data = memoryview(raw)
    if len(data) < MIN_EVENT_BYTES:  # not worth an attempt (and its exception) to know
        return None
    decoder = _MAP_EVENT_DECODER if data[0] in _MSGPACK_MAP_HEADERS else _ARRAY_EVENT_DECODER
    try:
        return decode(decoder, data)
    except msgspec.DecodeError:
        return None


def _normalise(event: _WireEvent) -> DecodedEvent:
    """One wire event in the internal form (the array era predates KV cache groups)."""
    if isinstance(event, _MapStored):
        return DecodedEvent(
            "stored",
            event.block_hashes,
            event.medium,
            event.block_size,
            event.parent_block_hash,
            event.group_idx,
        )
    if isinstance(event, _ArrayStored):
        return DecodedEvent(
            "stored", event.block_hashes, event.medium, event.block_size, event.parent_block_hash
        )
    if isinstance(event, _MapRemoved):
        return DecodedEvent("removed", event.block_hashes, event.medium, group=event.group_idx)
    if isinstance(event, _ArrayRemoved):
        return DecodedEvent("removed", event.block_hashes, event.medium)
    return DecodedEvent("cleared", [])


def decode_stats_payload(payload: bytes) -> StatsFrame:
    """A stats frame the sidecar can export: the wire's checks, then the metric table's.

    A metric this kvscope defines (offload/telemetry/metrics.py) must come as
    its defined type (the exposition builds its family from the table, and a
    histogram's samples in a counter's family would break the scrape) and with
    none but its defined label names; a name it does not know (a newer
    worker's) passes as it is. Raises a ``ValueError`` (``InvalidStatsFrame``
    and the others of ``decode_stats_frame``).
    """
    frame = decode_stats_frame(payload)
    for kind, samples in (
        ("counter", frame.counters),
        ("gauge", frame.gauges),
        ("histogram", frame.histograms),
    ):
        for sample in samples:
            spec = SPECS.get(sample.name)
            if spec is not None and (
                spec.kind != kind or not sample.labels.keys() <= set(spec.labels)
            ):
                raise InvalidStatsFrame(
                    f"{sample.name} is a {spec.kind} labelled {list(spec.labels)} in the metric "
                    "table; the frame sends it otherwise"
                )
    return frame
