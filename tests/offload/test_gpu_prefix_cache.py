"""The demo's GPU prefix-cache stand-in: vLLM's prefix rule, LRU order, GPU events."""

from __future__ import annotations

import pytest

from offload.base import OffloadingEvent
from offload.sim.gpu_prefix_cache import GPU_MEDIUM, GPUPrefixCache


def stored(*hashes: int, parent: int | None = None) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, GPU_MEDIUM, False, parent)


def removed(*hashes: int) -> OffloadingEvent:
    return OffloadingEvent(list(hashes), 16, GPU_MEDIUM, True)


def test_a_hit_is_the_leading_run_of_resident_blocks() -> None:
    cache = GPUPrefixCache(capacity_blocks=8, block_size=16)
    assert cache.lookup([1, 2, 3]) == 0
    cache.admit([1, 2, 3])
    assert cache.lookup([1, 2, 3, 4]) == 3
    assert cache.lookup([1, 9, 3]) == 1  # the first miss ends the hit
    assert cache.lookup([9, 1, 2]) == 0
    assert (cache.lookup_blocks, cache.hit_blocks) == (13, 4)


def test_stores_name_the_block_before_each_run_of_new_blocks_as_its_parent() -> None:
    cache = GPUPrefixCache(capacity_blocks=16, block_size=16)
    cache.admit([1, 3])
    cache.take_events()
    cache.admit([1, 2, 3, 4, 5])  # 1 and 3 held: two runs, [2] under 1 and [4, 5] under 3
    assert cache.take_events() == [stored(2, parent=1), stored(4, 5, parent=3)]


def test_admit_stores_the_new_blocks_and_touches_the_resident_ones() -> None:
    cache = GPUPrefixCache(capacity_blocks=4, block_size=16)
    assert cache.admit([1, 2, 3]) == []
    assert cache.take_events() == [stored(1, 2, 3)]
    assert cache.admit([1, 4]) == []  # 1 touched: now 2 is the least recent
    assert cache.take_events() == [stored(4, parent=1)]
    assert cache.admit([5, 6]) == [(1, [2, 3])]  # one run of 1's chain
    assert cache.take_events() == [stored(5, 6), removed(2, 3)]
    assert [h in cache for h in (1, 2, 3, 4, 5, 6)] == [True, False, False, True, True, True]
    assert cache.take_events() == []
    assert (cache.stored_blocks, cache.evicted_blocks) == (6, 2)


def test_the_cache_never_holds_more_than_its_capacity() -> None:
    cache = GPUPrefixCache(capacity_blocks=3, block_size=16)
    for start in range(0, 40, 2):
        cache.admit(list(range(start, start + 5)))
        assert len(cache) == 3
    # A request longer than the cache keeps its last blocks and evicts its first,
    # stored then removed, so a mirror replaying the events ends with what is resident.
    cache.take_events()
    mirror = {40, 41, 42}  # the last admit's last three blocks
    assert all(h in cache for h in mirror)
    cache.admit([100, 101, 102, 103, 104])
    for event in cache.take_events():
        assert event.medium == GPU_MEDIUM
        if event.removed:
            mirror -= set(event.block_hashes)
        else:
            mirror |= set(event.block_hashes)
    assert mirror == {102, 103, 104} and len(cache) == 3
    assert all(h in cache for h in mirror)


def test_an_empty_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 block"):
        GPUPrefixCache(capacity_blocks=0, block_size=16)
