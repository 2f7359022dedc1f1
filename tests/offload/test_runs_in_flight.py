"""Stored events are runs of a chain under the block before them, however stores complete.

An engine may complete one store in several calls, in any order, and some
parts may fail; each stored event must still be consecutive blocks of the
chain, under the block just before the first (offload/cpu/runs_in_flight.py).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from offload import CPUOffloadingManager

CHAIN = list(range(1, 13))
"""One prompt's chain, its root's parent 0: block b follows block b - 1."""


@st.composite
def stores_and_completions(draw: st.DrawFn) -> tuple[list[list[int]], list[tuple[list[int], bool]]]:
    """Offers along the chain (held blocks among them), then their blocks completed in
    random parts and order, each part a success or a failure."""
    cuts = sorted(draw(st.sets(st.integers(1, len(CHAIN) - 1), max_size=3)))
    offers = [CHAIN[a:b] for a, b in zip([0, *cuts], [*cuts, len(CHAIN)], strict=True)]
    blocks = draw(st.permutations(CHAIN))
    sizes = draw(st.lists(st.integers(1, 4), min_size=len(CHAIN), max_size=len(CHAIN)))
    parts: list[tuple[list[int], bool]] = []
    start = 0
    for size in sizes:
        if start < len(blocks):
            parts.append((list(blocks[start : start + size]), draw(st.booleans())))
            start += size
    return offers, parts


@settings(max_examples=300, deadline=None)
@given(case=stores_and_completions(), held=st.sets(st.sampled_from(CHAIN), max_size=3))
def test_each_stored_event_is_a_run_of_the_chain_under_the_block_before_it(
    case: tuple[list[list[int]], list[tuple[list[int], bool]]], held: set[int]
) -> None:
    offers, parts = case
    manager = CPUOffloadingManager(16, 64, enable_events=True)
    for block_hash in sorted(held):  # held before: the offers skip them, splitting runs
        manager.prepare_store([block_hash], parent=block_hash - 1)
        manager.complete_store([block_hash])
    manager.take_events()
    for offer in offers:
        assert manager.prepare_store(offer, parent=offer[0] - 1) is not None
    stored: set[int] = set()
    for block_hashes, success in parts:
        changed = manager.complete_store(block_hashes, success)
        if success:
            stored.update(changed)
    events = manager.take_events()
    announced = [h for event in events for h in event.block_hashes]
    assert sorted(announced) == sorted(stored), "every block stored is announced once"
    for event in events:
        assert not event.removed
        first = event.block_hashes[0]
        assert event.parent_block_hash == first - 1, "the run hangs under the block before it"
        assert event.block_hashes == list(range(first, first + len(event.block_hashes)))
