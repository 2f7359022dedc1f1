"""Spreading a map of a million blocks over many dicts, by hash.

CPython rebuilds a dict that churn has filled with deleted slots in one call,
holding the interpreter throughout: a dict of a million blocks stalls ingest
and every request for 50 to 90 ms. The block index and the stranded count
keep one such map each, so each splits it over ``SHARDS`` dicts (``shard_of``).
A rebuild then holds the interpreter for a ``SHARDS``-th of that, and other
threads run between two rebuilds even when several come in one batch.

``SHARDS`` is prime: with a power of two, keys that share their low bits would
share a shard and, in it, collide, since a dict picks slots by the same low
bits. Runs of ``2 ** SHARD_RUN`` sequential ids (Mooncake's hash ids are
sequential) share a shard, so they touch the memory they did in one dict
and the shards fill, and rebuild, at different times.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

SHARDS: Final = 61
SHARD_RUN: Final = 12


def shard_of(key: Hashable) -> int:
    """The shard of ``key`` (the per-block loops of the index inline this expression)."""
    return (hash(key) >> SHARD_RUN) % SHARDS
