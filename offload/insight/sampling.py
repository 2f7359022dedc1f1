"""The spatial sample of block references: a block is in it or out for good.

SHARDS (Waldspurger et al., FAST'15) samples by the key, not by the
reference: a block whose hash passes the test is followed at every one of
its uses, so the sample is a smaller cache's whole workload, and a tier
``rate`` times the size sees, on it, what the real tier sees on the full
stream. A per-reference coin flip would break every reuse it lands on.

The test is one multiply and one remainder by a prime below 2**30
(multiplicative hashing): trace ids are small sequential ints, and the
multiply spreads them over the residues. A bytes hash (vLLM's) stands as
the int of its first 8 bytes, little-endian.

The worker pays the test on every block reference of its hot path, so the
form in use is C (``_sample_test.c``, built by ``pip install`` where a C
compiler is), which the worker calls directly once per request. Where
kvscope was installed without a compiler (the sidecar image, which only
narrows samples already taken), ``PySampleTest`` gives the same hashes: the
request's types checked in one C-level pass, then one list comprehension,
bytes hashes read by one precompiled ``struct`` call (C-level ``map``
chains, a helper function per hash, or a slice and ``int.from_bytes``
measured slower).

Hash 0 is a fixed point of the multiply, so it is kept at every seed; the
estimator's correction (estimator.py) makes one block in or out of the sample
harmless.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Final

from offload.base import BlockHash

PRIME = 1_073_741_789
"""The largest prime below 2**30: residues 0..PRIME-1; ``threshold / PRIME`` is the rate."""
_FIRST_8 = struct.Struct("<Q").unpack_from
"""A bytes hash's first 8 bytes as a little-endian int (a 1-tuple); struct.error when shorter."""
DEFAULT_RATE = 0.05
"""One block in twenty: the lowest rate measured to keep the curve within 2 points of
the exact sweep at every capacity and seed (bench/insight_accuracy.py)."""


def _multiplier(seed: int) -> int:
    """PRIME times a noble number picked by the seed.

    Consecutive ids land ``multiplier / PRIME`` apart modulo 1, so a ratio
    near a simple fraction keeps or drops runs of neighbouring ids (one
    chain's blocks, in a trace). The continued fraction [0; d1, d2, ..., 1,
    1, 1, ...] with the seed's base-4 digits (plus two) in front of the
    golden ratio's keeps every partial quotient at most 5, so no seed falls
    near a simple fraction, and distinct seeds give distinct ratios. Seed 0
    is the golden ratio itself.
    """
    if seed < 0:
        raise ValueError(f"sampling seed must be >= 0, got {seed}")
    ratio = (math.sqrt(5) - 1) / 2  # [0; 1, 1, 1, ...]
    while seed:
        seed, digit = divmod(seed, 4)
        ratio = 1 / (digit + 2 + ratio)
    return min(PRIME - 1, max(1, round(ratio * PRIME)))


def check_rate(rate: float) -> float:
    """The rate as a float in (0, 1], or a ValueError naming it."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
        raise ValueError(f"sampling rate must be a number in (0, 1], got {rate!r}")
    if not 0 < rate <= 1:
        raise ValueError(f"sampling rate must be in (0, 1], got {rate}")
    return float(rate)


def _int_key(block_hash: BlockHash) -> int:
    """An int standing for the hash: ints as they are, bytes by their first 8 bytes.

    vLLM's hashes are digests, already uniform; their first bytes are as good
    as all of them and cost one small int.
    """
    if type(block_hash) is int:
        return block_hash
    if isinstance(block_hash, bytes | bytearray):
        return int.from_bytes(block_hash[:8], "little")
    raise _unsupported(block_hash)


_INT: Final = frozenset({int})
_BYTES: Final = (bytes, bytearray)


def _unsupported(block_hash: object) -> TypeError:
    return TypeError(f"cannot sample a block hash of type {type(block_hash).__name__}")


class PySampleTest:
    """The test in Python: called with one request's hashes, it returns those whose int
    times ``multiplier``, modulo ``prime``, is below ``threshold``, in order."""

    __slots__ = ("multiplier", "prime", "threshold")

    def __init__(self, multiplier: int, threshold: int, prime: int) -> None:
        self.multiplier = multiplier
        self.threshold = threshold
        self.prime = prime

    def __call__(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        k, threshold, prime = self.multiplier, self.threshold, self.prime
        # The types first, in one C-level pass: a str among ints would otherwise be
        # repeated k times by the multiply (gigabytes) before anything failed.
        kinds = set(map(type, block_hashes))
        if kinds <= _INT:
            return [h for h in block_hashes if h * k % prime < threshold]
        odd = {kind for kind in kinds if kind is not int and not issubclass(kind, _BYTES)}
        if odd:
            raise _unsupported(next(h for h in block_hashes if type(h) in odd))
        if int not in kinds:
            first_8 = _FIRST_8
            try:
                return [h for h in block_hashes if first_8(h)[0] * k % prime < threshold]
            except struct.error:  # a hash shorter than 8 bytes: the same int, slower
                pass
        return [h for h in block_hashes if _int_key(h) * k % prime < threshold]


try:
    from offload.insight._sample_test import SampleTest
except ImportError:  # installed without a C compiler
    SampleTest = PySampleTest  # type: ignore[misc,assignment]


class SpatialSampler:
    """Keeps the blocks whose hash times a multiplier, modulo a prime, falls below a threshold.

    The same (rate, seed) keeps the same blocks in every process. A lower
    rate with the same seed keeps a subset of a higher one's blocks, so a
    reader can sample an already sampled stream further (``narrowed``).
    """

    __slots__ = ("multiplier", "rate", "sample", "seed", "threshold")

    def __init__(self, rate: float = DEFAULT_RATE, seed: int = 0) -> None:
        self.rate = check_rate(rate)
        self.seed = seed
        self.threshold = min(PRIME, round(self.rate * PRIME))
        self.multiplier = _multiplier(seed)
        self.sample: Callable[[Sequence[BlockHash]], list[BlockHash]] = (
            list if self.threshold == PRIME else SampleTest(self.multiplier, self.threshold, PRIME)
        )
        """The sampled blocks of one request, in prompt order: the test itself, not a method
        around it, so the worker's call per request goes straight to it (at rate 1, a copy)."""

    def is_sampled(self, block_hash: BlockHash) -> bool:
        return _int_key(block_hash) * self.multiplier % PRIME < self.threshold

    def narrowed(self, rate: float) -> SpatialSampler:
        """The same test at a rate no higher: it keeps a subset of this sampler's blocks."""
        if check_rate(rate) > self.rate:
            raise ValueError(f"cannot narrow a sample at rate {self.rate} to a higher rate {rate}")
        return SpatialSampler(rate, self.seed)
