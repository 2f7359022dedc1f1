"""How frames are laid out on the ZMQ sockets: topics, sequence numbers, replay.

One definition that the publisher (worker side) and the sidecar's subscriber
both import, so the two sides cannot drift. docs/PROTOCOL.md describes the
whole exchange.
"""

from __future__ import annotations

from typing import Final

DEFAULT_KV_TOPIC: Final = b""
"""vLLM's default ZMQ topic for KV events (its ``topic`` setting defaults to "")."""

DEFAULT_STATS_TOPIC: Final = b"kvscope.stats"
"""The ZMQ topic stats frames travel on unless configured otherwise."""

DEFAULT_SAMPLE_TOPIC: Final = b"kvscope.sample"
"""The ZMQ topic sampled access streams (offload/wire/sample_frame.py) travel on.
Neither it nor the stats topic is a prefix of the other, so a subscriber of one
never receives the other."""

SEQ_BYTES: Final = 8
"""A sequence number frame: 8 bytes, big-endian."""

END_OF_REPLAY_SEQ: Final = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
"""The sequence frame that ends every replay answer (-1, as vLLM writes it)."""

MAX_SEQ: Final = 2**63 - 1
"""The largest sequence number a batch or stats frame may carry."""


class MalformedFrame(ValueError):
    """A frame that breaks the wire format; the message says how."""


def encode_seq(seq: int) -> bytes:
    """The sequence frame of a batch or stats frame."""
    return seq.to_bytes(SEQ_BYTES, "big")


def decode_seq(frame: bytes) -> int:
    """The sequence number of a batch or stats frame: unsigned, as vLLM encodes it.

    At most ``MAX_SEQ``: a counter from 0 never gets further, and the top
    half of the range holds the replay socket's end marker (all ones),
    which callers compare as bytes before decoding.
    """
    if len(frame) != SEQ_BYTES:
        raise MalformedFrame(f"sequence frame must be {SEQ_BYTES} bytes, got {len(frame)}")
    seq = int.from_bytes(frame, "big")
    if seq > MAX_SEQ:
        raise MalformedFrame(f"sequence number {seq} is above {MAX_SEQ}")
    return seq


def replay_request(start: int) -> list[bytes]:
    """What a DEALER sends to ask for every buffered batch from ``start`` on."""
    return [b"", encode_seq(start)]


def parse_replay_request(frames: list[bytes]) -> int | None:
    """The first sequence a ROUTER-received request asks for, or None if malformed.

    The ROUTER sees ``[identity, b"", seq]``; anything else is malformed.
    """
    if len(frames) == 3 and frames[1] == b"" and len(frames[2]) == SEQ_BYTES:
        return int.from_bytes(frames[2], "big")
    return None
