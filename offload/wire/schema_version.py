"""The version check every kvscope frame of its own (stats, samples) starts with.

A frame names its schema's major version in a ``version`` field; reading that
field alone first lets another major version be refused with a clear error
before the rest is checked against this release's schema (whose errors would
only say which field looked wrong).
"""

from __future__ import annotations

import msgspec

from offload.wire.untrusted import decode


class _VersionOnly(msgspec.Struct):
    version: int


_VERSION_DECODER = msgspec.msgpack.Decoder(_VersionOnly)


def check_version(payload: bytes, kind: str, supported: int, error: type[ValueError]) -> None:
    """Raise ``error`` naming both versions unless the ``kind`` frame's is ``supported``.

    ``msgspec.DecodeError`` when the payload has no integer ``version`` at all.
    """
    version = decode(_VERSION_DECODER, payload).version
    if version != supported:
        raise error(
            f"{kind} frame has schema version {version}; this kvscope reads version "
            f"{supported} only (upgrade the reader to read newer frames)"
        )
