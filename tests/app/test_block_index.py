"""The sidecar's live block index: events across publishers and media, queries, the cap.

The property test at the end drives the index and a deliberately naive model
(a dict of sets) with the same random event sequences and compares every
observable: entries, locations, counts, hits, listing order and the counters.
"""

from __future__ import annotations

import gc
from bisect import bisect_right
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.decode import DEFAULT_MEDIUM, DecodedBatch, DecodedEvent
from app.settings import MAX_PAGE_LIMIT
from app.state.block_index import (
    PAGE_SCAN,
    PART_BLOCKS,
    BlockIndex,
    PrefixMatch,
    Usage,
)
from app.state.locations import LOCATIONS_PER_HOST, MAX_GROUPS, MAX_LOCATIONS, MEDIA_PER_PUBLISHER
from app.state.stranded import MAX_REHANG_LINKS


def stored(
    hashes: list,
    medium: str | None = "CPU",
    block_size: int = 16,
    parent: int | None = None,
    group: int | None = None,
) -> DecodedEvent:
    return DecodedEvent("stored", hashes, medium, block_size, parent, group)


def removed(hashes: list, medium: str | None = "CPU", group: int | None = None) -> DecodedEvent:
    return DecodedEvent("removed", hashes, medium, group=group)


CLEARED = DecodedEvent("cleared", [])


def batch(*events: DecodedEvent) -> DecodedBatch:
    return DecodedBatch(0.0, None, list(events))


def walk(index: BlockIndex, limit: int, **filters: str) -> list[Hashable]:
    """Every entry's hash, page by page, following the cursors."""
    hashes: list[Hashable] = []
    cursor = None
    while True:
        entries, cursor = index.page(cursor=cursor, limit=limit, **filters)
        hashes += [entry.block_hash for entry in entries]
        if cursor is None:
            return hashes


# --- events -----------------------------------------------------------------------


def test_stored_and_removed_across_publishers_and_media() -> None:
    index = BlockIndex(max_blocks=100)
    index.apply("a", batch(stored([1, 2], None), stored([1], "CPU")), now=1.0)
    index.apply("b", batch(stored([b"x", 1], "CPU")), now=2.0)

    one = index.get(1)
    assert one is not None
    assert (one.media, one.publishers) == (("CPU", "GPU"), ("a", "b"))
    assert (one.first_stored, one.last_stored, one.block_size) == (1.0, 2.0, 16)
    assert index.blocks_by_medium() == {"GPU": 2, "CPU": 3}

    index.apply("a", batch(removed([1], None), removed([2], None)), now=3.0)
    assert index.get(2) is None  # its only location went
    one = index.get(1)
    assert one is not None
    assert one.media == ("CPU",)
    assert index.blocks_by_medium() == {"GPU": 0, "CPU": 3}
    assert len(index) == 2


def test_event_without_medium_is_the_gpu() -> None:
    index = BlockIndex(max_blocks=10)
    index.apply("a", batch(stored([1], None)), now=0.0)
    entry = index.get(1)
    assert entry is not None
    assert entry.media == (DEFAULT_MEDIUM,) == ("GPU",)
    index.apply("a", batch(removed([1], "GPU")), now=0.0)
    assert index.get(1) is None


def test_removal_of_an_unheld_location_changes_nothing_and_is_counted() -> None:
    index = BlockIndex(max_blocks=10)
    index.apply("a", batch(stored([1], "CPU")), now=0.0)
    index.apply("a", batch(removed([1], "GPU"), removed([2], "CPU")), now=0.0)
    index.apply("b", batch(removed([1], "CPU")), now=0.0)
    assert index.untracked_removals == 3
    entry = index.get(1)
    assert entry is not None
    assert entry.media == ("CPU",)


def test_cleared_drops_only_that_publishers_blocks() -> None:
    index = BlockIndex(max_blocks=10)
    index.apply("a", batch(stored([1, 2]), stored([1], None)), now=0.0)
    index.apply("b", batch(stored([2, 3])), now=0.0)
    index.apply("a", batch(CLEARED, stored([4])), now=1.0)
    assert sorted(walk(index, limit=10)) == [2, 3, 4]
    entry = index.get(2)
    assert entry is not None
    assert entry.publishers == ("b",)
    assert {(row.publisher, row.medium): row.blocks for row in index.usage()} == {
        ("a", "CPU"): 1,
        ("a", "GPU"): 0,
        ("b", "CPU"): 2,
    }


def test_reset_publisher_leaves_the_other() -> None:
    index = BlockIndex(max_blocks=10)
    index.apply("a", batch(stored([1, 2])), now=0.0)
    index.apply("b", batch(stored([2, 3], None)), now=0.0)
    index.reset_publisher("a")
    index.reset_publisher("never-seen")
    assert sorted(walk(index, limit=10)) == [2, 3]
    assert index.blocks_by_medium() == {"CPU": 0, "GPU": 2}


def test_hits_count_gpu_stores_of_blocks_held_on_a_lower_tier() -> None:
    index = BlockIndex(max_blocks=10)
    index.apply("w", batch(stored([1], None)), now=1.0)  # computed on the GPU: no hit
    index.apply("w", batch(stored([1], "CPU")), now=2.0)  # offloaded: no hit
    index.apply("w", batch(removed([1], None)), now=3.0)  # evicted from the GPU
    index.apply("w", batch(stored([1], None)), now=4.0)  # loaded back: a hit
    index.apply("w", batch(stored([2], None), stored([2], None)), now=5.0)  # no lower tier
    one, two = index.get(1), index.get(2)
    assert one is not None and two is not None
    assert (one.hits, one.first_stored, one.last_stored) == (1, 1.0, 4.0)
    assert two.hits == 0


# --- sizes ------------------------------------------------------------------------


def test_bytes_only_where_block_bytes_are_known() -> None:
    index = BlockIndex(max_blocks=10)
    index.apply("a", batch(stored([1, 2]), stored([1], None)), now=0.0)
    index.apply("b", batch(stored([3])), now=0.0)
    index.set_block_bytes("a", {"CPU": 1000})
    assert index.usage() == [
        Usage("a", "CPU", 2, 2000),
        Usage("a", "GPU", 1, None),
        Usage("b", "CPU", 1, None),
    ]
    assert index.bytes_by_medium() == {"CPU": 2000}
    with pytest.raises(ValueError, match="must not be negative"):
        index.set_block_bytes("a", {"CPU": -1})
    assert index.bytes_by_medium() == {"CPU": 2000}  # the refused declaration changed nothing


