"""The demo's worker stand-in: a GPU prefix cache, the real CPU tier, one real publisher."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import zmq

from offload.sim.demo_worker import DemoConfig, DemoWorker
from offload.wire.kv_events import decode_batch
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import decode_stats_frame
from tests.support.polling import wait_for


def test_the_engine_moves_bytes_publishes_events_and_leaves_nothing_pinned() -> None:
    requests = [[1, 2, 3], [1, 2, 3, 4], [5, 6], [1, 2, 7], [5, 6, 8]]
    config = DemoConfig(
        capacity_blocks=6, gpu_cache_blocks=3, requests_per_s=10_000, stats_period_s=0.0
    )
    with EventPublisher("tcp://127.0.0.1:*") as publisher:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(publisher.endpoint)
        engine = DemoWorker(requests, publisher, config)
        # The subscription must be live before the engine publishes: probe with stats.
        while not sub.poll(50):
            engine.telemetry.publish_stats()
        for block_hashes in requests:  # settled one by one: hits do not depend on timing
            engine.step(block_hashes)
            engine.settle()
        engine.run(threading.Event(), max_requests=20)

        manager, stats, gpu = engine.manager, engine.manager.stats, engine.gpu
        assert engine.requests_done == 20
        # Both tiers serve hits: [1, 2, 3, 4] finds its prefix on the GPU, and
        # [1, 2, 7] finds its on the CPU tier once the GPU has evicted it.
        assert gpu.hit_blocks > 0 and gpu.evicted_blocks > 0 and len(gpu) == 3
        assert stats.lookup_hit_blocks > 0 and stats.evicted_capacity_blocks > 0
        assert stats.loads_in_flight == 0 and stats.stores_in_flight == 0
        assert manager.invariant_violations() == []
        moved = engine.transfers.stats.directions
        assert all(d.jobs_submitted == d.jobs_ok > 0 for d in moved.values())
        per_block = engine.telemetry.config.bytes_per_block
        assert per_block and sum(d.bytes_moved for d in moved.values()) % per_block == 0

        # One stream carries both media: every block each tier stored or dropped, in order.
        seen: Counter[tuple[str | None, str]] = Counter()
        stats_seen = 0
        expected = {
            ("CPU", "BlockStored"): stats.store_completed_blocks,
            ("CPU", "BlockRemoved"): stats.evicted_capacity_blocks,
            ("GPU", "BlockStored"): gpu.stored_blocks,
            ("GPU", "BlockRemoved"): gpu.evicted_blocks,
        }

        def received() -> tuple[dict[tuple[str | None, str], int], int]:
            """Blocks by medium and kind, and stats frames, of every frame arrived so far."""
            nonlocal stats_seen
            while sub.poll(0):
                topic, _, payload = sub.recv_multipart()
                if topic == b"kvscope.stats":
                    stats_seen += 1
                    assert decode_stats_frame(payload).config.policy == "lru"
                else:
                    for event in decode_batch(payload).events:
                        seen[(event.medium, type(event).__name__)] += len(event.block_hashes)
            return {key: seen[key] for key in expected}, stats_seen

        wait_for(
            received,
            lambda got: got[0] == expected and got[1] > 1,
            "every stored and dropped block, and the stats frames, arrive",
        )
        sub.close(linger=0)
        ctx.term()


def test_a_request_longer_than_the_gpu_is_refused_up_front_by_name() -> None:
    """Such a request once killed the worker's thread at its first CPU hit (a job naming a
    GPU block twice), leaving the sidecar serving what it had."""
    config = DemoConfig(capacity_blocks=64, num_gpu_blocks=8)
    with EventPublisher("tcp://127.0.0.1:*") as publisher:
        DemoWorker([list(range(8))], publisher, config)
        with pytest.raises(ValueError, match="a request of 9 blocks is longer than the GPU's 8"):
            DemoWorker([[1, 2], list(range(9))], publisher, config)
