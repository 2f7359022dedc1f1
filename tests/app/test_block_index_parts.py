"""A batch applied in parts (``BlockIndex.part_blocks``) against the same batch applied whole."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.state.block_index import PART_BLOCKS, BlockIndex
from tests.app.test_block_index import batch, step, walk


def observed(index: BlockIndex, chains: list[list[int]]) -> tuple[object, ...]:
    """Everything a reader can ask the index: entries, listing, usage, counters, lookups."""
    return (
        [index.get(block_hash) for block_hash in range(10)],
        walk(index, limit=3),
        index.usage(),
        (index.overflow, index.untracked_removals, len(index)),
        [index.lookup_prefix(chain) for chain in chains],
    )


@settings(max_examples=5000, deadline=None)
@given(
    st.lists(step, max_size=25),
    st.integers(1, 8),
    st.integers(1, 3),
    st.lists(st.lists(st.integers(0, 9), max_size=8), max_size=4),
)
def test_a_batch_in_parts_ends_as_the_whole_batch(
    steps: list, max_blocks: int, part_blocks: int, chains: list[list[int]]
) -> None:
    """Cut stores continue their chain, removals go tail first, reports and the index's
    room are decided as for the whole event: the parts change nothing a reader sees."""
    whole = BlockIndex(max_blocks, part_blocks=PART_BLOCKS)
    parts = BlockIndex(max_blocks, part_blocks=part_blocks)
    for now, (publisher, events) in enumerate(steps):
        whole.apply(publisher, batch(*events), now=float(now))
        parts.apply(publisher, batch(*events), now=float(now))
        assert observed(parts, chains) == observed(whole, chains)
