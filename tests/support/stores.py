"""A whole store through a manager, as the offloading connector makes it."""

from __future__ import annotations

from offload import CPUOffloadingManager
from offload.base import BlockHash


def stored(
    manager: CPUOffloadingManager, hashes: list, parent: BlockHash | None = None
) -> list[BlockHash]:
    """Store and complete ``hashes`` (continuing a chain from ``parent``); the evicted hashes.

    The test fails if the manager refuses the store.
    """
    out = manager.prepare_store(hashes, parent=parent)
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)
    return out.block_hashes_evicted
