"""Where blocks live in the CPU tier: the slots a load or store names."""

from __future__ import annotations

from dataclasses import dataclass

from offload.base import LoadStoreSpec


@dataclass(frozen=True, slots=True)
class CPULoadStoreSpec(LoadStoreSpec):
    """Slots of the CPU tier, one per offloaded block, in request order."""

    block_ids: list[int]

    @staticmethod
    def medium() -> str:
        return "CPU"
