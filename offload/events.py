"""Offloading events: what the manager stored in or removed from its tier.

Events are the manager's only outward report of state changes, so they carry
everything a consumer (the KV-event publisher, the sidecar) needs to mirror the
tier without asking the manager again: which blocks, their size in tokens, the
medium they live on, and whether they arrived or left.
"""

from __future__ import annotations

from collections.abc import Hashable

import msgspec

BlockHash = Hashable
"""A block's identity. Opaque to kvscope: bytes in vLLM, ints in traces."""


class OffloadingEvent(msgspec.Struct, frozen=True, gc=False):
    """A batch of blocks that became readable in, or left, one medium.

    A msgspec Struct because one is built on every store and every eviction,
    on the scheduler's thread: it is built in C (measured here: 30 ns, against
    300 ns for a NamedTuple, whose ``__new__`` is Python code) and, with
    ``gc=False``, is never tracked by the cycle collector (it holds a list of
    hashes and a few scalars, so it can never be part of a cycle).
    Positional order matches vLLM's ``OffloadingEvent``.
    """

    block_hashes: list[BlockHash]
    block_size: int
    medium: str
    removed: bool
