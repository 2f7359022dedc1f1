"""The sidecar's KV-event decoder against frames of every vLLM era, and broken ones.

Array-era frames (vLLM before 0.26) are built by hand as plain lists, the way
msgspec's ``array_like`` tagged structs put them on the wire: the tag first,
then the fields in declaration order, trailing defaults left off. Map-era
frames come from kvscope's own schema (vLLM 0.33's) and from plain dicts, to
cover omitted defaults and unknown keys.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.decode import (
    DEFAULT_MEDIUM,
    MIN_EVENT_BYTES,
    DecodedBatch,
    DecodedEvent,
    decode_kv_payload,
)
from offload.base import OffloadingEvent
from offload.wire.framing import MalformedFrame, decode_seq
from offload.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    encode_batch,
    to_kv_events,
)

INT_HASHES = [7, -3, 2**63 - 1]
BYTES_HASHES = [bytes([n]) * 32 for n in (1, 2, 3)]
HASH_SETS = pytest.mark.parametrize("hashes", [INT_HASHES, BYTES_HASHES], ids=["int", "bytes"])


def encode(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


def stored(hashes: list, medium: str | None = None, parent: Any = None) -> DecodedEvent:
    return DecodedEvent("stored", hashes, medium, 16, parent)


# --- map era (vLLM >= 0.26, kvscope) ----------------------------------------------


@HASH_SETS
def test_map_era_from_kvscope_schema(hashes: list) -> None:
    batch = KVEventBatch(
        ts=12.5,
        events=[
            BlockStored(hashes, hashes[0], [1, 2], 16, None, "CPU", None),
            BlockRemoved(hashes[:1], "CPU"),
            AllBlocksCleared(),
        ],
        data_parallel_rank=3,
    )
    assert decode_kv_payload(encode_batch(batch)) == DecodedBatch(
        12.5,
        3,
        [
            stored(hashes, "CPU", hashes[0]),
            DecodedEvent("removed", hashes[:1], "CPU"),
            DecodedEvent("cleared", []),
        ],
    )


def test_map_era_omitted_defaults_mean_gpu_and_unknown() -> None:
    events = [
        {"type": "BlockStored", "block_hashes": [1, 2]},
        {"type": "BlockRemoved", "block_hashes": [1]},
    ]
    batch = decode_kv_payload(encode([1.0, events]))
    assert batch.rank is None
    assert batch.events == [
        DecodedEvent("stored", [1, 2]),
        DecodedEvent("removed", [1]),
    ]
    assert all(event.medium is None for event in batch.events)
    assert DEFAULT_MEDIUM == "GPU"


def test_map_era_unknown_keys_are_ignored() -> None:
    event = {
        "type": "BlockStored",
        "block_hashes": [b"h"],
        "block_size": 32,
        "medium": "CPU",
        "a_field_from_the_future": {"nested": [1, 2]},
        "session_id": "s1",
    }
    assert decode_kv_payload(encode([2.0, [event], 0])).events == [
        DecodedEvent("stored", [b"h"], "CPU", 32)
    ]


def test_kvscope_publisher_events_round_trip() -> None:
    offloading = [
        OffloadingEvent([1, 2, 3], 64, "CPU", False),
        OffloadingEvent([2], 64, "CPU", True),
        OffloadingEvent([7, 8], 64, "CPU", False, parent_block_hash=3),
    ]
    payload = encode_batch(KVEventBatch(ts=0.0, events=to_kv_events(offloading)))
    assert decode_kv_payload(payload).events == [
        DecodedEvent("stored", [1, 2, 3], "CPU", 64),
        DecodedEvent("removed", [2], "CPU"),
        DecodedEvent("stored", [7, 8], "CPU", 64, parent_block_hash=3),
    ]


def test_batch_encoded_as_a_map_is_read() -> None:
    payload = encode({"ts": 4.0, "events": [["BlockRemoved", [9]]], "data_parallel_rank": 1})
    assert decode_kv_payload(payload) == DecodedBatch(4.0, 1, [DecodedEvent("removed", [9])])


def test_map_era_events_name_their_kv_cache_group() -> None:
    """A hybrid model's copies of one block, one per group, are told apart by group_idx."""
    events = [
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
         "token_ids": [], "block_size": 16, "lora_id": None, "medium": None, "group_idx": 1},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": None, "group_idx": 0},
    ]  # fmt: skip
    batch = decode_kv_payload(encode([1.0, events]))
    assert batch.events == [
        DecodedEvent("stored", [1], None, 16, None, group=1),
        DecodedEvent("removed", [1], None, group=0),
    ]