def test_block_sizes_are_kept_per_publisher_for_at_most_max_media_media() -> None:
    """A stats frame's media names come from the network: each frame's declaration replaced
    nothing, so frames naming new media grew the sidecar without end (hundreds of MB)."""
    index = BlockIndex(max_blocks=10, max_media=2)
    index.apply("a", batch(stored([1, 2]), stored([3], None)), now=0.0)
    for frame in range(1000):
        index.set_block_bytes("a", {f"m{frame}-{n}": 1 for n in range(50)} | {"CPU": 1000})
    assert index.locations.refused_media["max_media"] == 1000 * 49
    index.set_block_bytes("a", {"CPU": 1000, "GPU": 10, "disk": 5})
    assert index.locations.refused_media["max_media"] == 1000 * 49 + 1
    assert index.bytes_by_medium() == {"CPU": 2000, "GPU": 10}
    assert sum(map(len, index._block_bytes.values())) == 2


# --- prefix lookup ----------------------------------------------------------------


def test_lookup_prefix_runs_per_medium_and_the_break() -> None:
    index = BlockIndex(max_blocks=10)
    index.apply("a", batch(stored([1, 2, 3, 5], "CPU"), stored([1, 2], None)), now=0.0)
    assert index.lookup_prefix([1, 2, 3, 4, 5]) == PrefixMatch({"GPU": 2, "CPU": 3}, 3)
    assert index.lookup_prefix([1, 2]) == PrefixMatch({"GPU": 2, "CPU": 2}, 2)
    assert index.lookup_prefix([9, 1]) == PrefixMatch({"GPU": 0, "CPU": 0}, 0)
    assert index.lookup_prefix([]) == PrefixMatch({"GPU": 0, "CPU": 0}, 0)
    assert BlockIndex(max_blocks=1).lookup_prefix([1]) == PrefixMatch({}, 0)


def test_lookup_prefix_counts_fine_blocks_a_coarser_block_covers_on_its_media() -> None:
    """A hybrid model's 16-token group dropped 1 and 3 from the GPU, where its 32-token group
    holds 2 and 4 (4 under 2): the fine chain runs to 4 on the GPU, as it does on the CPU,
    which holds every fine block; a 64-token group's 4 and 8 (8 under 4) cover the chain."""
    index = BlockIndex(max_blocks=100)
    fine = stored([1, 2, 3, 4, 5, 6, 7, 8], "GPU", block_size=16, group=0)
    coarse = stored([2, 4], "GPU", block_size=32, group=1)
    index.apply("vllm", batch(fine, coarse, removed([1, 3], "GPU", group=0)), 1.0)
    assert index.lookup_prefix([1, 2, 3, 4, 5]) == PrefixMatch({"GPU": 5}, 5)  # 5 sizes 2
    index.apply("kvscope", batch(stored([1, 2, 3, 4], "CPU")), 1.0)
    assert index.lookup_prefix([1, 2, 3, 4, 5]) == PrefixMatch({"GPU": 5, "CPU": 4}, 5)
    index.apply("vllm", batch(removed([5, 6, 7], "GPU", group=0)), 2.0)
    assert index.lookup_prefix(list(range(1, 9))) == PrefixMatch({"GPU": 4, "CPU": 4}, 4)
    index.apply("vllm", batch(stored([4, 8], "GPU", block_size=64, group=2)), 3.0)
    assert index.lookup_prefix(list(range(1, 9))) == PrefixMatch({"GPU": 8, "CPU": 4}, 8)


def test_lookup_prefix_covers_a_fine_block_only_on_the_coarse_copies_media() -> None:
    """A coarse block covers the fine blocks before it on the media its coarse group holds
    it: the CPU tier holds 16-token copies of 1, 2 and 4 (3 evicted) and no 32-token copy,
    so its run stops at 3, though 4's GPU copy of the 32-token group hangs under 2."""
    index = BlockIndex(max_blocks=100)
    fine = stored([1, 2, 3, 4], "GPU", block_size=16, group=0)
    coarse = stored([2, 4], "GPU", block_size=32, group=1)
    index.apply("vllm", batch(fine, coarse), 1.0)
    cpu = stored([1, 2, 3, 4], "CPU", block_size=16, group=0)
    index.apply("kvscope", batch(cpu, removed([3], "CPU", group=0)), 1.0)
    assert index.lookup_prefix([1, 2, 3, 4]) == PrefixMatch({"GPU": 4, "CPU": 2}, 4)


def test_lookup_prefix_takes_no_run_of_an_unknown_parent_for_a_cover() -> None:
    """kvscope's CPU stream names no parent for a run whose block before the tier never met:
    such a run of fine blocks covers nothing before it."""
    index = BlockIndex(max_blocks=100)
    index.apply("kvscope", batch(stored([3, 4], "CPU")), 1.0)
    assert index.lookup_prefix([1, 2, 3, 4]) == PrefixMatch({"CPU": 0}, 0)


# --- listing ----------------------------------------------------------------------


def test_page_cursor_is_stable_across_inserts_and_removals() -> None:
    index = BlockIndex(max_blocks=100)
    index.apply("a", batch(stored(list(range(5)))), now=0.0)
    first, cursor = index.page(limit=2)
    assert [entry.block_hash for entry in first] == [0, 1]
    index.apply("a", batch(stored([10, 0], parent=4), removed([2])), now=1.0)  # 0 is not new
    second, cursor = index.page(cursor=cursor, limit=2)
    assert [entry.block_hash for entry in second] == [3, 4]
    third, cursor = index.page(cursor=cursor, limit=2)
    assert [entry.block_hash for entry in third] == [10]
    assert cursor is None


