"""Decoding msgpack from the network, where every way the bytes can be wrong is a ValueError.

msgspec walks nested arrays and maps recursively, also the ones it skips (an
unknown field's value, a ``Raw`` span), so a few kilobytes of arrays nested in
one another raise ``RecursionError``. That is no ``ValueError``: a reader that
counts and skips frames that fail to decode would let it through, and the
thread reading for every publisher would stop.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

T = TypeVar("T")


def decode(decoder: msgspec.msgpack.Decoder[T], payload: bytes | memoryview) -> T:
    """``decoder.decode(payload)``; nesting deeper than the interpreter allows, and a string
    that is no UTF-8 (msgspec raises ``UnicodeDecodeError`` for it, which its callers took for
    a bug, not a malformed frame: a batch with one such event was lost whole), are a
    ``msgspec.DecodeError`` like any other malformed payload."""
    try:
        return decoder.decode(payload)
    except RecursionError:
        raise msgspec.DecodeError("msgpack nested too deeply") from None
    except UnicodeDecodeError:
        raise msgspec.DecodeError("a string that is not UTF-8") from None
