"""The worker's side of the sampled access stream: requests sampled, held, framed.

The worker samples each request's block references where it asks its tier
(``add``, once per request, on the scheduler's thread) and hands the
sample to its publisher as a frame every so often (``take``). Between two
frames the sample waits here, bounded in bytes: a request that does not fit
is shed whole (its blocks and its count, so what is framed stays a sample
of the requests it counts) and counted in the frames that follow.

What runs per request is the recorder (sample_recorder.py); this module
frames what it holds. The sampler is given, not built here: the test itself (SHARDS' hash test)
lives in offload/insight/sampling.py, above this layer; anything with its
``rate``, ``seed`` and ``sample`` will do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import msgspec

from offload.base import BlockHash
from offload.wire.sample_frame import MAX_FRAME_REQUESTS, MAX_REQUEST_BLOCKS, PackedSampleFrame
from offload.wire.sample_recorder import SampleRecorder, check_limits
from offload.wire.stats_frame import WorkerConfig

DEFAULT_MAX_BYTES: Final = 4 * 2**20
DEFAULT_PERIOD_S: Final = 0.05


class Sampler(Protocol):
    """What the buffer needs of a sampler (offload.insight.sampling.SpatialSampler)."""

    rate: float
    seed: int

    def sample(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]: ...


class SampleBuffer:
    """Sampled requests since the last frame, at most ``max_bytes`` of their msgpack.

    Called from one thread (the worker's scheduler step): ``add`` per
    request, ``due`` and ``take`` per step. ``add(block_hashes)`` takes one
    request's references to the tier, in prompt order; it and ``due`` are the
    recorder's own (sample_recorder.py), not methods around it, so the
    worker's call per request goes straight to C where it was built.
    """

    def __init__(
        self,
        sampler: Sampler,
        max_bytes: int = DEFAULT_MAX_BYTES,
        period_s: float = DEFAULT_PERIOD_S,
    ) -> None:
        check_limits(max_bytes, MAX_FRAME_REQUESTS, MAX_REQUEST_BLOCKS, period_s)
        self.sampler = sampler
        self._recorder = SampleRecorder(
            sampler.sample, max_bytes, MAX_FRAME_REQUESTS, MAX_REQUEST_BLOCKS, period_s
        )
        self.add: Callable[[Sequence[BlockHash]], None] = self._recorder
        self.due: Callable[[], bool] = self._recorder.due

    @property
    def max_bytes(self) -> int:
        return self._recorder.max_bytes

    @property
    def period_s(self) -> float:
        return self._recorder.period_s

    @property
    def bytes(self) -> int:
        """Bytes of hashes held now."""
        return self._recorder.bytes

    @property
    def shed_requests(self) -> int:
        return self._recorder.shed_requests

    @property
    def shed_block_refs(self) -> int:
        return self._recorder.shed_block_refs

    def take(self, engine_id: str, rank: int, config: WorkerConfig) -> PackedSampleFrame | None:
        """Everything held as one frame, and start over; None when nothing was added."""
        requests, held, unsampled_requests, unsampled_block_refs = self._recorder.drain()
        if not held and not unsampled_requests:
            return None
        return PackedSampleFrame(
            ts=time.time(),
            engine_id=engine_id,
            rank=rank,
            config=config,
            rate=self.sampler.rate,
            seed=self.sampler.seed,
            requests=msgspec.Raw(requests),
            unsampled_requests=unsampled_requests,
            unsampled_block_refs=unsampled_block_refs,
            shed_requests=self.shed_requests,
            shed_block_refs=self.shed_block_refs,
        )
