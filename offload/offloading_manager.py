"""The scheduler-side contract every offloading tier keeps.

vLLM's connector drives a manager through exactly these calls; keeping the
interface abstract lets the replay engine, the tests and vLLM drive any tier
(CPU today, others later) the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from offload.events import BlockHash, OffloadingEvent
from offload.load_store_spec import LoadStoreSpec


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """The answer to prepare_store: what to copy, where, and what was evicted."""

    block_hashes_to_store: list[BlockHash]
    store_spec: LoadStoreSpec
    block_hashes_evicted: list[BlockHash]


class OffloadingManager(ABC):
    """Tracks which blocks an offloading tier holds and decides what it keeps."""

    @abstractmethod
    def lookup(self, block_hashes: Sequence[BlockHash]) -> int:
        """Length of the leading run of blocks that are stored and ready."""

    @abstractmethod
    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        """Pin blocks for reading; every block must be stored and ready."""

    @abstractmethod
    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Mark blocks as recently used, as the policy defines it."""

    @abstractmethod
    def complete_load(self, block_hashes: Iterable[BlockHash]) -> None:
        """Unpin blocks pinned by prepare_load."""

    @abstractmethod
    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        """Reserve slots for blocks not yet stored, evicting if needed; None if impossible."""

    @abstractmethod
    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        """Make stored blocks readable, or roll them back when the copy failed."""

    @abstractmethod
    def take_events(self) -> Iterable[OffloadingEvent]:
        """Stored and removed events since the last call, in order."""
