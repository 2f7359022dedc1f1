"""The demo's worker stand-in: real manager, real CPU transfers, real publisher."""

from __future__ import annotations

import threading

import zmq

from offload.sim.demo_worker import DemoConfig, DemoWorker
from offload.wire.kv_events import decode_batch
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import decode_stats_frame


def test_the_engine_moves_bytes_publishes_events_and_leaves_nothing_pinned() -> None:
    requests = [[1, 2, 3], [1, 2, 3, 4], [5, 6], [1, 2, 7], [5, 6, 8]]
    config = DemoConfig(capacity_blocks=6, requests_per_s=10_000, stats_period_s=0.0)
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

        manager, stats = engine.manager, engine.manager.stats
        assert engine.requests_done == 20
        assert stats.lookup_hit_blocks > 0 and stats.evicted_capacity_blocks > 0
        assert stats.loads_in_flight == 0 and stats.stores_in_flight == 0
        assert manager.invariant_violations() == []
        moved = engine.transfers.stats.directions
        assert all(d.jobs_submitted == d.jobs_ok > 0 for d in moved.values())
        per_block = engine.telemetry.config.bytes_per_block
        assert per_block and sum(d.bytes_moved for d in moved.values()) % per_block == 0

        stored_seen = stats_seen = 0
        while sub.poll(2000):
            topic, _, payload = sub.recv_multipart()
            if topic == b"kvscope.stats":
                stats_seen += 1
                assert decode_stats_frame(payload).config.policy == "lru"
            else:
                stored_seen += sum(
                    len(e.block_hashes)
                    for e in decode_batch(payload).events
                    if type(e).__name__ == "BlockStored"
                )
            if stored_seen == stats.store_completed_blocks and stats_seen > 1:
                break
        assert stored_seen == stats.store_completed_blocks
        sub.close(linger=0)
        ctx.term()
