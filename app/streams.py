"""How the sidecar tells apart the publishers that connect to its listen socket.

Many publishers share one bound SUB socket, and a SUB socket never says which
peer sent a message. What a message does say is its topic and, inside its
payload, a rank: vLLM stamps every KV batch with its ``data_parallel_rank``,
and a kvscope stats frame carries its ``engine_id`` and ``rank``. A listen-mode
publisher is therefore a *stream*, keyed by (topic, rank): one per engine (each
with its own topic) and data-parallel rank. A stats frame belongs to the stream
(engine id, rank), so a kvscope worker whose KV topic is its engine id and
whose batches carry its rank shows as one publisher. docs/PROTOCOL.md gives the
rules; nothing on the wire changes.

A stream's name (``TOPIC@RANK``) is how it is shown (/api/v1/stats, metric
labels) and how ``--listen-replay`` names it. Topics come from the network, so
a name is built to be safe to print: a topic of plain characters as it is,
any other as ``hex:`` and its bytes in hex, and a topic longer than
``MAX_TOPIC_BYTES`` is refused. Every (topic, rank) has exactly one name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal

from offload.shown import shown_repr
from offload.wire.endpoints import Family

MAX_TOPIC_BYTES: Final = 128
"""Longest topic (or engine id) that names a stream; a longer one is a malformed frame."""

_PLAIN_TOPIC: Final = re.compile(rb"[A-Za-z0-9._/-]*")
"""Topics shown as they are: no separator of a name (``@``, ``=``, ``:``) and nothing
a terminal or a Prometheus label would treat specially."""

_HEX_PREFIX: Final = "hex:"
_RANK: Final = re.compile(r"-?[0-9]{1,20}")
_NO_RANK: Final = "-"
_NAME_FORM: Final = (
    "expected TOPIC@RANK, e.g. vllm-gpu@0 (@0 for vLLM's default empty topic, TOPIC@- for "
    "batches that carry no rank, hex:HEX@RANK for a topic of other bytes)"
)


def stream_name(topic: bytes, rank: int | None) -> str:
    """The one name of stream (topic, rank); ``ValueError`` if the topic is too long."""
    if len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic of {len(topic)} bytes; a stream's is at most {MAX_TOPIC_BYTES}")
    text = topic.decode("ascii") if _PLAIN_TOPIC.fullmatch(topic) else _HEX_PREFIX + topic.hex()
    return f"{text}@{_NO_RANK if rank is None else rank}"


def parse_stream_name(name: str) -> tuple[bytes, int | None]:
    """The (topic, rank) a stream name stands for; ``ValueError`` saying why it stands for none."""
    text, separator, rank_text = name.rpartition("@")
    if not separator or not (rank_text == _NO_RANK or _RANK.fullmatch(rank_text)):
        raise ValueError(f"{shown_repr(name)} is not a stream name: {_NAME_FORM}")
    rank = None if rank_text == _NO_RANK else int(rank_text)
    if text.startswith(_HEX_PREFIX):
        try:
            topic = bytes.fromhex(text.removeprefix(_HEX_PREFIX))
        except ValueError:
            raise ValueError(
                f"{shown_repr(name)} is not a stream name: bad hex after 'hex:'"
            ) from None
    else:
        topic = text.encode()
    canonical = stream_name(topic, rank)
    if canonical != name:
        raise ValueError(
            f"{shown_repr(name)} names stream {shown_repr(canonical)}; write it that way"
        )
    return topic, rank


@dataclass(frozen=True, slots=True)
class ListenStream:
    """A publisher met on the listen socket: its stream and, if declared, its replay socket."""

    topic: bytes
    rank: int | None
    replay_endpoint: str | None = None
    replay_family: Family | None = None
    """The address family ``replay_endpoint``'s host resolved to as the settings were read
    (``resolved_families``; None: none then), so that a replay sets its socket's IPv6 option
    without looking the name up again."""
    name: str = field(init=False)
    """``TOPIC@RANK``, computed once: it labels every batch the stream sends."""

    mode: ClassVar[Literal["listen"]] = "listen"

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", stream_name(self.topic, self.rank))

    @property
    def key(self) -> tuple[bytes, int | None]:
        return self.topic, self.rank