def test_a_short_page_cursor_is_stable_across_inserts_and_removals() -> None:
    """Pages cut short by the scan (two records each) continue where the scan stopped."""
    index = BlockIndex(max_blocks=100, page_scan=2)
    index.apply("a", batch(stored(list(range(5)))), now=0.0)
    first, cursor = index.page(limit=10)
    assert ([entry.block_hash for entry in first], cursor) == ([0, 1], first[-1].seq)
    index.apply("a", batch(stored([10, 0], parent=4), removed([2])), now=1.0)  # 0 is not new
    second, cursor = index.page(cursor=cursor, limit=10)
    assert [entry.block_hash for entry in second] == [3]
    index.apply("a", batch(removed([4]), stored([2])), now=2.0)  # 2 again: a new entry
    third, cursor = index.page(cursor=cursor, limit=10)  # 4 (gone), then 10
    assert [entry.block_hash for entry in third] == [10]
    fourth, cursor = index.page(cursor=cursor, limit=10)
    assert ([entry.block_hash for entry in fourth], cursor) == ([2], None)


def test_a_selective_filter_finds_every_match_once_in_scans_of_bounded_length() -> None:
    """Each page examines at most ``PAGE_SCAN`` listing records: its cursor moves on by at
    most that many, and pages between sparse matches come short or empty, never last."""
    blocks = 3 * PAGE_SCAN + 100
    index = BlockIndex(max_blocks=blocks)
    index.apply("a", batch(stored(list(range(blocks)), None)), now=0.0)
    rare = [7, 8, 9, 2 * PAGE_SCAN + 50, blocks - 1]
    index.apply("a", batch(*(stored([h], parent=h - 1) for h in rare)), now=1.0)
    seqs = sorted(entry.seq for entry in map(index.get, range(blocks)) if entry is not None)
    pages: list[list[Hashable]] = []
    cursor = None
    while True:
        entries, after = index.page(medium="CPU", cursor=cursor, limit=2)
        pages.append([entry.block_hash for entry in entries])
        start = 0 if cursor is None else bisect_right(seqs, cursor)
        examined = (len(seqs) if after is None else bisect_right(seqs, after)) - start
        assert 0 < examined <= PAGE_SCAN
        if after is None:
            break
        cursor = after
    assert pages == [[7, 8], [9], [], [2 * PAGE_SCAN + 50], [blocks - 1]]


def test_a_recreated_block_lists_after_the_cursor() -> None:
    index = BlockIndex(max_blocks=100)
    index.apply("a", batch(stored([1, 2, 3])), now=0.0)
    index.apply("a", batch(removed([1]), stored([1])), now=0.0)
    assert walk(index, limit=1) == [2, 3, 1]


def test_page_limit_is_enforced() -> None:
    index = BlockIndex(max_blocks=5000)
    index.apply("a", batch(stored(list(range(MAX_PAGE_LIMIT + 10)))), now=0.0)
    entries, cursor = index.page(limit=10**9)
    assert len(entries) == MAX_PAGE_LIMIT
    assert cursor == entries[-1].seq
    entries, cursor = index.page(limit=MAX_PAGE_LIMIT, cursor=cursor)
    assert (len(entries), cursor) == (10, None)
    for limit in (0, -1):
        with pytest.raises(ValueError, match="limit"):
            index.page(limit=limit)
    with pytest.raises(ValueError, match="page_scan must be at least 1, got 0"):
        BlockIndex(max_blocks=1, page_scan=0)


def test_page_filters_by_medium_and_publisher() -> None:
    index = BlockIndex(max_blocks=100)
    index.apply("a", batch(stored([1, 2], None), stored([2, 3], "CPU")), now=0.0)
    index.apply("b", batch(stored([4, 1], "CPU")), now=0.0)
    assert walk(index, limit=1, medium="CPU") == [1, 2, 3, 4]
    assert walk(index, limit=1, medium="GPU") == [1, 2]
    assert walk(index, limit=1, publisher="b") == [1, 4]
    assert walk(index, limit=1, publisher="a", medium="CPU") == [2, 3]
    assert index.page(publisher="nobody") == ([], None)
    assert index.page(medium="STORAGE") == ([], None)


def test_listing_survives_compaction() -> None:
    index = BlockIndex(max_blocks=10_000)
    index.apply("a", batch(stored(list(range(5000)))), now=0.0)
    index.apply("a", batch(removed(list(range(0, 5000, 2)))), now=0.0)
    index.apply("a", batch(removed(list(range(1, 4000, 2)))), now=0.0)
    assert walk(index, limit=333) == list(range(4001, 5000, 2))


def test_compaction_keeps_recreated_blocks_last_and_open_cursors_valid() -> None:
    index = BlockIndex(max_blocks=10_000)
    index.apply("a", batch(stored(list(range(3000)))), now=0.0)
    index.apply("a", batch(removed(list(range(0, 3000, 2)))), now=0.0)
    index.apply("a", batch(stored([10, 4, 2])), now=0.0)  # recreated: listed after the rest
    first, cursor = index.page(limit=100)
    assert [entry.block_hash for entry in first] == list(range(1, 200, 2))
    # Dropping odds up to 2399 leaves 303 live items of 3003: the listing is rebuilt.
    index.apply("a", batch(removed(list(range(1, 2400, 2)))), now=0.0)
    rest: list[Hashable] = []
    while cursor is not None:
        entries, cursor = index.page(cursor=cursor, limit=100)
        rest += [entry.block_hash for entry in entries]
    assert rest == [*range(2401, 3000, 2), 10, 4, 2]
    assert walk(index, limit=7) == rest


# --- the cap ----------------------------------------------------------------------


def test_a_full_index_refuses_new_blocks_and_counts_them() -> None:
    index = BlockIndex(max_blocks=3)
    index.apply("a", batch(stored([1, 2, 3, 4, 5])), now=0.0)
    assert (len(index), index.overflow) == (3, 2)
    assert index.get(4) is None
    index.apply("b", batch(stored([1], None)), now=0.0)  # a new location of a known block
    one = index.get(1)
    assert one is not None
    assert one.publishers == ("a", "b")
    index.apply("a", batch(removed([2]), stored([6, 7])), now=0.0)
    assert (sorted(walk(index, limit=5)), index.overflow) == ([1, 3, 6], 3)


def stranded_by_medium(index: BlockIndex) -> dict[str, int]:
    """Stranded blocks per medium over every publisher, from the index's usage rows."""
    totals: dict[str, int] = {}
    for row in index.usage():
        totals[row.medium] = totals.get(row.medium, 0) + row.stranded
    return totals


