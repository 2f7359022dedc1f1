"""A stand-in for vLLM's GPU prefix cache, so the demo shows the tier in front of the CPU one.

In a real deployment vLLM's own KV-event publisher reports its GPU prefix
cache (``BlockStored`` / ``BlockRemoved`` with ``medium="GPU"``) beside
kvscope's CPU tier, and the sidecar draws both. The demo has no vLLM, so the
demo worker composes this small model of it: an LRU of block hashes with a
fixed capacity, answering prefix lookups and reporting what enters and leaves
as the same ``OffloadingEvent`` s the CPU manager emits, with medium "GPU".
It holds hashes only: the demo moves no GPU bytes for blocks already resident.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from offload.base import BlockHash, OffloadingEvent

GPU_MEDIUM = "GPU"
"""The medium vLLM names its GPU prefix cache with in its KV events."""


class GPUPrefixCache:
    """An LRU of GPU-resident blocks with vLLM's prefix-hit rule and GPU events.

    Not thread-safe: like vLLM's scheduler, one thread (the demo worker's) drives it.
    """

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"the GPU cache needs at least 1 block, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        # Block -> its parent in the chain it was stored with. Oldest first:
        # eviction pops from the front, a touch moves to the back.
        self._blocks: OrderedDict[BlockHash, BlockHash | None] = OrderedDict()
        self._events: list[OffloadingEvent] = []
        self.lookup_blocks = 0
        self.hit_blocks = 0
        self.stored_blocks = 0
        self.evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int:
        """The length of the request's leading run of resident blocks.

        A prefix, not a count: a block's KV depends on every token before it,
        so (as in vLLM) the first miss ends the hit. Recency is left alone
        until ``admit``, which the request's blocks all go through.
        """
        hits = 0
        for block_hash in block_hashes:
            if block_hash not in self._blocks:
                break
            hits += 1
        self.lookup_blocks += len(block_hashes)
        self.hit_blocks += hits
        return hits

    def admit(
        self, block_hashes: Sequence[BlockHash]
    ) -> list[tuple[BlockHash | None, list[BlockHash]]]:
        """Make a request's blocks the most recent, evicting the least recent past capacity.

        Resident blocks are touched; the others (computed or loaded by the
        request) are stored. Returns the evicted hashes, oldest first, for the
        caller to offer to the tier below, in runs that continue one chain,
        each with the block before it. A request longer than the cache
        evicts its own first blocks, as a GPU too small for it would.
        Events are recorded stored-then-removed, so a block that enters and
        leaves in one call ends absent in any mirror replaying them.
        """
        blocks = self._blocks
        # Stored blocks go out as vLLM sends them: one event per run of the chain
        # they continue, naming the block before the run as its parent.
        runs: list[tuple[BlockHash | None, list[BlockHash]]] = []
        previous: BlockHash | None = None
        for block_hash in block_hashes:
            if block_hash in blocks:
                blocks.move_to_end(block_hash)
            else:
                blocks[block_hash] = previous
                if runs and runs[-1][1][-1] == previous:
                    runs[-1][1].append(block_hash)
                else:
                    runs.append((previous, [block_hash]))
            previous = block_hash
        evicted = [blocks.popitem(last=False) for _ in range(len(blocks) - self.capacity_blocks)]
        for parent, run in runs:
            self._events.append(OffloadingEvent(run, self.block_size, GPU_MEDIUM, False, parent))
            self.stored_blocks += len(run)
        if evicted:
            hashes = [block_hash for block_hash, _parent in evicted]
            self._events.append(OffloadingEvent(hashes, self.block_size, GPU_MEDIUM, True))
        self.evicted_blocks += len(evicted)
        evicted_runs: list[tuple[BlockHash | None, list[BlockHash]]] = []
        for block_hash, parent in evicted:
            if evicted_runs and evicted_runs[-1][1][-1] == parent:
                evicted_runs[-1][1].append(block_hash)
            else:
                evicted_runs.append((parent, [block_hash]))
        return evicted_runs

    def take_events(self) -> list[OffloadingEvent]:
        """The events since the last call, in order (the CPU manager's contract)."""
        events, self._events = self._events, []
        return events
