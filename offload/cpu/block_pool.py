"""The CPU tier's slots: who owns which, and which are free.

Kept apart from the cache policy so that policies decide *what* to keep while
the pool alone guarantees that no slot is ever owned twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain


class Block:
    """One resident block: its slot, its reference state, and whether it paid off.

    ``ref`` is -1 while the block is being written (not readable, not
    evictable), 0 when idle, and the number of in-flight reads otherwise.
    ``loaded`` says whether any load read it since it was stored: a block
    evicted without it was a dead write.
    """

    __slots__ = ("loaded", "ref", "slot")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.ref = -1
        self.loaded = False

    @property
    def is_ready(self) -> bool:
        return self.ref >= 0

    def __repr__(self) -> str:
        return f"Block(slot={self.slot}, ref={self.ref})"


class BlockPool:
    """A fixed number of slots, each with one Block object reused for its lifetime.

    Reusing the objects keeps allocation off the store path: handing out a
    slot is a list slice and a reset, not an object construction. A slot's
    object is made the first time the slot is handed out, as vLLM's own
    manager counts its slots, so a tier sized for the machine's memory costs
    nothing until it fills. Slots are handed out in vLLM's order, so a store
    is given the same slot ids under kvscope as under vLLM's own CPU manager:
    slots never used since the last reset first, lowest first, then the most
    recently freed.
    """

    __slots__ = ("_by_slot", "_cursor", "_free", "_fresh", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"block pool capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._by_slot: list[Block] = []  # slot -> its Block, for every slot ever handed out
        self._fresh = 0  # the slots from this one on are unused since the last reset
        self._free: list[Block] = []
        self._cursor = 0

    @property
    def num_free(self) -> int:
        return self.capacity - self._fresh + len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    def allocate(self, n: int) -> list[Block]:
        """Hand out n slots as not-ready blocks (ref -1); the caller checked room."""
        free = self._free
        start = self._fresh
        fresh = min(n, self.capacity - start)
        if n - fresh > len(free):
            raise RuntimeError(f"block pool asked for {n} slots with {self.num_free} free")
        stop = self._fresh = start + fresh
        made = self._by_slot
        if stop > len(made):
            made.extend(map(Block, range(len(made), stop)))
        blocks = made[start:stop]
        if fresh < n:
            reused = free[len(free) - (n - fresh) :]
            del free[len(free) - (n - fresh) :]
            reused.reverse()
            blocks += reused
        for block in blocks:
            block.ref = -1
            block.loaded = False
        return blocks

    def free(self, blocks: Iterable[Block]) -> None:
        """Take back the blocks that left the tier."""
        self._free.extend(blocks)

    def reset(self) -> None:
        """Every slot free and unused again (a full reset of the tier)."""
        self._fresh = 0
        self._free = []

    def free_slots(self) -> list[int]:
        """The free slots, for invariant checks (not the hot path)."""
        return [*range(self._fresh, self.capacity), *(block.slot for block in self._free)]

    def check_slots(self, start: int, stop: int) -> list[str]:
        """What is wrong with the blocks of slots [start, stop), block by block.

        Each slot's block must still name that slot and have no reference
        count below -1 (a slot never handed out has no block yet). Both are
        local to a block, so any window can be checked alone, in one pass.
        """
        suspects = [
            (slot, block)
            for slot, block in enumerate(self._by_slot[start:stop], start)
            if block.slot != slot or block.ref < -1
        ]
        problems = []
        if any(block.slot != slot for slot, block in suspects):
            problems.append("a slot is owned twice")
        if any(block.ref < -1 for _, block in suspects):
            problems.append("a negative reference count")
        return problems

    def check_next_slots(self, count: int) -> list[str]:
        """check_slots over the next ``count`` slots after the last call's, wrapping."""
        start = self._cursor
        stop = min(start + count, self.capacity)
        self._cursor = stop % self.capacity
        return self.check_slots(start, stop)

    def holders_are_distinct(self, used: Iterable[Block]) -> bool:
        """No block is used twice, or both used and free, and none is in a slot still counted
        as unused (O(blocks): not for scrapes)."""
        blocks = list(chain(used, self._free))
        fresh = self._fresh
        return len(set(map(id, blocks))) == len(blocks) and all(b.slot < fresh for b in blocks)