def test_blocks_behind_an_evicted_parent_are_stranded_until_it_returns() -> None:
    index = BlockIndex(100)
    index.apply("w", batch(stored([1, 2, 3]), stored([4], parent=3)), now=0.0)
    assert stranded_by_medium(index) == {"CPU": 0}
    index.apply("w", batch(removed([2])), now=0.0)  # the chain breaks under 1
    assert stranded_by_medium(index) == {"CPU": 2}  # 3 and 4: held, unreachable
    index.apply("w", batch(stored([2], medium="GPU", parent=1)), now=0.0)
    assert stranded_by_medium(index) == {"CPU": 0, "GPU": 0}  # reached through the GPU's copy
    index.apply("w", batch(removed([1]), stored([9], parent=1)), now=0.0)
    assert stranded_by_medium(index) == {"CPU": 3, "GPU": 1}  # 3, 4, 9 and the GPU's 2


# --- the garbage collector -------------------------------------------------------


def references_the_collector_follows() -> int:
    """What a full collection walks: every reference held by an object it tracks."""
    return sum(len(gc.get_referents(tracked)) for tracked in gc.get_objects())


def test_a_full_collection_walks_nothing_of_a_large_index() -> None:
    """Its pause grows with what it walks, so an index of millions must add nothing to it:
    not under churn (freshly stored blocks included), not for a parent of thousands of
    children (a system prompt every conversation opens with)."""
    blocks, root = 100_000, -1
    index = BlockIndex(max_blocks=2 * blocks)
    gc.collect()
    before = references_the_collector_follows()
    index.apply("a", batch(stored([root])), now=0.0)
    for start in range(0, blocks, 10):  # 10,000 conversations of 10 blocks, all under root
        index.apply("a", batch(stored(list(range(start, start + 10)), parent=root)), now=0.0)
    gc.collect()
    # what is left is the listing's open chunk, a list of fewer than 4,096 records
    assert references_the_collector_follows() - before < 5000
    for start in range(blocks, blocks + 2000, 10):  # churn since the last collection
        index.apply("a", batch(removed(list(range(start - blocks, start - blocks + 10)))), 0.0)
        index.apply("a", batch(stored(list(range(start, start + 10)))), now=0.0)
    assert references_the_collector_follows() - before < blocks // 10
    index.apply("a", batch(removed([root])), now=0.0)
    assert len(index) == blocks
    assert stranded_by_medium(index) == {"CPU": blocks - 2000}  # the conversations left


def test_a_block_leaves_a_medium_with_its_last_kv_cache_groups_copy() -> None:
    """vLLM's hybrid models hold a block once per KV cache group, each copy stored and
    removed on its own (a sliding-window group lets its copies go first). Keyed by
    (publisher, medium) the first group's removal dropped the block from the GPU while
    the full-attention group still held it, and the later removal counted as untracked."""
    index = BlockIndex(max_blocks=100)
    index.apply("w", batch(stored([1, 2], None, group=0), stored([1, 2], None, group=1)), 1.0)
    assert index.usage() == [Usage("w", "GPU", 4, None)], "two copies of two blocks"
    index.apply("w", batch(removed([1, 2], None, group=1)), now=2.0)
    entry = index.get(1)
    assert entry is not None and entry.media == ("GPU",)
    assert index.lookup_prefix([1, 2]) == PrefixMatch({"GPU": 2}, 2)
    assert index.usage() == [Usage("w", "GPU", 2, None)]
    index.apply("w", batch(removed([1, 2], None, group=0)), now=3.0)
    assert index.get(1) is None and len(index) == 0
    assert index.untracked_removals == 0


