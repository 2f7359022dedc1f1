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
hash, so the hash is announced stored when its first copy is stored and
removed when its last copy leaves: the reference counting vLLM asks of
consumers of its own offloading events, done here so that a consumer keyed
by hash (the sidecar's block index) never drops a block a group still
holds. Each group's chunk covers its own number of tokens, which is the
block size of its stored events.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm.v1.kv_offload.base import get_offload_block_hash, get_offload_group_idx

from offload.base import OffloadingEvent as TierEvent


class PublishedNames:
    """Turns the core's events into the events kvscope's publisher sends."""

    def __init__(self, chunk_tokens: Mapping[int, int]) -> None:
        """``chunk_tokens``: tokens of one chunk by KV cache group index."""
        self._chunk_tokens = dict(chunk_tokens)
        self._copies: dict[bytes, int] | None = {} if len(chunk_tokens) > 1 else None
        """Group copies the tier holds per raw hash, with several groups; None with one."""

    def __call__(self, events: list[TierEvent]) -> list[TierEvent]:
        if self._copies is None:
            return [_stripped(event) for event in events]
        named: list[TierEvent] = []
        for event in events:
            if event.removed:
                named += self._removed(event)
            else:
                named += self._stored(event)
        return named

    def _stored(self, event: TierEvent) -> list[TierEvent]:
        """The run's hashes not held already, as runs of the chain, each under the block
        before it: a hash another group holds is in the consumer's view, not repeated."""
        copies = self._copies
        assert copies is not None
        size = self._chunk_tokens[get_offload_group_idx(event.block_hashes[0])]
        previous = event.parent_block_hash
        previous = None if previous is None else get_offload_block_hash(previous)
        runs: list[tuple[bytes | None, list[bytes]]] = []
        fresh = False
        for key in event.block_hashes:
            block = get_offload_block_hash(key)
            held = copies.get(block, 0)
            copies[block] = held + 1
            if not held:
                if not fresh:
                    runs.append((previous, []))
                runs[-1][1].append(block)
            fresh, previous = not held, block
        return [TierEvent(blocks, size, event.medium, False, parent) for parent, blocks in runs]

    def _removed(self, event: TierEvent) -> list[TierEvent]:
        """The hashes whose last copy left."""
        copies = self._copies
        assert copies is not None
        gone: list[bytes] = []
        for key in event.block_hashes:
            block = get_offload_block_hash(key)
            held = copies.pop(block) - 1
            if held:
                copies[block] = held
            else:
                gone.append(block)
        return [TierEvent(gone, event.block_size, event.medium, True)] if gone else []


def _stripped(event: TierEvent) -> TierEvent:
    parent = event.parent_block_hash
    return TierEvent(
        [get_offload_block_hash(key) for key in event.block_hashes],
        event.block_size,
        event.medium,
        event.removed,
        None if parent is None else get_offload_block_hash(parent),
    )
