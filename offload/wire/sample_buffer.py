"""The worker's side of the sampled access stream: requests sampled, held, framed.

The worker samples each request's block references where it asks its tier
(``add``, once per request, on the scheduler's thread) and hands the
sample to its publisher as a frame every so often (``take``). Between two
frames the sample waits here, bounded in bytes: a request that does not fit
is shed whole (its blocks and its count, so what is framed stays a sample
of the requests it counts) and counted in the frames that follow.

The sampler is given, not built here: the test itself (SHARDS' hash test)
lives in offload/insight/sampling.py, above this layer; anything with its
``rate``, ``seed`` and ``sample`` will do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final, Protocol

from offload.base import BlockHash
from offload.wire.sample_frame import (
    MAX_FRAME_REQUESTS,
    MAX_REQUEST_BLOCKS,
    SampledRequest,
    SampleFrame,
)
from offload.wire.stats_frame import WorkerConfig

INT_HASH_BYTES: Final = 9
"""The most bytes msgpack spends on an int hash: what a held int hash is counted as."""

DEFAULT_MAX_BYTES: Final = 4 * 2**20
DEFAULT_PERIOD_S: Final = 0.05


class Sampler(Protocol):
    """What the buffer needs of a sampler (offload.insight.sampling.SpatialSampler)."""

    rate: float
    seed: int

    def sample(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]: ...


def _encoded_bytes(sampled: Sequence[BlockHash]) -> int:
    """About what bytes hashes take in a frame (msgpack: bytes + 2)."""
    return sum(len(h) + 2 for h in sampled)  # type: ignore[arg-type]


class SampleBuffer:
    """Sampled requests since the last frame, at most ``max_bytes`` of hashes.

    Called from one thread (the worker's scheduler step): ``add`` per
    request, ``due`` and ``take`` per step.
    """

    def __init__(
        self,
        sampler: Sampler,
        max_bytes: int = DEFAULT_MAX_BYTES,
        period_s: float = DEFAULT_PERIOD_S,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        self.sampler = sampler
        self._sample = sampler.sample
        self.max_bytes = max_bytes
        self.period_s = period_s
        self.bytes = 0
        self.shed_requests = 0
        self.shed_block_refs = 0
        self._requests: list[SampledRequest] = []
        self._unsampled_requests = 0
        self._unsampled_block_refs = 0
        self._next = time.monotonic() + period_s

    def add(self, block_hashes: Sequence[BlockHash]) -> None:
        """One request's references to the tier, in prompt order.

        Runs once per request on the scheduler's thread: the sampler's test is
        called as it is, and an int request's size is priced without a call.
        """
        sampled = self._sample(block_hashes)
        refs = len(block_hashes)
        if not sampled:
            if refs:
                self._unsampled_requests += 1
                self._unsampled_block_refs += refs
            return
        size = INT_HASH_BYTES * len(sampled) if type(sampled[0]) is int else _encoded_bytes(sampled)
        requests = self._requests
        if (
            refs > MAX_REQUEST_BLOCKS
            or self.bytes + size > self.max_bytes
            or len(requests) >= MAX_FRAME_REQUESTS
        ):
            self.shed_requests += 1
            self.shed_block_refs += refs
            return
        requests.append(SampledRequest(refs, sampled))
        self.bytes += size

    def due(self) -> bool:
        """A frame is due: its period passed, or the buffer is half full."""
        return (
            time.monotonic() >= self._next
            or 2 * self.bytes >= self.max_bytes
            or 2 * len(self._requests) >= MAX_FRAME_REQUESTS
        )

    def take(self, engine_id: str, rank: int, config: WorkerConfig) -> SampleFrame | None:
        """Everything held as one frame, and start over; None when nothing was added."""
        self._next = time.monotonic() + self.period_s
        if not self._requests and not self._unsampled_requests:
            return None
        frame = SampleFrame(
            ts=time.time(),
            engine_id=engine_id,
            rank=rank,
            config=config,
            rate=self.sampler.rate,
            seed=self.sampler.seed,
            requests=self._requests,
            unsampled_requests=self._unsampled_requests,
            unsampled_block_refs=self._unsampled_block_refs,
            shed_requests=self.shed_requests,
            shed_block_refs=self.shed_block_refs,
        )
        self._requests = []
        self._unsampled_requests = self._unsampled_block_refs = self.bytes = 0
        return frame
