"""The kvscope_endpoint key: the tier's events and stats reach a live subscriber."""

from __future__ import annotations

import zmq
from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext, make_offload_key

from app.decode import decode_kv_payload
from bench.tooling.vllm_config import offloading_config
from offload.vllm import KVScopeOffloadingSpec
from offload.vllm.manager import KVScopeManager
from offload.wire.framing import DEFAULT_STATS_TOPIC
from offload.wire.stats_frame import decode_stats_frame
from tests.support.polling import wait_until


def test_events_and_stats_reach_the_endpoint_named_by_kvscope_endpoint() -> None:
    # A port of the publisher's own choosing, read back once bound: one probed free and
    # bound by the publisher later could be taken in between. That the named port itself
    # is bound is tests/vllm/test_endpoints.py's to show.
    spec = KVScopeOffloadingSpec(
        offloading_config(
            {"num_cpu_blocks": 4, "kvscope_endpoint": "tcp://127.0.0.1:*"}, events=False
        )
    )
    manager = spec.get_manager()
    assert isinstance(manager, KVScopeManager) and manager.telemetry is not None
    endpoint = manager.telemetry.publisher.endpoint
    assert endpoint.startswith("tcp://127.0.0.1:")  # the address kvscope_endpoint named
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    ctx = ReqContext(req_id="r")
    stored: list = []
    stats: list = []
    rounds = iter(range(10**6))

    def store_step_and_read() -> bool:
        """Store a fresh block and end a step (a late subscriber misses the first ones)."""
        key = make_offload_key(next(rounds).to_bytes(8, "big"), 0)
        if manager.prepare_store([key], ctx) is not None:
            manager.complete_store([key], ctx)
        manager.on_schedule_end(ScheduleEndContext((), ()))
        while sub.poll(50):
            topic, _seq, payload = sub.recv_multipart()
            if topic == DEFAULT_STATS_TOPIC:
                stats.append(decode_stats_frame(payload))
            else:
                stored.extend(decode_kv_payload(payload).events)
        return bool(stored) and bool(stats)

    try:
        wait_until(store_step_and_read, "events and a stats frame from the vLLM manager")
    finally:
        manager.shutdown()
        sub.close(0)
        context.term()
    assert stats[0].engine_id == "engine-0"
    assert any(event.kind == "stored" and event.medium == "CPU" for event in stored)
    # vLLM's own events were off: kvscope's publisher does not need them.
    assert list(manager.take_events()) == []