def test_kv_cache_groups_and_locations_past_their_caps_are_refused_and_counted() -> None:
    """Groups are location bits, and the network names them: a peer naming thousands
    would make every mask that wide, and every walk over one that long."""
    index = BlockIndex(max_blocks=10_000)
    index.apply("w", batch(*(stored([g], None, group=g) for g in range(MAX_GROUPS + 10))), 1.0)
    assert index.locations.refused_location_events == 10
    assert index.usage() == [Usage("w", "GPU", MAX_GROUPS, None)]
    index.apply("v", batch(stored([1], None, group=MAX_GROUPS + 5)), now=2.0)
    assert index.locations.refused_location_events == 10, (
        "the group cap is per publisher and medium"
    )
    for publisher in range(MAX_LOCATIONS // MAX_GROUPS + 1):
        groups = [stored([10], None, group=g) for g in range(MAX_GROUPS)]
        index.apply(f"p{publisher}", batch(*groups), now=3.0)
    assert len(index.locations.names) == MAX_LOCATIONS
    tried = MAX_GROUPS + 1 + (MAX_LOCATIONS // MAX_GROUPS + 1) * MAX_GROUPS
    assert index.locations.refused_location_events == 10 + tried - MAX_LOCATIONS


def test_a_publisher_past_its_media_share_takes_the_place_of_its_own_empty_location() -> None:
    """One publisher names at most ``MEDIA_PER_PUBLISHER`` media, or one peer took every
    medium; past them its own locations that hold nothing are released. A released bit
    carries nothing of its last location: a lower tier's bit reused on the GPU made
    another engine's GPU store of a block there a reload (a hit) from a lower tier."""
    index = BlockIndex(max_blocks=100)
    tiers = [f"m{n}" for n in range(MEDIA_PER_PUBLISHER)]
    index.apply("w", batch(*(stored([n], medium) for n, medium in enumerate(tiers))), 1.0)
    index.apply("w", batch(stored([9], None)), now=2.0)
    assert index.locations.refused_media["publisher"] == 1, (
        "its share is full, every location holds a block"
    )
    assert index.get(9) is None
    index.apply("w", batch(removed([0], tiers[0])), now=3.0)
    index.apply("w", batch(stored([9], None)), now=4.0)  # in m0's place, and on its bit
    index.apply("v", batch(stored([9], None)), now=5.0)
    nine = index.get(9)
    assert nine is not None and (nine.media, nine.publishers) == (("GPU",), ("v", "w"))
    assert nine.hits == 0, "a store on the GPU of a block held on the GPU alone"
    assert index.locations.refused_media == {"publisher": 1, "host": 0, "max_media": 0}
    rows = [(row.publisher, row.medium, row.blocks) for row in index.usage()]
    assert rows == [*(("w", medium, 1) for medium in tiers[1:]), ("w", "GPU", 1), ("v", "GPU", 1)]


def test_one_place_of_max_media_is_held_for_the_gpu_until_it_is_named() -> None:
    """Every vLLM engine's prefix cache names the GPU: other media named first took every
    place, and an honest engine's GPU stores were refused. The place is the GPU's again
    once its last location is released."""
    index = BlockIndex(max_blocks=100, max_media=2)
    index.apply("a", batch(stored([1], "CPU")), now=1.0)
    index.apply("b", batch(stored([2], "disk")), now=2.0)
    assert index.locations.refused_media == {"publisher": 0, "host": 0, "max_media": 1}
    assert index.get(2) is None
    index.apply("c", batch(stored([3], None)), now=3.0)
    assert index.blocks_by_medium() == {"CPU": 1, DEFAULT_MEDIUM: 1}
    index.apply("c", batch(removed([3], None)), now=4.0)  # the GPU's location holds nothing
    index.apply("a", batch(removed([1], "CPU")), now=5.0)  # nor the CPU's
    index.apply("b", batch(stored([2], "disk")), now=6.0)  # the CPU's place, not the GPU's
    index.apply("b", batch(stored([4], "tape")), now=7.0)
    assert index.locations.refused_media == {"publisher": 0, "host": 0, "max_media": 2}
    index.apply("c", batch(stored([3], None)), now=8.0)
    assert index.blocks_by_medium() == {"disk": 1, DEFAULT_MEDIUM: 1}


def test_a_single_place_of_max_media_is_not_held_for_the_gpu() -> None:
    """A sidecar told to track one medium (a CPU tier's events only) tracks the first one
    named: holding its only place for a GPU that never comes would refuse everything."""
    index = BlockIndex(max_blocks=100, max_media=1)
    index.apply("a", batch(stored([1], "CPU")), now=1.0)
    index.apply("b", batch(stored([2], None)), now=2.0)
    assert index.blocks_by_medium() == {"CPU": 1}
    assert index.locations.refused_media == {"publisher": 0, "host": 0, "max_media": 1}


def test_the_publishers_of_one_host_name_at_most_its_share_of_media() -> None:
    """A listen socket's peer opens a stream (a publisher) per topic: four of them named
    all 16 media. A host's publishers together name ``media_per_host``; past it their
    events are refused and counted, what they hold stays, and other hosts' publishers
    and those of no host (connect mode) still find places."""
    index = BlockIndex(max_blocks=100, media_per_host=2)
    for publisher in ("h0", "h1", "h2"):
        index.set_host(publisher, "10.0.0.1")
    index.apply("h0", batch(stored([1], "m0"), stored([2], "m1")), now=1.0)
    index.apply("h1", batch(stored([3], "m1"), stored([4], "m2")), now=2.0)
    index.apply("h2", batch(stored([5], "m3"), stored([6], None)), now=3.0)
    assert index.locations.refused_media == {"publisher": 0, "host": 3, "max_media": 0}
    assert index.blocks_by_medium() == {"m0": 1, "m1": 2}
    index.set_host("o", "10.0.0.2")
    index.apply("o", batch(stored([7], None), stored([8], "m2")), now=4.0)
    index.apply("n", batch(stored([9], "m3"), stored([10], "m4")), now=5.0)
    assert index.blocks_by_medium() == {
        "m0": 1,
        "m1": 2,
        DEFAULT_MEDIUM: 1,
        "m2": 1,
        "m3": 1,
        "m4": 1,
    }
    assert index.locations.refused_media["host"] == 3
    index.apply("h0", batch(removed([1], "m0")), now=6.0)  # m0 holds nothing: the host's again
    index.apply("h2", batch(stored([6], None)), now=7.0)
    assert index.blocks_by_medium()[DEFAULT_MEDIUM] == 2
    assert not index.set_host("h0", "10.0.0.1")  # the same host again: nothing changes
    index.apply("h1", batch(stored([11], "m5")), now=8.0)
    assert index.locations.refused_media["host"] == 4, "still held to 10.0.0.1's share"


def test_the_publishers_of_one_host_hold_at_most_its_share_of_locations() -> None:
    """Within its media, a host opening stream after stream, each holding a block in every
    group, held all 1,024 locations; an honest engine's GPU store had none."""
    index = BlockIndex(max_blocks=10_000)
    tiers = [f"m{m}" for m in range(MEDIA_PER_PUBLISHER)]
    every_location = [stored([1], t, group=g) for t in tiers for g in range(MAX_GROUPS)]
    streams = LOCATIONS_PER_HOST // len(every_location)
    for n in range(streams + 1):
        index.set_host(f"h{n}", "10.0.0.1")
        index.apply(f"h{n}", batch(*every_location), now=1.0)
    assert index.locations.refused_location_events == len(every_location)
    assert [row.publisher for row in index.usage()].count(f"h{streams}") == 0
    index.apply("honest", batch(stored([2], None)), now=2.0)
    assert index.blocks_by_medium()[DEFAULT_MEDIUM] == 1
    index.apply("h0", batch(removed([1], "m0", group=0)), now=3.0)  # holds nothing now
    index.apply(f"h{streams}", batch(stored([3], "m0", group=0)), now=4.0)
    assert index.locations.refused_location_events == len(every_location), "h0's empty one released"
    assert (f"h{streams}", "m0", 1) in [(r.publisher, r.medium, r.blocks) for r in index.usage()]


def test_a_host_set_after_its_publisher_named_media_counts_them() -> None:
    index = BlockIndex(max_blocks=100, media_per_host=2)
    index.apply("a", batch(stored([1], "m0"), stored([2], "m1")), now=1.0)
    index.set_host("a", "10.0.0.1")
    index.set_host("b", "10.0.0.1")
    index.apply("b", batch(stored([3], "m2")), now=2.0)
    assert index.locations.refused_media["host"] == 1
    assert index.blocks_by_medium() == {"m0": 1, "m1": 1}


def test_a_publisher_moved_to_another_host_takes_what_it_holds_to_that_hosts_share() -> None:
    """A stream's host was its first frame's for good: a peer sending first under an
    engine's name held the engine to the peer's share, and an engine back from a new
    address stayed in its old host's."""
    index = BlockIndex(max_blocks=100, media_per_host=2)
    index.set_host("a", "10.0.0.1")
    index.apply("a", batch(stored([1], "m0"), stored([2], "m1")), now=1.0)
    index.set_host("b", "10.0.0.1")
    index.apply("b", batch(stored([3], "m2")), now=2.0)
    assert index.locations.refused_media["host"] == 1
    assert not index.set_host("a", "10.0.0.2")
    index.apply("b", batch(stored([3], "m2")), now=3.0)  # 10.0.0.1 names none now
    index.set_host("c", "10.0.0.2")
    index.apply("c", batch(stored([4], "m3")), now=4.0)  # 10.0.0.2 names a's two
    assert index.locations.refused_media["host"] == 2
    assert index.blocks_by_medium() == {"m0": 1, "m1": 1, "m2": 1}
    index.apply("a", batch(stored([5], "m0")), now=5.0)
    assert index.blocks_by_medium()["m0"] == 2


def test_a_move_the_new_hosts_share_cannot_take_forgets_what_the_publisher_held() -> None:
    """Moved whole whatever the new host's share held, one peer's streams filled one
    host's share, moved to another host and filled it again, without end."""
    index = BlockIndex(max_blocks=100, media_per_host=2, locations_per_host=3)
    index.set_host("full", "10.0.0.2")
    index.apply("full", batch(stored([1], "m0"), stored([2], "m1")), now=1.0)
    index.set_host("a", "10.0.0.1")
    index.apply("a", batch(stored([3], "m0"), stored([4], "m2")), now=2.0)
    assert index.set_host("a", "10.0.0.2"), "m0, m1 and m2 are past 10.0.0.2's two media"
    assert index.blocks_by_medium() == {"m0": 1, "m1": 1}
    assert index.get(3) is None and index.get(4) is None
    index.apply("a", batch(stored([5], "m1", group=1)), now=3.0)  # a place of its own
    assert [row.publisher for row in index.usage()].count("a") == 1
    index.set_host("b", "10.0.0.1")
    index.apply("b", batch(stored([6], "m0"), stored([7], "m1")), now=4.0)
    assert index.set_host("b", "10.0.0.2"), "five locations are past 10.0.0.2's three"
    index.apply("a", batch(removed([5], "m1", group=1)), now=5.0)  # empty: released to fit
    index.apply("b", batch(stored([6], "m0")), now=6.0)
    assert not index.set_host("a", "10.0.0.1")
    assert not index.set_host("b", "10.0.0.1")
    assert index.locations.refused_location_events == 0


def test_hosts_that_come_and_go_leave_no_share_behind() -> None:
    """A host's share holds what its publishers hold now: an engine whose address changes
    with every restart (a rescheduled pod) grows nothing."""
    index = BlockIndex(max_blocks=2000, media_per_host=1)
    for n in range(1000):
        index.set_host("engine", f"10.0.{n // 256}.{n % 256}")
        index.apply("engine", batch(stored([n], None)), now=float(n))
    assert index.locations.host_media == {"10.0.3.231": {DEFAULT_MEDIUM: 1}}
    assert index.blocks_by_medium() == {DEFAULT_MEDIUM: 1000}
    assert not index.set_host("engine", None)  # an ipc:// peer's frame: held to no host's
    assert index.locations.host_media == {}
    index.set_host("other", "10.0.3.231")
    index.apply("other", batch(stored([2000], "CPU")), now=2000.0)
    assert index.blocks_by_medium()["CPU"] == 1


def test_locations_per_host_is_from_one_to_every_location() -> None:
    for wrong in (0, MAX_LOCATIONS + 1):
        with pytest.raises(ValueError, match=f"from 1 to {MAX_LOCATIONS}, got {wrong}"):
            BlockIndex(max_blocks=1, locations_per_host=wrong)
    index = BlockIndex(max_blocks=10, locations_per_host=2)
    index.set_host("a", "10.0.0.1")
    index.apply("a", batch(*(stored([g], None, group=g) for g in range(3))), now=1.0)
    assert index.locations.refused_location_events == 1
    assert index.blocks_by_medium() == {DEFAULT_MEDIUM: 2}


def test_media_per_host_must_admit_a_medium() -> None:
    with pytest.raises(ValueError, match="media_per_host must be at least 1, got 0"):
        BlockIndex(max_blocks=1, media_per_host=0)


def test_one_reload_into_a_hybrid_models_gpu_is_one_hit_whatever_its_groups() -> None:
    """Each KV cache group's copy of a reloaded block is a GPU store of its own: counted
    one by one, a reload was a hit per group."""
    index = BlockIndex(max_blocks=100)
    index.apply("w", batch(stored([1, 2], "CPU")), now=1.0)
    groups = [stored([1, 2], None, group=g) for g in range(4)]
    index.apply("w", batch(*groups), now=2.0)
    entry = index.get(1)
    assert entry is not None and entry.hits == 1
    index.apply("w", batch(*(removed([1, 2], None, group=g) for g in range(4))), now=3.0)
    index.apply("w", batch(*groups), now=4.0)
    entry = index.get(1)
    assert entry is not None and entry.hits == 2, "a second reload is a second hit"


def test_a_block_at_a_high_location_bit_is_counted_and_shown_at_that_bit() -> None:
    """Stranded counts and snapshots walk a mask's set bits only (counting every bit up to
    the highest once took minutes at 65,536 locations, measured, not tested): they must
    still land on the right location a thousand bits up."""
    index = BlockIndex(max_blocks=100_000)
    for publisher in range(MAX_LOCATIONS // MAX_GROUPS - 1):  # and one location for "last"
        index.apply(f"p{publisher}", batch(*(removed([0], None, group=g) for g in range(16))), 1.0)
    chain = list(range(1, 20_001))
    index.apply("last", batch(stored(chain[:1], None), stored(chain[1:], None, parent=1)), 2.0)
    assert index.locations.refused_location_events == 0
    assert len(index.locations.names) == MAX_LOCATIONS - MAX_GROUPS + 1
    index.apply("last", batch(removed([1], None)), now=3.0)
    assert stranded_by_medium(index) == {"GPU": 19_999}
    (first, *_), _cursor = index.page(limit=10)
    assert first.publishers == ("last",)


def test_a_block_hangs_under_its_coarsest_groups_parent() -> None:
    """A hybrid model's 16-token group chains 1, 2, 3, 4; its 32-token group names a coarse
    block by its last fine hash, 2 then 4, so 4 hangs under 2 there. Whichever stores
    first, 4 is stranded only when the coarse chain breaks, not when the fine block 3
    (which only the finer group holds) goes."""
    for fine_first in (True, False):
        index = BlockIndex(max_blocks=100)
        fine = stored([1, 2, 3, 4], "GPU", block_size=16, group=0)
        coarse = stored([2, 4], "GPU", block_size=32, group=1)
        index.apply("vllm", batch(*((fine, coarse) if fine_first else (coarse, fine))), 1.0)
        index.apply("vllm", batch(removed([1, 3], "GPU", group=0)), 2.0)
        assert stranded_by_medium(index) == {"GPU": 0}
        assert index.get(4).block_size == 32
        index.apply("vllm", batch(removed([2], "GPU", group=0), removed([2], "GPU", group=1)), 3.0)
        assert stranded_by_medium(index) == {"GPU": 2}  # both copies of 4


def test_a_stranded_block_hung_under_a_coarser_parent_takes_its_descendants_along() -> None:
    """The finer group dropped 3 before the coarser group stored 4: 4 and what hangs under
    it were stranded, and 4's new parent reaches them all again."""
    index = BlockIndex(max_blocks=100)
    index.apply("vllm", batch(stored([1, 2, 3, 4, 5, 6], "GPU", block_size=16, group=0)), 1.0)
    index.apply("vllm", batch(removed([3], "GPU", group=0)), 2.0)
    assert stranded_by_medium(index) == {"GPU": 3}
    index.apply("vllm", batch(stored([2, 4], "GPU", block_size=32, group=1)), 3.0)
    assert stranded_by_medium(index) == {"GPU": 0}


def test_a_coarser_parent_not_up_a_reachable_chain_is_refused() -> None:
    """A coarser store naming a reachable block's own descendant (or a block off its
    chain) as its parent would close a loop: the block keeps its parent, and the loop's
    blocks do not stay reachable once the chain's root goes."""
    index = BlockIndex(max_blocks=100)
    index.apply("a", batch(stored([1, 2, 3], "GPU", block_size=16, parent=0)), 1.0)
    index.apply("a", batch(stored([0], "GPU", block_size=16)), 1.0)
    index.apply("a", batch(stored([1], "GPU", block_size=32, parent=3)), 2.0)  # 3 is below 1
    index.apply("a", batch(stored([2], "GPU", block_size=32, parent=9)), 2.0)  # off the chain
    assert index.get(1).block_size == index.get(2).block_size == 16
    index.apply("a", batch(removed([0], "GPU")), 3.0)
    assert stranded_by_medium(index) == {"GPU": 3}


def test_max_blocks_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_blocks"):
        BlockIndex(max_blocks=0)


# --- property: the index against a dict of sets --------------------------------------

PUBLISHERS = ("a", "b")
MEDIA = (None, "CPU", "GPU")
GROUPS = (None, 0, 1)
event = st.one_of(
    st.builds(
        stored,
        st.lists(st.integers(0, 9), max_size=5),
        st.sampled_from(MEDIA),
        block_size=st.sampled_from((None, 0, 16, 32)),
        parent=st.one_of(st.none(), st.integers(0, 9)),
        group=st.sampled_from(GROUPS),
    ),
    st.builds(
        removed,
        st.lists(st.integers(0, 9), max_size=5),
        st.sampled_from(MEDIA),
        group=st.sampled_from(GROUPS),
    ),
    st.just(CLEARED),
)
step = st.tuples(st.sampled_from(PUBLISHERS), st.lists(event, max_size=4))


class Model:
    """The index's contract written the obvious way: hash -> set of (publisher, medium,
    KV cache group), a block's copies; and the copies past the first at one location
    (vLLM's pool caches a recomputed block again under its hash)."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.blocks: dict[Hashable, set[tuple[str, str, int | None]]] = {}  # listing order
        self.hits: dict[Hashable, int] = {}
        self.parents: dict[Hashable, Hashable | None] = {}  # of held blocks, from their store
        self.sizes: dict[Hashable, int | None] = {}  # of the store that named the parent
        self.extra: dict[tuple[Hashable, tuple[str, str, int | None]], int] = {}
        self.overflow = self.untracked = 0

    def apply(self, publisher: str, event: DecodedEvent) -> None:
        where = (publisher, event.medium or "GPU", event.group)
        if event.kind == "cleared":
            for block_hash in list(self.blocks):
                self._discard(
                    block_hash, {loc for loc in self.blocks[block_hash] if loc[0] == publisher}
                )
        parent = event.parent_block_hash
        last = self.blocks.get(event.block_hashes[-1], set()) if event.block_hashes else set()
        if event.kind == "stored" and parent is None and where in last:
            return  # a re-announcement of hits from the root: holds nothing new
        coarser = []
        for block_hash in event.block_hashes:
            held = self.blocks.get(block_hash)
            above, parent = parent, block_hash
            if event.kind == "removed":
                if held is None or where not in held:
                    self.untracked += 1
                elif self.extra.get((block_hash, where)):
                    self.extra[block_hash, where] -= 1
                else:
                    self._discard(block_hash, {where})
            elif held is not None:
                lower = any(medium != "GPU" for _p, medium, _g in held)
                copy = any((p, m) == where[:2] for p, m, _g in held)  # another group's
                if where[1] == "GPU" and lower and not copy:
                    self.hits[block_hash] += 1
                if where in held:
                    self.extra[block_hash, where] = self.extra.get((block_hash, where), 0) + 1
                held.add(where)
                size = self.sizes[block_hash]
                if size and event.block_size and size < event.block_size:
                    coarser.append((block_hash, above))
            elif len(self.blocks) >= self.max_blocks:
                self.overflow += 1
            else:
                self.blocks[block_hash], self.hits[block_hash] = {where}, 0
                self.parents[block_hash] = None if above == block_hash else above
                self.sizes[block_hash] = event.block_size
        for block_hash, above in coarser:  # a coarser store's parent, if up the block's chain
            links = min(event.block_size // self.sizes[block_hash], MAX_REHANG_LINKS)
            if above != self.parents[block_hash] and self._up(block_hash, above, links):
                self.parents[block_hash], self.sizes[block_hash] = above, event.block_size

    def _up(self, block_hash: Hashable, above: Hashable | None, links: int) -> bool:
        """Whether ``block_hash`` may hang under ``above``: None, or any block if it is
        stranded, or at most ``links`` parents up from it (not the block itself)."""
        if above is None:
            return True
        if above == block_hash:
            return False
        if self._stranded(block_hash):
            return True
        for _ in range(links):
            block_hash = self.parents[block_hash]
            if block_hash == above:
                return True
            if block_hash not in self.blocks:
                return False
        return False

    def stranded_by_medium(self) -> dict[str, int]:
        """Held blocks with an ancestor held nowhere (or in a cycle), per medium held on."""
        counts: dict[str, int] = {}
        for block_hash, held in self.blocks.items():
            if self._stranded(block_hash):
                for _publisher, medium, _group in held:
                    counts[medium] = counts.get(medium, 0) + 1
        return counts

    def _stranded(self, block_hash: Hashable) -> bool:
        seen, above = {block_hash}, self.parents[block_hash]
        while above is not None and above in self.blocks and above not in seen:
            seen.add(above)
            above = self.parents[above]
        return above is not None

    def _discard(self, block_hash: Hashable, locations: set[tuple[str, str, int | None]]) -> None:
        self.blocks[block_hash] -= locations
        for where in locations:
            self.extra.pop((block_hash, where), None)
        if not self.blocks[block_hash]:
            del self.blocks[block_hash], self.hits[block_hash], self.parents[block_hash]
            del self.sizes[block_hash]


class Reader:
    """A lock whose every release lets a reader in: it checks that the index it sees
    agrees with itself (its blocks, their listing, the stranded among them)."""

    def __init__(self, index: BlockIndex) -> None:
        self.index = index
        self.seen: list[tuple[int, dict[str, int]]] = []
        """Blocks held and stranded per medium at each release."""

    def __enter__(self) -> None:
        pass

    def __exit__(self, *_exc: object) -> None:
        index = self.index
        self.seen.append((len(index), stranded_by_medium(index)))
        listed = walk(index, limit=MAX_PAGE_LIMIT)
        assert len(listed) == len(index), "every block held is listed once"
        assert all(index.get(block_hash) is not None for block_hash in listed)
        assert sum(row.blocks for row in index.usage()) >= len(index)
        assert all(0 <= row.stranded <= row.blocks for row in index.usage())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(step, max_size=25),
    st.integers(1, 8),
    st.sampled_from((1, 2, PART_BLOCKS)),
    st.sampled_from((1, 2, PAGE_SCAN)),
)
def test_index_matches_a_dict_of_sets(
    steps: list, max_blocks: int, part_blocks: int, page_scan: int
) -> None:
    """Whatever the parts a batch is applied in (each block a part of its own, at the
    least), with a reader let in between them, and however few records a page examines."""
    index = BlockIndex(max_blocks, part_blocks=part_blocks, page_scan=page_scan)
    model = Model(max_blocks)
    reader = Reader(index)
    for publisher, events in steps:
        index.apply(publisher, batch(*events), now=0.0, lock=reader)
        for event in events:
            model.apply(publisher, event)
    assert walk(index, limit=3) == list(model.blocks)
    for block_hash in range(10):
        entry = index.get(block_hash)
        held = model.blocks.get(block_hash)
        assert (entry is None) == (held is None)
        if entry is not None and held is not None:
            assert entry.publishers == tuple(sorted({p for p, _m, _g in held}))
            assert entry.media == tuple(sorted({m for _p, m, _g in held}))
            assert entry.hits == model.hits[block_hash]
    for row in index.usage():
        expected = sum(
            (p, m) == (row.publisher, row.medium)
            for held in model.blocks.values()
            for p, m, _g in held
        ) + sum(
            n
            for (_h, (p, m, _g)), n in model.extra.items()
            if (p, m) == (row.publisher, row.medium)
        )
        assert row.blocks == expected
    assert (index.overflow, index.untracked_removals) == (model.overflow, model.untracked)
    stranded = {medium: n for medium, n in stranded_by_medium(index).items() if n}
    assert stranded == model.stranded_by_medium()


def test_a_store_naming_a_block_twice_rehangs_it_in_parts_as_whole() -> None:
    """A chain naming 1 twice (a loop, from a peer's bytes) meets it under 2, refused as the
    index is full, and under 0: whole, the store moves it under each in turn, ending under
    0, held; cut a block a part, 1 moved under 2 before its second place was met."""
    ends = []
    for part_blocks in (PART_BLOCKS, 1):
        index = BlockIndex(max_blocks=2, part_blocks=part_blocks)
        fine = stored([1], "GPU", block_size=16, parent=3, group=1)
        coarse = stored([0, 2, 1, 0, 1], "GPU", block_size=32, group=0)
        index.apply("a", batch(fine, coarse), 0.0)
        ends.append((stranded_by_medium(index), index.overflow))
    assert ends == [({"GPU": 0}, 1), ({"GPU": 0}, 1)]


def test_a_batch_in_parts_lets_readers_see_whole_runs_and_removes_tail_first() -> None:
    """Two blocks a part: a store of a chain of five shows a reader two, then four; its
    removal goes tail first, so no reader sees a block under a removed one (stranded)."""
    index = BlockIndex(max_blocks=100, part_blocks=2)
    reader = Reader(index)
    index.apply("a", batch(stored([1, 2, 3, 4, 5])), 1.0, lock=reader)
    assert reader.seen == [(2, {"CPU": 0}), (4, {"CPU": 0}), (5, {"CPU": 0})]
    reader.seen.clear()
    index.apply("a", batch(removed([1, 2, 3, 4, 5])), 2.0, lock=reader)
    assert reader.seen == [(2, {"CPU": 0}), (0, {"CPU": 0}), (0, {"CPU": 0})]


def test_a_part_counts_the_blocks_its_walks_visit_so_a_reader_waits_for_one_walk() -> None:
    """Taking a chain's root away strands every block under it, and storing it again frees
    them: each a walk down the chain, which a part counts as the work it is. Counted as
    one block event each, a frame of a few kilobytes toggling the root of a long chain
    held the readers' lock for as many walks as it named (minutes at a million blocks)."""
    index = BlockIndex(max_blocks=100, part_blocks=4)
    index.apply("a", batch(stored(list(range(20)))), 1.0)
    reader = Reader(index)
    toggle = (removed([0]), stored([0]))
    index.apply("a", batch(*toggle, *toggle), 2.0, lock=reader)
    after_each_event = [(19, {"CPU": 19}), (20, {"CPU": 0})] * 2
    assert reader.seen == [*after_each_event, (20, {"CPU": 0})]
