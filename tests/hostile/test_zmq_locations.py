"""One publisher cannot take the index's media and locations from the others.

Media and locations (a publisher's medium and KV cache group) went to whoever
named them first, for good: one frame of stores of a block each, one per medium
and group, took all 16 media, and frames of removals of blocks never stored (which
hold nothing) took all 1,024 locations; an honest engine's GPU stores were refused
from then on. Now a publisher names at most ``MEDIA_PER_PUBLISHER`` media, and a
location that holds no block is released when another needs its place. Frames go
over real sockets to a live ingest thread.
"""

from __future__ import annotations

import pytest

from app.state.block_index import Usage
from app.state.locations import MAX_GROUPS, MAX_LOCATIONS, MEDIA_PER_PUBLISHER
from app.state.publisher import PublisherState
from app.state.sidecar import SidecarState
from offload.wire.kv_events import BlockRemoved, BlockStored, KVEventBatch, encode_batch
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, ingesting, wait_connected

pytestmark = pytest.mark.timeout(120)

MAX_MEDIA = 16  # the sidecar's default (KVSCOPE_MAX_MEDIA)
HONEST_BLOCKS = [1, 2, 3]


def frame(*events: BlockStored | BlockRemoved) -> bytes:
    return encode_batch(KVEventBatch(ts=1.0, events=list(events)))


def gpu_store() -> bytes:
    """An honest vLLM engine's GPU store: its events name no medium."""
    return frame(BlockStored(HONEST_BLOCKS, None, [], 16, None, None, None))


def sent(raw: RawPublisher, state: PublisherState, payload: bytes) -> None:
    """Send ``payload`` as ``raw``'s next frame and wait until the sidecar applied it."""
    seq = 0 if state.last_seq is None else state.last_seq + 1
    raw.send(seq, payload)
    wait_until(lambda: state.last_seq == seq, f"frame {seq} of {state.name} applied")


def honest_blocks(state: SidecarState) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(media, publishers) of each of the honest engine's blocks; () for one not held."""
    with state.lock:
        entries = [state.index.get(block) for block in HONEST_BLOCKS]
    return [((), ()) if entry is None else (entry.media, entry.publishers) for entry in entries]


def test_one_publisher_naming_every_medium_leaves_the_honest_gpu_store_applied(
    peers: list[RawPublisher],
) -> None:
    """A store of one block per medium and group, on 16 media: the publisher keeps its
    share (blocks and all), the rest is refused and counted, and the honest engine's GPU
    store, sent after, is applied. Its CPU location, empty, is not released for the
    other's sake: a publisher past its share releases only its own."""
    hostile, honest = RawPublisher(), RawPublisher()
    peers += [hostile, honest]
    with ingesting(hostile.endpoints, honest.endpoints, max_blocks=10_000) as ingestor:
        hostile_state = wait_connected(hostile, ingestor)
        honest_state = wait_connected(honest, ingestor)
        cpu = "CPU"
        sent(honest, honest_state, frame(BlockStored([9], None, [], 16, None, cpu, None)))
        sent(honest, honest_state, frame(BlockRemoved([9], cpu)))
        stores = [
            BlockStored([1000 + m * MAX_GROUPS + g], None, [], 16, None, f"m{m}", None, group_idx=g)
            for m in range(MAX_MEDIA)
            for g in range(MAX_GROUPS)
        ]
        sent(hostile, hostile_state, frame(*stores))
        sent(honest, honest_state, gpu_store())

        name = honest_state.name
        assert honest_blocks(ingestor.state) == [(("GPU",), (name,))] * len(HONEST_BLOCKS)
        index = ingestor.state.index
        with ingestor.state.lock:
            kept = {f"m{m}": MAX_GROUPS for m in range(MEDIA_PER_PUBLISHER)}
            assert index.blocks_by_medium() == kept | {cpu: 0, "GPU": len(HONEST_BLOCKS)}
            refused = (MAX_MEDIA - MEDIA_PER_PUBLISHER) * MAX_GROUPS
            assert index.locations.refused_media == {
                "publisher": refused,
                "host": 0,
                "max_media": 0,
            }
            assert index.locations.refused_location_events == 0
            honest_rows = [row for row in index.usage() if row.publisher == name]
            gpu = Usage(name, "GPU", len(HONEST_BLOCKS), None)
            assert honest_rows == [Usage(name, cpu, 0, None), gpu]


def test_locations_that_hold_nothing_are_released_for_the_honest_gpu_store(
    peers: list[RawPublisher],
) -> None:
    """Publishers each naming their share of locations by removals of blocks never stored,
    until every location is named: none holds a block, so the honest engine's GPU store
    takes the place of one, and the removals are counted as untracked."""
    per_publisher = MEDIA_PER_PUBLISHER * MAX_GROUPS
    hostile = [RawPublisher() for _ in range(MAX_LOCATIONS // per_publisher)]
    honest = RawPublisher()
    peers += [*hostile, honest]
    endpoints = [peer.endpoints for peer in peers]
    with ingesting(*endpoints, max_blocks=10_000) as ingestor:
        removals = frame(
            *(
                BlockRemoved([7], f"m{m}", group_idx=g)
                for m in range(MEDIA_PER_PUBLISHER)
                for g in range(MAX_GROUPS)
            )
        )
        for peer in hostile:
            sent(peer, wait_connected(peer, ingestor), removals)
        index = ingestor.state.index
        with ingestor.state.lock:
            assert len(index.locations.names) == MAX_LOCATIONS  # every place is named
        sent(honest, wait_connected(honest, ingestor), gpu_store())

        name = ingestor.state.publishers[honest.endpoints.endpoint].name
        assert honest_blocks(ingestor.state) == [(("GPU",), (name,))] * len(HONEST_BLOCKS)
        with ingestor.state.lock:
            assert (
                index.locations.refused_location_events
                == sum(index.locations.refused_media.values())
                == 0
            )
            assert index.untracked_removals == MAX_LOCATIONS
            assert index.usage() == [Usage(name, "GPU", len(HONEST_BLOCKS), None)]  # all else went
