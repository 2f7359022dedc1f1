"""Offloading events: what the manager stored in or removed from its tier.

Events are the manager's only outward report of state changes, so they carry
everything a consumer (the KV-event publisher, the sidecar) needs to mirror the
tier without asking the manager again: which blocks, their size in tokens, the
medium they live on, and whether they arrived or left.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

BlockHash = Hashable
"""A block's identity. Opaque to kvscope: bytes in vLLM, ints in traces."""


class OffloadingEvent(NamedTuple):
    """A batch of blocks that became readable in, or left, one medium.

    A NamedTuple rather than a frozen dataclass: one is built on every store
    and eviction, and a frozen dataclass costs several times more to build.
    """

    block_hashes: list[BlockHash]
    block_size: int
    medium: str
    removed: bool
