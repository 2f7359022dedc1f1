"""The worker's per-request hold of the sample: one call per request, bounded in bytes.

``SampleBuffer`` (sample_buffer.py) frames what a recorder holds; the
recorder is the part the scheduler's thread pays on every request: it calls
the sampler's test on the request's hashes, writes the sampled ones with the
request's block count as msgpack (``[block_refs, [hash, ...]]``, the form
a frame carries them in), counts the requests none of whose blocks was
sampled, and sheds a request whole (its blocks and its count) when it would
overflow the bytes, the requests or the blocks per request a frame may hold.
``due`` says a frame should be taken: its period passed, or the hold is half
full. Holding bytes, not objects, leaves nothing for the garbage collector
to walk while a frame waits, and nothing to build or encode when it leaves.

A Python function call on that thread costs several times the work it wraps
(the interpreter's frame, and each attribute it reads), so the form in use
is C (``_sample_recorder.c``, built by ``pip install`` where a C compiler
is): the recorder itself is what the worker calls, the test is called from
C (through its C selection, with no list between the two, when the test
offers one: ``offload/sample_select.h``), and the msgpack is written in C.
``PySampleRecorder`` keeps the same contract, byte for byte, where kvscope
was installed without a compiler; tests hold both forms to the same
sequences.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from offload.base import BlockHash

Sampling = Callable[[Sequence[BlockHash]], list[BlockHash]]
"""The sampler's test: one request's hashes -> the sampled ones, in order (a new list)."""
Drained = tuple[bytes, int, int, int]
"""What ``drain`` hands over: the held requests as one msgpack array of ``[block_refs,
[hash, ...]]``, their count, and the requests and block references of the requests with
nothing sampled."""
TOO_WIDE: Final = "a block hash must be an int from -2**63 to 2**64 - 1 to be framed"
"""The OverflowError's message for an int hash msgpack cannot carry."""


def check_limits(
    max_bytes: int, max_requests: int, max_request_blocks: int, period_s: float
) -> None:
    """A ValueError naming the first limit that is not usable."""
    for name, value in (
        ("max_bytes", max_bytes),
        ("max_requests", max_requests),
        ("max_request_blocks", max_request_blocks),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
    if isinstance(period_s, bool) or not isinstance(period_s, int | float):
        raise ValueError(f"period_s must be a positive number of seconds, got {period_s!r}")
    if not (math.isfinite(period_s) and period_s > 0):
        raise ValueError(f"period_s must be a positive number of seconds, got {period_s!r}")


_INT: Final = frozenset({int})
_BYTES: Final = (bytes, bytearray)


def _check_one_type(sampled: Sequence[BlockHash]) -> None:
    """A TypeError naming a hash that is neither an int nor bytes, or a mix of the two (a
    frame may carry neither)."""
    kinds = set(map(type, sampled))
    if kinds <= _INT or all(issubclass(kind, _BYTES) for kind in kinds):
        return
    first = type(sampled[0])
    if first is int:
        odd = next(type(h) for h in sampled if type(h) is not int)
    else:
        odd = next(type(h) for h in sampled if not isinstance(h, _BYTES))
    raise TypeError(
        "a request's sampled hashes must be all ints or all bytes: "
        f"found {odd.__name__} in a request of {first.__name__}"
    )


def _plain_bytes(value: object) -> bytes:
    """A bytes subclass's instance as plain bytes (msgspec encodes only bytes and bytearray)."""
    if isinstance(value, _BYTES):
        return bytes(value)
    raise TypeError(f"cannot frame a block hash of type {type(value).__name__}")


_ENCODE: Final = msgspec.msgpack.Encoder(enc_hook=_plain_bytes).encode


def _array_header(length: int) -> bytes:
    """The msgpack header of an array of ``length`` items (fixarray, array16 or array32)."""
    if length < 16:
        return bytes([0x90 | length])
    if length < 2**16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


class PySampleRecorder:
    """The recorder in Python: called with one request's hashes, it holds their sample."""

    __slots__ = (
        "_held",
        "_next",
        "_requests",
        "_unsampled_block_refs",
        "_unsampled_requests",
        "max_bytes",
        "max_request_blocks",
        "max_requests",
        "period_s",
        "sample",
        "shed_block_refs",
        "shed_requests",
    )

    def __init__(
        self,
        sample: Sampling,
        max_bytes: int,
        max_requests: int,
        max_request_blocks: int,
        period_s: float,
    ) -> None:
        check_limits(max_bytes, max_requests, max_request_blocks, period_s)
        self.sample = sample
        self.max_bytes = max_bytes
        self.max_requests = max_requests
        self.max_request_blocks = max_request_blocks
        self.period_s = float(period_s)
        self.shed_requests = 0
        self.shed_block_refs = 0
        self._held = bytearray()
        self._requests = 0
        self._unsampled_requests = 0
        self._unsampled_block_refs = 0
        self._next = time.monotonic() + self.period_s

    @property
    def bytes(self) -> int:
        """Bytes of msgpack held."""
        return len(self._held)

    @property
    def selects_in_c(self) -> bool:
        """The C form's choice; this form always calls the test."""
        return False

    def __call__(self, block_hashes: Sequence[BlockHash]) -> None:
        """One request's references to the tier, in prompt order."""
        sampled = self.sample(block_hashes)
        refs = len(block_hashes)
        if not sampled:
            if refs:
                self._unsampled_requests += 1
                self._unsampled_block_refs += refs
            return
        _check_one_type(sampled)
        try:
            request = _ENCODE((refs, sampled))
        except OverflowError:
            raise OverflowError(TOO_WIDE) from None
        if (
            refs > self.max_request_blocks
            or len(self._held) + len(request) > self.max_bytes
            or self._requests >= self.max_requests
        ):
            self.shed_requests += 1
            self.shed_block_refs += refs
            return
        self._held += request
        self._requests += 1

    def due(self) -> bool:
        """A frame is due: its period passed, or the hold is half full."""
        return (
            time.monotonic() >= self._next
            or 2 * len(self._held) >= self.max_bytes
            or 2 * self._requests >= self.max_requests
        )

    def drain(self) -> Drained:
        """Everything held, and start over (the period too)."""
        held = (
            _array_header(self._requests) + self._held,
            self._requests,
            self._unsampled_requests,
            self._unsampled_block_refs,
        )
        self._held = bytearray()
        self._requests = self._unsampled_requests = self._unsampled_block_refs = 0
        self._next = time.monotonic() + self.period_s
        return held


try:
    from offload.wire._sample_recorder import SampleRecorder
except ImportError:  # installed without a C compiler
    SampleRecorder = PySampleRecorder  # type: ignore[misc,assignment]
