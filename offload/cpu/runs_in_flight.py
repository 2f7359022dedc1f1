"""The runs of prompt chains being written to the tier, so stored events name their parents.

A store's new blocks lie along one prompt's chain (or several: vLLM's KV
cache groups) in runs of consecutive blocks, each run after the chain's
start or a block that is not new (held already, refused, or named twice).
A stored event is one run under the block before it, so a consumer can tell
which held blocks a prefix lookup still reaches. Engines complete a store
whole, so a run is kept as one entry, not one per block, and completing it
costs a lookup and a list comparison; a completion that takes part of a run,
skips some of its blocks or reverses them (or a failed copy of some) pays
for splitting the runs it touches instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from offload.base import BlockHash

Run = tuple[list[BlockHash], BlockHash | None]
"""A run's blocks, in chain order, and the block before the first (None: not known, or the
chain's start)."""


class RunsInFlight:
    """The runs of blocks being written, each under the block before it."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[BlockHash, Run] = {}
        """A run's first block -> the run. Every block being written is in one run."""

    def add(self, blocks: list[BlockHash], parent: BlockHash | None) -> None:
        """One run of new blocks (a copy of the list is kept: the caller hands it on)."""
        self._runs[blocks[0]] = (list(blocks), parent)

    def mark(
        self,
        requested: list[BlockHash],
        new: list[BlockHash],
        parent: BlockHash | None,
        restarts: Mapping[int, BlockHash | None],
    ) -> None:
        """The runs ``new`` forms along the chains ``requested`` (the first from ``parent``,
        another chain from each position of ``restarts``, under its parent there)."""
        runs = self._runs
        unplaced = set(new)
        previous, run = parent, None
        for index, block_hash in enumerate(requested):
            if index in restarts:
                previous, run = restarts[index], None
            if block_hash in unplaced:
                unplaced.discard(block_hash)  # a hash named twice is stored once
                if run is None:
                    run = []
                    runs[block_hash] = (run, previous)
                run.append(block_hash)
            else:
                run = None
            previous = block_hash

    def complete(self, stored: list[BlockHash]) -> list[Run]:
        """The runs ``stored`` forms (blocks being written that became readable, in the
        caller's order), which leave; what is left of a run it took in part stays."""
        runs = self._runs
        run = runs.get(stored[0])
        if run is not None and run[0] == stored:  # one whole run: the common case
            del runs[stored[0]]
            return [run]
        done: list[Run] = []
        start = 0
        while start < len(stored):  # whole runs, in order
            run = runs.get(stored[start])
            if run is None or stored[start : start + len(run[0])] != run[0]:
                return done + self.take(stored[start:])
            del runs[stored[start]]
            done.append(run)
            start += len(run[0])
        return done

    def take(self, block_hashes: list[BlockHash]) -> list[Run]:
        """The runs ``block_hashes`` forms in the order given, each under the block before it
        in its chain; they leave, and each run they took in part is split into what is left.

        O(blocks being written): for the rare completion of part of a store, and its
        failure. A hash in no run (its run dropped when a policy failed part way through
        a rollback) is a run of its own, under no known block.
        """
        runs = self._runs
        taken = set(block_hashes)
        touched = [first for first, (blocks, _) in runs.items() if not taken.isdisjoint(blocks)]
        before: dict[BlockHash, BlockHash | None] = {}
        for first in touched:
            blocks, previous = runs.pop(first)
            left: list[BlockHash] | None = None
            for block_hash in blocks:
                before[block_hash] = previous
                if block_hash in taken:
                    left = None
                elif left is None:
                    left = [block_hash]
                    runs[block_hash] = (left, previous)
                else:
                    left.append(block_hash)
                previous = block_hash
        found: list[Run] = []
        for block_hash in block_hashes:
            known = block_hash in before
            previous = before.pop(block_hash, None)
            if known and found and found[-1][0][-1] == previous:
                found[-1][0].append(block_hash)
            else:
                found.append(([block_hash], previous))
        return found

    def clear(self) -> None:
        self._runs.clear()