@pytest.mark.parametrize("group", [-1, 2**31, 1.5, "0", [0]], ids=repr)
def test_a_group_that_is_no_group_index_makes_its_event_malformed(group: Any) -> None:
    event = {"type": "BlockRemoved", "block_hashes": [1], "medium": None, "group_idx": group}
    batch = decode_kv_payload(encode([1.0, [event, ["BlockRemoved", [2]]]]))
    assert (batch.events, batch.malformed) == ([DecodedEvent("removed", [2])], 1)


# --- array era (vLLM < 0.26) ------------------------------------------------------

STORED_TAILS = {
    # fields after lora_id, as successive releases appended them
    "original": [],
    "medium": ["CPU"],
    "lora_name": ["CPU", "my-lora"],
    "extra_keys": ["CPU", None, [["mm", 0], None, None]],
    "group_idx": ["CPU", None, None, 2, "full_attention", None],
    "future": ["CPU", None, None, 2, None, None, "x", {"y": 1}, [1, 2]],
}


@HASH_SETS
@pytest.mark.parametrize("tail", STORED_TAILS.values(), ids=STORED_TAILS.keys())
def test_array_era_stored_with_any_trailing_fields(hashes: list, tail: list) -> None:
    event = ["BlockStored", hashes, hashes[-1], list(range(32)), 16, 5, *tail]
    (decoded,) = decode_kv_payload(encode([1.0, [event], 0])).events
    assert decoded == stored(hashes, tail[0] if tail else None, hashes[-1])


@HASH_SETS
@pytest.mark.parametrize("tail", [[], ["CPU"], ["CPU", 1], ["CPU", 1, "LOCAL", None, "more"]])
def test_array_era_removed_with_any_trailing_fields(hashes: list, tail: list) -> None:
    (decoded,) = decode_kv_payload(encode([1.0, [["BlockRemoved", hashes, *tail]]])).events
    assert decoded == DecodedEvent("removed", hashes, tail[0] if tail else None)


def test_array_era_cleared_and_rank() -> None:
    assert decode_kv_payload(encode([3.0, [["AllBlocksCleared"]], 7])) == DecodedBatch(
        3.0, 7, [DecodedEvent("cleared", [])]
    )


def test_mixed_eras_in_one_batch_keep_their_order() -> None:
    events = [
        ["BlockStored", [1], None, [], 16, None, "CPU"],
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU"},
        ["AllBlocksCleared"],
    ]
    batch = decode_kv_payload(encode([1.0, events]))
    assert [event.kind for event in batch.events] == ["stored", "removed", "cleared"]
    assert batch.malformed == 0


# --- malformed input --------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_event",
    [
        ["BlockEvicted", [1]],
        {"type": "Unheard", "block_hashes": [1]},
        {"block_hashes": [1]},
        ["BlockStored", "not-a-list", None, [], 16],
        ["BlockStored", [1]],
        ["BlockRemoved", [1.5]],
        [],
        5,
        "BlockStored",
    ],
    ids=repr,
)
def test_a_malformed_event_is_skipped_and_counted(bad_event: Any) -> None:
    events = [["BlockRemoved", [1]], bad_event, {"type": "BlockRemoved", "block_hashes": [2]}]
    batch = decode_kv_payload(encode([1.0, events, 0]))
    assert batch.events == [DecodedEvent("removed", [1]), DecodedEvent("removed", [2])]
    assert batch.malformed == 1
    assert batch.rank == 0


@pytest.mark.parametrize(
    "medium", ["GPU", {"type": "BlockStored", "block_hashes": [3], "medium": "GPU"}], ids=repr
)
def test_an_event_with_a_string_that_is_no_utf8_is_skipped_and_counted(medium: Any) -> None:
    """msgspec raises ``UnicodeDecodeError`` for it, not a ``DecodeError``: the batch was lost
    whole, its good events with it, counted as one malformed frame."""
    bad = ["BlockStored", [3], None, [], 16, None, "GPU"] if medium == "GPU" else medium
    events = [["BlockRemoved", [1]], bad, {"type": "BlockRemoved", "block_hashes": [2]}]
    payload = encode([1.0, events, 0]).replace(b"GPU", b"\xff\xfeU")
    batch = decode_kv_payload(payload)
    assert batch.events == [DecodedEvent("removed", [1]), DecodedEvent("removed", [2])]
    assert batch.malformed == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        b"not msgpack at all",
        encode(5),
        encode([1.0]),
        encode(["yesterday", []]),
        encode([1.0, "events"]),
        encode([1.0, [], "rank"]),
        encode({"events": []}),
        encode([1.0, []])[:-1] + b"\x91",
    ],
    ids=repr,
)
def test_a_payload_that_is_not_a_batch_raises(payload: bytes) -> None:
    with pytest.raises(MalformedFrame, match="not a KV event batch"):
        decode_kv_payload(payload)


