"""The core's events as kvscope's publisher names them: by raw block hash.

vLLM makes a chunk's offload key from the hash of the chunk's last block and
its KV cache group; its GPU events name that same block by the hash alone.
Stripping the group therefore puts CPU and GPU blocks in one namespace, so
that the sidecar sees a block held on both tiers as one block. The parent,
the key of the chunk before, becomes the raw hash of the block before the
chunk. A chunk of several blocks is named by its last block only: vLLM hands
a manager no other hash of the chunk.

With one KV cache group this holds no memory: a removal strips the same key
as its store, so it names exactly the hashes the store named. With several
(hybrid models), each group keeps its own copy of a chunk under one raw
hash, and each copy is announced as vLLM's own events announce it: stored
and removed on its own, naming its group (``group_idx``), its group's chunk
size as its block size and its group's chunk before as its parent. A stream
that announced a hash once, with the first group's parent, hid the chain of
every group that stored it later: a coarser group chains a hash under the
chunk one coarse chunk back, so once the finer group's copies before it left,
a consumer saw the hash under a block held nowhere (stranded), though the
coarser group's chain reached it from the root.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby

from vllm.v1.kv_offload.base import get_offload_block_hash, get_offload_group_idx

from offload.base import OffloadingEvent as TierEvent


class PublishedNames:
    """Turns the core's events into the events kvscope's publisher sends."""

    def __init__(self, chunk_tokens: Mapping[int, int]) -> None:
        """``chunk_tokens``: tokens of one chunk by KV cache group index."""
        self._chunk_tokens = dict(chunk_tokens) if len(chunk_tokens) > 1 else None
        """Tokens of one chunk by group, with several groups; None with one (no group named)."""

    def __call__(self, events: list[TierEvent]) -> list[TierEvent]:
        sizes = self._chunk_tokens
        if sizes is None:
            return [
                _stripped(event, event.block_hashes, event.block_size, None) for event in events
            ]
        named: list[TierEvent] = []
        for event in events:
            if event.removed:
                # One removal may leave several groups: one event per group's run of keys.
                for group, keys in groupby(event.block_hashes, get_offload_group_idx):
                    named.append(_stripped(event, list(keys), event.block_size, group))
            else:  # the core never lets a stored run cross groups
                group = get_offload_group_idx(event.block_hashes[0])
                named.append(_stripped(event, event.block_hashes, sizes[group], group))
        return named


def _stripped(event: TierEvent, keys: list[bytes], block_size: int, group: int | None) -> TierEvent:
    """``event`` naming ``keys`` by raw hash, with ``block_size`` and ``group``."""
    parent = event.parent_block_hash
    return TierEvent(
        [get_offload_block_hash(key) for key in keys],
        block_size,
        event.medium,
        event.removed,
        None if parent is None else get_offload_block_hash(parent),
        group,
    )
