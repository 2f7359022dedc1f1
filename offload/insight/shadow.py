"""Shadow tiers: the registered policies themselves, at the capacities a curve asks about.

A policy other than LRU has no stack property (ARC at c does not hold a
subset of ARC at c + 1), so its curve needs one tier per capacity. Each
shadow is a real ``CPUOffloadingManager`` driven by the canonical workload's
``run_request``, so a shadow hits exactly what a replay of the same requests
would; on a sample, the capacities are scaled by the rate (see estimator).
Nothing reads a shadow's miss reasons, so its manager keeps none.

Memory: each tier what its policy states a tier of its capacity keeps at most
(``CachePolicy.metadata_bound``; a shadow keeps no miss reasons, so none are counted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from offload.base import BlockHash
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import metadata_bound
from offload.sim.workload import run_request

_BLOCK_SIZE = 1
"""Tokens per block do not change what a tier hits; events stay off."""


def max_bytes(policies: Sequence[str], capacities: Sequence[int]) -> int:
    """The most the tiers of ``policies`` at ``capacities`` keep, each full (see the module
    docstring): what a caller sizes them by before it builds them."""
    return sum(metadata_bound(policy).at(c) for policy in policies for c in capacities if c)


class ShadowTiers:
    """One manager per (policy, capacity); a capacity of 0 hits nothing and holds nothing."""

    def __init__(self, policies: Iterable[str], capacities: Sequence[int]) -> None:
        self.capacities = tuple(capacities)
        if any(type(c) is not int or c < 0 for c in self.capacities):
            raise ValueError(f"shadow capacities must be whole numbers >= 0, got {capacities}")
        # make_policy refuses an unknown name, naming the known ones.
        self._tiers = {
            policy: [
                CPUOffloadingManager(_BLOCK_SIZE, c, policy, attribute_misses=False) if c else None
                for c in self.capacities
            ]
            for policy in policies
        }
        self._hits = {policy: [0] * len(self.capacities) for policy in self._tiers}

    @property
    def policies(self) -> list[str]:
        return list(self._tiers)

    @property
    def held_blocks(self) -> int:
        """Blocks resident across every shadow: at most the sum of their capacities."""
        return sum(
            len(tier.policy.blocks) for tiers in self._tiers.values() for tier in tiers if tier
        )

    @property
    def estimated_bytes(self) -> int:
        """The memory of the tiers now, estimated as for ``max_bytes`` from the blocks each
        holds: a tier's histories fill no sooner than its slots."""
        return sum(
            metadata_bound(policy).at(len(tier.policy.blocks))
            for policy, tiers in self._tiers.items()
            for tier in tiers
            if tier
        )

    @property
    def touched_blocks(self) -> int:
        """Blocks resident in the largest shadow that holds most: every block seen, up to
        that capacity."""
        return max(
            (len(tiers[-1].policy.blocks) for tiers in self._tiers.values() if tiers[-1]),
            default=0,
        )

    def hits(self, policy: str) -> tuple[int, ...]:
        return tuple(self._hits[policy])

    def add(self, block_hashes: Sequence[BlockHash]) -> None:
        """One request through every shadow."""
        for policy, tiers in self._tiers.items():
            hits = self._hits[policy]
            for index, tier in enumerate(tiers):
                if tier is not None:
                    hits[index] += run_request(tier, block_hashes)
