"""The contract every offloading tier keeps, in one place.

Block hashes, manager events, load/store specs, the answer to
``prepare_store``, the manager's calls and ``Closeable``: what vLLM's
connector, the demo worker and the tests hold a tier to. Nothing here
depends on the rest of ``offload``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import msgspec

BlockHash = Hashable
"""A block's identity. Opaque to kvscope: bytes in vLLM, ints in traces."""


class OffloadingEvent(msgspec.Struct, frozen=True, gc=False):
    """A batch of blocks that became readable in, or left, one medium.

    Events are the manager's only outward report of state changes, so they
    carry everything a consumer (the publisher, the sidecar) needs to mirror
    the tier without asking the manager again. A msgspec Struct because one is
    built on every store and eviction, on the scheduler's thread: it is built
    in C and, with ``gc=False``, never tracked by the cycle collector (it can
    hold no cycle). Positional order matches vLLM's ``OffloadingEvent``.
    """

    block_hashes: list[BlockHash]
    block_size: int
    medium: str
    removed: bool
    parent_block_hash: BlockHash | None = None
    """For a store whose blocks continue one prompt's chain, the block before the first
    (vLLM's ``BlockStored`` meaning): a consumer can tell which held blocks a prefix lookup
    still reaches. None: the chain's first block, or a store that names no chain."""
    group_idx: int | None = None
    """The KV cache group whose copies of the blocks these are, where a tier keeps one per
    group (vLLM's ``group_idx``: a hybrid model's groups each store and remove their own);
    None where it names none (one group)."""


class LoadStoreSpec(ABC):
    """Where blocks live on one medium: the message from scheduler to worker side.

    The scheduler side decides *which* slots; the worker side moves bytes into
    or out of them. A spec therefore names slots only.
    """

    @staticmethod
    @abstractmethod
    def medium() -> str:
        """The medium's name as it appears in events and metrics ("CPU", "GPU")."""


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """The answer to prepare_store: what to copy, where, and what was evicted."""

    block_hashes_to_store: list[BlockHash]
    store_spec: LoadStoreSpec
    block_hashes_evicted: list[BlockHash]


class OffloadingManager(ABC):
    """Tracks which blocks an offloading tier holds and decides what it keeps.

    vLLM's connector drives a manager through exactly these calls; keeping
    the interface abstract lets the demo worker, the tests and vLLM drive any
    tier the same way.
    """

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
    def prepare_store(
        self, block_hashes: Iterable[BlockHash], *, parent: BlockHash | None = None
    ) -> PrepareStoreOutput | None:
        """Reserve slots for blocks not yet stored, evicting if needed; None if impossible.

        ``block_hashes`` continue one prompt's chain from ``parent`` (None: its
        first block, or not known).
        """

    @abstractmethod
    def complete_store(
        self, block_hashes: Iterable[BlockHash], success: bool = True
    ) -> Sequence[BlockHash]:
        """Make stored blocks readable, or roll them back when the copy failed.

        Returns the hashes whose state changed (stored, or forgotten).
        """

    @abstractmethod
    def take_events(self) -> Iterable[OffloadingEvent]:
        """Stored and removed events since the last call, in order."""


class Closeable(ABC):
    """A resource holding threads or sockets; ``close()`` is idempotent, ``with`` calls it.

    The publisher, every transfer backend and the sidecar own background
    threads; one base gives them the same close-on-exit behaviour.
    """

    @abstractmethod
    def close(self) -> None:
        """Release the resource; calling it again does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def positive_count(name: str, value: int, maximum: int | None = None) -> int:
    """``value``, if it is an int (not a bool) of at least 1 and at most ``maximum``.

    Otherwise a TypeError or ValueError naming ``name``: a float, a bool or a
    string given as a size is a caller's mistake to report, not to round.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value