def test_the_smallest_well_formed_events_are_read_beside_a_bad_one() -> None:
    """One event per ``MIN_EVENT_BYTES`` of payload is what the event-by-event decoder allows."""
    smallest = ["BlockRemoved", []]
    assert len(encode(smallest)) == MIN_EVENT_BYTES
    batch = decode_kv_payload(encode([1, [smallest] * 100 + [5]]))
    assert (batch.events, batch.malformed) == ([DecodedEvent("removed", [])] * 100, 1)


@pytest.mark.parametrize("element", [5, [], {}, None, "ABCDEF"], ids=repr)
def test_a_batch_of_more_elements_than_well_formed_events_fit_in_is_no_batch(
    element: Any,
) -> None:
    """Each element the event-by-event decoder holds costs an object of 64 bytes: a 16 MB
    frame of one-byte elements took a gigabyte and 90 s before, and was a batch."""
    payload = encode([1.0, [element] * 2**16])
    tracemalloc.start()
    try:
        with pytest.raises(MalformedFrame, match="not a KV event batch"):
            decode_kv_payload(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(payload)  # 64 bytes an element before


def test_malformed_frame_is_a_value_error() -> None:
    assert issubclass(MalformedFrame, ValueError)


# --- sequence numbers -------------------------------------------------------------


@pytest.mark.parametrize("seq", [0, 1, 2**40, 2**63 - 1])
def test_decode_seq(seq: int) -> None:
    assert decode_seq(seq.to_bytes(8, "big")) == seq


@pytest.mark.parametrize("seq", [2**63, 2**64 - 1])
def test_decode_seq_refuses_the_top_half_where_negatives_and_the_end_marker_live(seq: int) -> None:
    """Unsigned as vLLM writes them: (-5) signed is 2**64 - 5, no batch's number."""
    with pytest.raises(MalformedFrame, match="above"):
        decode_seq(seq.to_bytes(8, "big"))


@pytest.mark.parametrize("frame", [b"", b"\x00" * 7, b"\x00" * 9])
def test_decode_seq_refuses_other_lengths(frame: bytes) -> None:
    with pytest.raises(MalformedFrame, match="8 bytes"):
        decode_seq(frame)


# --- property: both eras say the same thing ----------------------------------------

block_hash = st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(min_size=1, max_size=32))
medium = st.sampled_from([None, "GPU", "CPU"])
event = st.one_of(
    st.tuples(st.just("stored"), st.lists(block_hash, max_size=4), medium, block_hash),
    st.tuples(st.just("removed"), st.lists(block_hash, max_size=4), medium, st.none()),
    st.tuples(st.just("cleared"), st.just([]), st.none(), st.none()),
)


def array_form(kind: str, hashes: list, where: str | None, parent: Any) -> list:
    if kind == "stored":
        return ["BlockStored", hashes, parent, [], 16, None, where]
    return ["BlockRemoved", hashes, where] if kind == "removed" else ["AllBlocksCleared"]


def map_form(kind: str, hashes: list, where: str | None, parent: Any) -> Any:
    if kind == "stored":
        return BlockStored(hashes, parent, [], 16, None, where, None)
    return BlockRemoved(hashes, where) if kind == "removed" else AllBlocksCleared()


@given(
    st.lists(event, max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none() | st.integers(0, 8),
)
def test_both_eras_decode_to_the_same_events(events: list, ts: float, rank: int | None) -> None:
    expected = [
        DecodedEvent(kind, hashes, where, 16 if kind == "stored" else None, parent)
        for kind, hashes, where, parent in events
    ]
    array_payload = encode([ts, [array_form(*e) for e in events], rank])
    map_payload = encode_batch(KVEventBatch(ts, [map_form(*e) for e in events], rank))
    for payload in (array_payload, map_payload):
        assert decode_kv_payload(payload) == DecodedBatch(ts, rank, expected)
