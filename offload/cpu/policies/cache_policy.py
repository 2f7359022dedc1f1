"""The interface between the manager and an eviction policy.

A policy owns the map of resident blocks (its ordering structure *is* the
index), and every method takes a whole batch, so a manager call costs one
Python call into the policy, not one per block.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import ClassVar

from offload.base import BlockHash
from offload.cpu.block_pool import Block


class CachePolicy(ABC):
    """Decides which resident blocks leave the tier when room is needed."""

    name: ClassVar[str]
    blocks: Mapping[BlockHash, Block]
    """Every resident block, ready or not. Read-only for everyone but the policy."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def insert(self, block_hashes: Sequence[BlockHash], blocks: Sequence[Block]) -> None:
        """Admit newly allocated (not yet ready) blocks, none of them resident."""

    @abstractmethod
    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Record a use; hashes that are not resident are ignored or remembered."""

    @abstractmethod
    def evict(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        """Remove exactly n idle blocks (ref == 0) not in protected, or none at all.

        Returns the removed (hash, block) pairs, or None when fewer than n
        blocks can leave; in that case nothing changed.
        """

    @abstractmethod
    def remove(self, block_hash: BlockHash) -> Block:
        """Drop one resident block regardless of its state (a failed store)."""


def take_idle(
    ordered: Mapping[BlockHash, Block], protected: Container[BlockHash], n: int
) -> list[tuple[BlockHash, Block]]:
    """Up to n idle (ref == 0), unprotected blocks, in the mapping's order.

    The shared scan behind every policy's eviction: blocks being written
    (ref -1) or read (ref > 0) and blocks the caller protects are skipped.
    """
    chosen: list[tuple[BlockHash, Block]] = []
    if n <= 0:
        return chosen
    for block_hash, block in ordered.items():
        if block.ref == 0 and block_hash not in protected:
            chosen.append((block_hash, block))
            if len(chosen) == n:
                break
    return chosen
