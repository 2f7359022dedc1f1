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
from offload.cpu.policies.metadata_bound import MetadataBound
from offload.cpu.request_recency import RequestRecency


class CachePolicy(ABC):
    """Decides which resident blocks leave the tier when room is needed."""

    name: ClassVar[str]
    metadata_bound: ClassVar[MetadataBound]
    """The most memory a manager over this policy keeps at each capacity, once every history
    the policy keeps is full (see ``MetadataBound``). vLLM's start-up check counts it with
    the tier's bytes and the sidecar sizes its shadow tiers by it, so a policy must state
    it, measured in the forms it runs in; registration refuses one that does not."""
    blocks: Mapping[BlockHash, Block]
    """Every resident block, ready or not. Read-only for everyone but the policy."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def insert(
        self,
        block_hashes: Sequence[BlockHash],
        blocks: Sequence[Block],
        request: RequestRecency | None = None,
    ) -> None:
        """Admit newly allocated (not yet ready) blocks, none of them resident.

        ``request``, when the engine names one, is the storing request: a
        policy may order the blocks by their place in its prompt.
        """

    def admit(
        self, block_hashes: list[BlockHash], free: int, request: RequestRecency | None = None
    ) -> list[BlockHash]:
        """Of the new blocks offered for storing, those worth a slot, in offer order.

        ``block_hashes`` are not resident, deduplicated, in the order of the
        prompt; ``free`` slots are empty now; ``request``, when the engine
        names one, is the storing request (the one ``observe`` was told of).
        The manager stores only what this returns and counts the rest as not
        admitted: a refused block is never stored, so it never evicts anything
        and no event names it. Called once per store, whatever its size. The
        default admits every block (and returns the same list, so the
        manager's check costs nothing).
        """
        return block_hashes

    @abstractmethod
    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Record a use; hashes that are not resident are ignored or remembered."""

    def observe(self, block_hashes: Iterable[BlockHash], request: RequestRecency) -> None:
        """A running request met these blocks for the first time (stored or loaded).

        Its use is recorded by ``finish`` when the request ends; a policy may
        already keep the blocks in the request's prompt order meanwhile. The
        default waits for ``finish``.
        """
        return

    def finish(
        self,
        block_hashes: Sequence[BlockHash],
        reused: Container[BlockHash],
        request: RequestRecency | None = None,
    ) -> None:
        """A request ended having used these blocks, head of its prompt first.

        ``reused`` are those it found already stored, as opposed to the ones
        it stored itself; ``request`` is the one ``observe`` was told of. The
        default counts a use of the reused ones only, so a block's own store
        is never taken for its reuse (ARC's second sighting).
        """
        self.touch([block_hash for block_hash in block_hashes if block_hash in reused])

    @abstractmethod
    def reset(self) -> None:
        """Forget every block and all history (the tier was reset)."""

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

    def invariant_violations(self) -> list[str]:
        """Every broken invariant of the policy's own tables, checked in full (O(entries)).

        The manager's full check includes it, so the stateful tests find a
        ranking table that drifted from ``blocks`` (``self_check``) or memory
        past its bound. The default finds nothing: kvscope does not know an
        out-of-tree policy's tables.
        """
        return []


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
