"""The index's listing: creation order and cursors kept through sweeps, and its memory bound.

A model (the plain list of every record ever appended) is driven beside a
listing with tiny chunks, so that closing, sweeping and merging happen within
a few dozen records; every observable is compared after each batch.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.state.held_block import HeldBlock
from app.state.listing import Listing

CHUNK, SLACK, SWEEP_MIN = 4, 3, 5


def record(seq: int) -> HeldBlock:
    return HeldBlock(seq, 0, 1, seq, 0.0, 0.0, 0, None, None, 0, False)


class Driver:
    """Appends and kills records as the index does, holding at most ``max_blocks`` live."""

    def __init__(self, max_blocks: int) -> None:
        self.listing = Listing(CHUNK, SLACK, SWEEP_MIN)
        self.max_blocks = max_blocks
        self.every: list[HeldBlock] = []  # the model: every record ever appended, in order
        self.live: list[HeldBlock] = []

    def batch(self, appends: int, kills: list[int]) -> None:
        for position in kills:
            if self.live:
                victim = self.live.pop(position % len(self.live))
                victim.mask = 0
                self.listing.dead += 1
        for _ in range(min(appends, self.max_blocks - len(self.live))):
            fresh = record(len(self.every))
            self.every.append(fresh)
            self.live.append(fresh)
            self.listing.open.append(fresh)
        self.listing.settle()


batches = st.lists(
    st.tuples(st.integers(0, 12), st.lists(st.integers(0, 1000), max_size=12)), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(batches, st.integers(1, 20), st.data())
def test_listing_matches_every_record_appended(
    steps: list[tuple[int, list[int]]], max_blocks: int, data: st.DataObject
) -> None:
    driver = Driver(max_blocks)
    listing = driver.listing
    for appends, kills in steps:
        driver.batch(appends, kills)
        listed = list(listing.after(None))
        assert [r for r in listed if r.mask] == driver.live
        assert all(r in driver.every for r in listed)
        assert [r.seq for r in listed] == sorted({r.seq for r in listed})
        assert len(listing) == len(listed)
        assert listing.dead == sum(1 for r in listed if not r.mask)
        assert len(listing) <= 4 * max_blocks + 2 * SLACK + 2 * CHUNK
        assert listing.closed_chunks <= 2 * len(listing) / CHUNK + 2
        cursor = data.draw(st.integers(-1, len(driver.every)))
        assert list(listing.after(cursor)) == [r for r in listed if r.seq > cursor]


def test_steady_churn_keeps_about_two_records_per_block_and_the_sweeps_end() -> None:
    """Oldest out, as many new in, batch after batch: the sweeps keep pace with the dead."""
    driver = Driver(max_blocks=1000)
    rng = random.Random(7)
    driver.batch(1000, [])
    peak = 0
    for _ in range(3000):
        evicted = rng.randint(0, 30)
        driver.batch(evicted, [0] * evicted)
        peak = max(peak, len(driver.listing))
    assert 2 * 1000 < peak <= 2.1 * 1000
    for _ in range(1000):  # every block leaves, none arrives: the sweeps still end
        driver.batch(0, [0])
    assert not driver.live
    assert len(driver.listing) <= SLACK


def test_a_sweep_drops_the_dead_and_merges_what_is_left() -> None:
    driver = Driver(max_blocks=100)
    driver.batch(40, [])
    driver.batch(0, [0] * 30)  # 30 dead of 40: the sweep starts and, with 5 a batch, goes on
    while len(driver.listing) > 10:
        driver.batch(0, [])
    assert list(driver.listing.after(None)) == driver.live == driver.every[30:]
    assert driver.listing.dead == 0


def test_chunks_left_sparse_by_a_sweep_are_merged() -> None:
    driver = Driver(max_blocks=100)
    driver.batch(40, [])
    for victim in driver.every:
        if victim.seq % 4:  # one record of every four lives
            victim.mask = 0
            driver.listing.dead += 1
    driver.live = driver.every[::4]
    for _ in range(10):  # 5 records a batch: the sweep ends within 8
        driver.batch(0, [])
    assert list(driver.listing.after(None)) == driver.live
    assert driver.listing.closed_chunks <= 2 * len(driver.listing) / CHUNK + 2


def test_compact_drops_every_dead_record_at_once_even_mid_sweep() -> None:
    driver = Driver(max_blocks=100)
    driver.batch(60, [])
    driver.batch(0, [-1] * 40)  # the newest go: a sweep starts at the live front, 5 a batch
    assert driver.listing.dead
    for victim in driver.live[::2]:  # then half of the rest goes, behind and ahead of it
        victim.mask = 0
        driver.listing.dead += 1
    driver.live = driver.live[1::2]
    driver.listing.compact()
    assert list(driver.listing.after(None)) == driver.live
    assert driver.listing.dead == 0
    assert driver.listing.closed_chunks <= 2 * len(driver.listing) / CHUNK + 2


@pytest.mark.parametrize(("chunk", "slack", "sweep_min"), [(0, 1, 1), (1, -1, 1), (1, 1, 0)])
def test_bad_sizes_are_refused_by_name(chunk: int, slack: int, sweep_min: int) -> None:
    with pytest.raises(ValueError, match="chunk and sweep_min must be positive"):
        Listing(chunk, slack, sweep_min)
