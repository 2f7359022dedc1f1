"""The worker's per-request hold of the sample: one call per request, bounded in bytes.

``SampleBuffer`` (sample_buffer.py) frames what a recorder holds; the
recorder is the part the scheduler's thread pays on every request: it calls
the sampler's test on the request's hashes, keeps the sampled ones with the
request's block count, counts the requests none of whose blocks was
sampled, and sheds a request whole (its blocks and its count) when it would
overflow the bytes, the requests or the blocks per request a frame may hold.
``due`` says a frame should be taken: its period passed, or the hold is half
full.

A Python function call on that thread costs several times the work it wraps
(the interpreter's frame, and each attribute it reads), so the form in use
is C (``_sample_recorder.c``, built by ``pip install`` where a C compiler
is): the recorder itself is what the worker calls, the test is called from
C, and the block counts sit in a C array. ``PySampleRecorder`` keeps the
same contract where kvscope was installed without a compiler; tests hold
both forms to the same sequences.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Final

from offload.base import BlockHash

INT_HASH_BYTES: Final = 9
"""The most bytes msgpack spends on an int hash: what a held int hash is counted as."""

Sampling = Callable[[Sequence[BlockHash]], list[BlockHash]]
"""The sampler's test: one request's hashes -> the sampled ones, in order (a new list)."""
Drained = tuple[list[int], list[list[BlockHash]], int, int]
"""What ``drain`` hands over: the held requests' block counts and sampled hashes (parallel
lists), and the requests and block references of the requests with nothing sampled."""


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


def _priced(sampled: Sequence[BlockHash]) -> int:
    """About what the hashes take in a frame: ints by count, bytes by size (msgpack: + 2);
    a TypeError naming another type, or a mix of the two (a frame may carry neither)."""
    kinds = set(map(type, sampled))
    if kinds <= _INT:
        return INT_HASH_BYTES * len(sampled)
    if all(issubclass(kind, _BYTES) for kind in kinds):
        return sum(map(len, sampled)) + 2 * len(sampled)  # type: ignore[arg-type]
    first = type(sampled[0])
    if first is int:
        odd = next(type(h) for h in sampled if type(h) is not int)
    else:
        odd = next(type(h) for h in sampled if not isinstance(h, _BYTES))
    raise TypeError(
        "a request's sampled hashes must be all ints or all bytes: "
        f"found {odd.__name__} in a request of {first.__name__}"
    )


class PySampleRecorder:
    """The recorder in Python: called with one request's hashes, it holds their sample."""

    __slots__ = (
        "_next",
        "_refs",
        "_sampled",
        "_unsampled_block_refs",
        "_unsampled_requests",
        "bytes",
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
        self.bytes = 0
        self.shed_requests = 0
        self.shed_block_refs = 0
        self._refs: list[int] = []
        self._sampled: list[list[BlockHash]] = []
        self._unsampled_requests = 0
        self._unsampled_block_refs = 0
        self._next = time.monotonic() + self.period_s

    def __call__(self, block_hashes: Sequence[BlockHash]) -> None:
        """One request's references to the tier, in prompt order."""
        sampled = self.sample(block_hashes)
        refs = len(block_hashes)
        if not sampled:
            if refs:
                self._unsampled_requests += 1
                self._unsampled_block_refs += refs
            return
        size = _priced(sampled)
        if (
            refs > self.max_request_blocks
            or self.bytes + size > self.max_bytes
            or len(self._sampled) >= self.max_requests
        ):
            self.shed_requests += 1
            self.shed_block_refs += refs
            return
        self._refs.append(refs)
        self._sampled.append(sampled)
        self.bytes += size

    def due(self) -> bool:
        """A frame is due: its period passed, or the hold is half full."""
        return (
            time.monotonic() >= self._next
            or 2 * self.bytes >= self.max_bytes
            or 2 * len(self._sampled) >= self.max_requests
        )

    def drain(self) -> Drained:
        """Everything held, and start over (the period too)."""
        held = (self._refs, self._sampled, self._unsampled_requests, self._unsampled_block_refs)
        self._refs, self._sampled = [], []
        self._unsampled_requests = self._unsampled_block_refs = self.bytes = 0
        self._next = time.monotonic() + self.period_s
        return held


try:
    from offload.wire._sample_recorder import SampleRecorder
except ImportError:  # installed without a C compiler
    SampleRecorder = PySampleRecorder  # type: ignore[misc,assignment]
