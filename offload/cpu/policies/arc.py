"""Adaptive Replacement Cache (Megiddo and Modha, FAST'03).

ARC splits the tier into blocks seen once (T1) and blocks seen again (T2),
and remembers recently evicted hashes of each (ghost lists B1, B2). A miss
that hits a ghost list tells which side was too small, and the target size of
T1 moves towards it. A scan of one-time blocks only churns T1, so frequently
used blocks in T2 survive it. Memory beyond the resident blocks: each ghost list
holds at most ``capacity`` hashes, the least recently evicted forgotten first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence

from offload.base import BlockHash
from offload.cpu.block_pool import Block
from offload.cpu.policies.cache_policy import CachePolicy, take_idle
from offload.cpu.policies.metadata_bound import MetadataBound
from offload.cpu.policies.self_check import bound_violations, ranking_violations
from offload.cpu.request_recency import RequestRecency


class ARCCachePolicy(CachePolicy):
    """ARC with ghost lists, an adaptive T1 target and scan resistance."""

    name = "arc"
    metadata_bound = MetadataBound(12 * 1024, 1152)
    """A resident block and, at most, a ghost hash per slot: the larger of the C and Python
    forms' cost, rounded up (tests/offload/test_policy_memory.py holds it)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.blocks: dict[BlockHash, Block] = {}
        self.t1: OrderedDict[BlockHash, Block] = OrderedDict()
        self.t2: OrderedDict[BlockHash, Block] = OrderedDict()
        self.b1: OrderedDict[BlockHash, None] = OrderedDict()
        self.b2: OrderedDict[BlockHash, None] = OrderedDict()
        self.target_t1 = 0.0

    def insert(
        self,
        block_hashes: Sequence[BlockHash],
        blocks: Sequence[Block],
        request: RequestRecency | None = None,
    ) -> None:
        self.blocks.update(zip(block_hashes, blocks, strict=True))
        t1, b1, b2 = self.t1, self.b1, self.b2
        t1.update(zip(block_hashes, blocks, strict=True))
        if b1.keys().isdisjoint(block_hashes) and b2.keys().isdisjoint(block_hashes):
            return  # the common case: none of them was evicted recently
        t2 = self.t2
        for block_hash in block_hashes:
            if block_hash in b1:
                # T1 evicted it too early: give recency more room.
                self.target_t1 = min(
                    self.target_t1 + max(1.0, len(b2) / len(b1)), float(self.capacity)
                )
                del b1[block_hash]
            elif block_hash in b2:
                # T2 evicted it too early: give frequency more room.
                self.target_t1 = max(self.target_t1 - max(1.0, len(b1) / len(b2)), 0.0)
                del b2[block_hash]
            else:
                continue
            t2[block_hash] = t1.pop(block_hash)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        t1, t2 = self.t1, self.t2
        for block_hash in reversed(list(block_hashes)):
            block = t1.get(block_hash)
            if block is not None:
                if block.ref < 0:
                    # Still being written: its first use has not happened yet.
                    t1.move_to_end(block_hash)
                else:
                    del t1[block_hash]
                    t2[block_hash] = block
            elif block_hash in t2:
                t2.move_to_end(block_hash)

    def finish(
        self,
        block_hashes: Sequence[BlockHash],
        reused: Container[BlockHash],
        request: RequestRecency | None = None,
    ) -> None:
        """The request's blocks ranked by its prompt, tail first to go; those it found stored
        seen again (T1 to T2), those it stored kept in their list.

        vLLM's connector never calls ``touch``: without this, a prefix a request stored sat
        in T1 in store order and lost its head first, leaving the rest of it unreachable
        (a lookup stops at the first miss). vLLM's own ARC ranks it so too.
        """
        t1, t2 = self.t1, self.t2
        for block_hash in reversed(block_hashes):
            if block_hash in t1:
                if block_hash in reused:
                    t2[block_hash] = t1.pop(block_hash)
                else:
                    t1.move_to_end(block_hash)
            elif block_hash in t2:
                t2.move_to_end(block_hash)

    def evict(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        if n <= 0:
            return []
        # ARC's REPLACE, one batch at a time: T1 gives blocks while it is at or
        # above its target (and not empty), then T2, then T1 again if T2 runs dry.
        threshold = max(math.ceil(self.target_t1), 1)
        from_t1 = take_idle(self.t1, protected, min(n, max(0, len(self.t1) - threshold + 1)))
        from_t2 = take_idle(self.t2, protected, n - len(from_t1))
        if len(from_t1) + len(from_t2) < n:
            from_t1 = take_idle(self.t1, protected, n - len(from_t2))
            if len(from_t1) + len(from_t2) < n:
                return None
        resident, t1, t2, b1, b2 = self.blocks, self.t1, self.t2, self.b1, self.b2
        for block_hash, _ in from_t1:
            del resident[block_hash], t1[block_hash]
            b1[block_hash] = None
        for block_hash, _ in from_t2:
            del resident[block_hash], t2[block_hash]
            b2[block_hash] = None
        for ghost in (b1, b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return from_t1 + from_t2

    def remove(self, block_hash: BlockHash) -> Block:
        block = self.blocks.pop(block_hash)
        if self.t1.pop(block_hash, None) is None:
            del self.t2[block_hash]
        return block

    def invariant_violations(self) -> list[str]:
        """Each resident block in T1 or T2, once, as the block resident under its hash;
        the ghost lists hold only blocks that left, each list within ``capacity``."""
        problems = ranking_violations(self.name, self.blocks, {"t1": self.t1, "t2": self.t2})
        resident = self.blocks
        for name, table in (("t1", self.t1), ("t2", self.t2)):
            problems += [
                f"arc: block {block_hash!r:.80} in {name} is not the block resident under its hash"
                for block_hash, block in table.items()
                if block_hash in resident and resident[block_hash] is not block
            ]
        for name, ghosts in (("b1", self.b1), ("b2", self.b2)):
            problems += [
                f"arc: block {block_hash!r:.80} is in ghost list {name} and resident"
                for block_hash in ghosts
                if block_hash in resident
            ]
            problems += bound_violations(self.name, name, len(ghosts), self.capacity, "capacity")
        problems += [
            f"arc: block {block_hash!r:.80} is in both ghost lists b1 and b2"
            for block_hash in self.b1
            if block_hash in self.b2
        ]
        if not 0.0 <= self.target_t1 <= self.capacity:
            problems.append(f"arc: target_t1 {self.target_t1} is outside [0, capacity]")
        return problems

    def reset(self) -> None:
        for table in (self.blocks, self.t1, self.t2, self.b1, self.b2):
            table.clear()
        self.target_t1 = 0.0
