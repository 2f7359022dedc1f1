"""The strings a peer's frames carry that become names, labels and keys on the reader's side.

A medium names a column of the block index and a key of every stats answer;
an engine id, a policy and a metric's labels become Prometheus labels. Each
came from the network, so each is bounded in length and in characters where
its bytes enter (msgspec checks these constraints while decoding), not
trusted until something downstream chokes on a megabyte of it. Writers are
not checked: kvscope's own values are well inside these bounds.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

IDENT_CHARS: Final = r"A-Za-z0-9._:/@+=-"
"""Letters, digits and ``._:/@+=-``: every medium, engine id and policy name in use, and
nothing a terminal, a log line or a Prometheus label would treat specially."""

MAX_MEDIUM_CHARS: Final = 32
MAX_IDENT_CHARS: Final = 128
MAX_LABEL_VALUE_CHARS: Final = 128
MAX_METRIC_NAME_CHARS: Final = 128
MAX_LABEL_NAME_CHARS: Final = 64
MAX_HASH_BYTES: Final = 64
"""Longest bytes block hash read: vLLM's are 32-byte sha256 digests (older ones 8 or 16)."""

Medium = Annotated[str, msgspec.Meta(max_length=MAX_MEDIUM_CHARS, pattern=f"^[{IDENT_CHARS}]*\\Z")]
"""A storage medium (``"CPU"``, ``"GPU"``); empty means the GPU, as nil does."""

Ident = Annotated[str, msgspec.Meta(max_length=MAX_IDENT_CHARS, pattern=f"^[{IDENT_CHARS}]*\\Z")]
"""An engine id or a policy name. Empty is allowed: a stats frame's engine id names its
listen-mode stream, and vLLM's default topic is empty."""

LabelValue = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_VALUE_CHARS, pattern=r"^[ -~]*\Z")]
"""A metric label's value: printable ASCII."""

MetricName = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=MAX_METRIC_NAME_CHARS, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*\Z"
    ),
]
"""A Prometheus metric name."""

LabelName = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=MAX_LABEL_NAME_CHARS, pattern=r"^(?!__)[a-zA-Z_][a-zA-Z0-9_]*\Z"
    ),
]
"""A Prometheus label name (names starting ``__`` are Prometheus's own)."""

BlockHash = int | Annotated[bytes, msgspec.Meta(min_length=1, max_length=MAX_HASH_BYTES)]
"""A block hash as read: an int (msgpack's are 64-bit at most) or 1 to 64 bytes. Empty bytes
digest nothing, and the sidecar's API names a bytes hash ``0x`` and its hex, which for none
would be a name it refuses: a block it listed that no lookup could fetch."""

Rank = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
"""A data-parallel or worker rank."""

Finite = Annotated[float, msgspec.Meta(ge=-1.7976931348623157e308, le=1.7976931348623157e308)]
"""A float that is neither NaN nor infinite (JSON and the API's schemas have neither)."""
