"""Sample frames: a worker's spatially sampled block references, for the live hit-ratio curve.

The worker keeps the references of the blocks whose hash passes the
sampling test (SHARDS: offload/insight/sampling.py) and counts every
reference; the reader replays the sample on tiers scaled by the rate to tell
what the tier would hit at other sizes and under other policies. A frame
carries what the reader needs to do that without any other frame: the rate
and seed of the test (so the reader can sample further with the same test),
the tier's policy and capacity (what the curve is drawn around), each
sampled request's hashes in prompt order with its whole block count, and the
block counts of the requests none of whose blocks was sampled (they change
no simulated tier, but the correction for the sample's size needs them).

A frame comes from the network, so decoding checks it whole (a bad frame is
refused, ``InvalidSampleFrame``, never half-applied): the version first,
every list bounded, hashes as the KV events bound them (offload/wire/labels.py),
counts non-negative, no request with more sampled blocks than blocks.
docs/PROTOCOL.md gives the schema.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter, gt
from typing import Annotated, Final

import msgspec

from offload.wire.labels import BlockHash, Finite, Ident, Rank
from offload.wire.schema_version import check_version
from offload.wire.stats_frame import WorkerConfig
from offload.wire.untrusted import decode

SAMPLE_SCHEMA_VERSION: Final = 1
"""The major schema version this module writes and reads."""

MAX_FRAME_REQUESTS: Final = 16_384
"""Most sampled requests one frame may carry; a writer sends more frames instead."""

MAX_REQUEST_BLOCKS: Final = 65_536
"""Most blocks one request may list: a 1M-token prompt in blocks of 16."""

MAX_SEED: Final = 2**32 - 1
"""The largest sampling seed read (the sampler's seeds are small ints)."""

MIN_SAMPLE_RATE: Final = 1e-6
"""The lowest sampling rate a worker may run: the sampling test keeps a whole number of the
2**30 hash residues, which misses a rate below it by more than 0.05% (by 1% below 5e-8,
and keeps nothing below 5e-10), while the curve corrects by the rate as given."""


def is_worker_rate(rate: float) -> bool:
    """Whether a worker may be set to sample at ``rate``: 0 (no sample), or from
    ``MIN_SAMPLE_RATE`` to 1 (NaN is neither)."""
    return rate == 0 or MIN_SAMPLE_RATE <= rate <= 1


_Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_Rate = Annotated[float, msgspec.Meta(ge=MIN_SAMPLE_RATE, le=1.0)]


class UnsupportedSampleVersion(ValueError):
    """A frame's major version is one this decoder cannot read."""


class InvalidSampleFrame(ValueError):
    """A frame of this version whose content breaks a rule above; the message says which."""


class SampledRequest(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One request with at least one sampled block: ``[block_refs, [hash, ...]]``.

    ``sampled`` lists its sampled blocks in prompt order; ``block_refs`` is
    how many blocks the request named in all (sampled or not). Not tracked by
    the garbage collector (``gc=False``: an int and a list of hashes can form no
    cycle), so a decoded frame, one of these per sampled request, adds no
    collector work to the reader's ingest thread.
    """

    block_refs: Annotated[int, msgspec.Meta(ge=1, le=MAX_REQUEST_BLOCKS)]
    sampled: Annotated[list[BlockHash], msgspec.Meta(min_length=1, max_length=MAX_REQUEST_BLOCKS)]


class _FrameFields(msgspec.Struct, kw_only=True, frozen=True):
    """What every sample frame carries beside its requests (``SampleFrame`` says what)."""

    version: int = SAMPLE_SCHEMA_VERSION
    ts: Finite
    engine_id: Ident
    rank: Rank
    config: WorkerConfig
    rate: _Rate
    seed: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEED)]
    unsampled_requests: _Count = 0
    unsampled_block_refs: _Count = 0
    shed_requests: _Count = 0
    shed_block_refs: _Count = 0


class SampleFrame(_FrameFields, kw_only=True, frozen=True):
    """The sampled references of one worker since its previous sample frame, as read.

    ``shed_requests`` and ``shed_block_refs`` are cumulative: requests the
    worker left out of the sample because its buffer was full (they are in
    no frame, not even in ``unsampled_*``, so the sample stays a sample of
    the requests it counts).
    """

    requests: Annotated[list[SampledRequest], msgspec.Meta(max_length=MAX_FRAME_REQUESTS)] = (
        msgspec.field(default_factory=list)
    )

    @property
    def block_refs(self) -> int:
        """Every block reference this frame stands for, sampled or not."""
        return self.unsampled_block_refs + sum(map(_BLOCK_REFS, self.requests))

    @property
    def sampled_refs(self) -> int:
        return sum(map(len, map(_SAMPLED, self.requests)))


class PackedSampleFrame(_FrameFields, kw_only=True, frozen=True):
    """A sample frame as a worker writes it: ``requests`` is already the msgpack array of its
    requests (the worker's recorder writes each request as it holds it), spliced into the
    payload unchanged. The payload reads back as a ``SampleFrame``."""

    requests: msgspec.Raw


# A request's fields, for passes over a frame's requests at C speed (the ingest thread's).
_BLOCK_REFS: Final = attrgetter("block_refs")
_SAMPLED: Final = attrgetter("sampled")


_ENCODER = msgspec.msgpack.Encoder()
_FRAME_DECODER = msgspec.msgpack.Decoder(SampleFrame)


SendableSampleFrame = SampleFrame | PackedSampleFrame
"""What ``encode_sample_frame`` writes: a frame built whole, or one a worker packed."""


def encode_sample_frame(frame: SendableSampleFrame) -> bytes:
    """The msgpack payload of one frame (a map; each request a two-element array)."""
    return _ENCODER.encode(frame)


def decode_sample_frame(payload: bytes) -> SampleFrame:
    """Decode a frame of this major version; unknown fields are ignored.

    Raises ``UnsupportedSampleVersion`` for another major version,
    ``msgspec.DecodeError`` for anything that is not a sample frame, and
    ``InvalidSampleFrame`` for one that breaks a rule across fields (all
    three are ``ValueError``).
    """
    check_version(payload, "sample", SAMPLE_SCHEMA_VERSION, UnsupportedSampleVersion)
    frame = decode(_FRAME_DECODER, payload)
    sampled = list(map(_SAMPLED, frame.requests))
    if any(map(gt, map(len, sampled), map(_BLOCK_REFS, frame.requests))):
        raise InvalidSampleFrame("a request with more sampled blocks than blocks")
    # One hash type in the whole frame (a worker's) settles it in one pass.
    if len(set(map(type, chain.from_iterable(sampled)))) > 1 and any(
        len(set(map(type, hashes))) > 1 for hashes in sampled
    ):
        raise InvalidSampleFrame("a request whose hashes mix ints and bytes")
    return frame
