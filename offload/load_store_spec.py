"""Where blocks live: the location half of a load or store.

The scheduler side decides *which* slots; the worker side moves bytes into or
out of them. A spec is the message between the two, so it names slots only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class LoadStoreSpec(ABC):
    """Locations of blocks on one medium."""

    @staticmethod
    @abstractmethod
    def medium() -> str:
        """The medium's name as it appears in events and metrics ("CPU", "GPU")."""


@dataclass(frozen=True, slots=True)
class CPULoadStoreSpec(LoadStoreSpec):
    """Slots of the CPU tier, one per offloaded block, in request order."""

    block_ids: list[int]

    @staticmethod
    def medium() -> str:
        return "CPU"
