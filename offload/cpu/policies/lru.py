"""Least recently used: the baseline every other policy is measured against."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence

from offload.base import BlockHash
from offload.cpu.block_pool import Block
from offload.cpu.policies.cache_policy import CachePolicy, take_idle


class LRUCachePolicy(CachePolicy):
    """Evicts the idle block used longest ago.

    A touch walks a request's prefix tail-first, so the chain's head ends up
    most recent: a prefix then loses its tail before its head, which keeps the
    rest of the chain reachable.
    """

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.blocks: OrderedDict[BlockHash, Block] = OrderedDict()

    def insert(self, block_hashes: Sequence[BlockHash], blocks: Sequence[Block]) -> None:
        self.blocks.update(zip(block_hashes, blocks, strict=True))

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        resident = self.blocks
        to_end = resident.move_to_end
        for block_hash in reversed(list(block_hashes)):
            if block_hash in resident:
                to_end(block_hash)

    def evict(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        chosen = take_idle(self.blocks, protected, n)
        if len(chosen) < n:
            return None
        resident = self.blocks
        for block_hash, _ in chosen:
            del resident[block_hash]
        return chosen

    def remove(self, block_hash: BlockHash) -> Block:
        return self.blocks.pop(block_hash)
