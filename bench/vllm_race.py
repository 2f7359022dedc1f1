"""vLLM interface race: kvscope's vLLM manager against vLLM 0.33's own, events published.

Run from the repository root: .venv/bin/python -m bench.vllm_race [--repeat R] [--requests N]
Both managers are driven through vLLM 0.33's ``OffloadingManager`` interface
through the canonical workload's loop that the vLLM peer benchmark also runs
(``bench/tooling/peer_workload.py``: key-by-key lookup, load and touch, store,
finish, events drained every request) on the bundled trace, in the same run:
kvscope built by vLLM's ``OffloadingSpecFactory`` with its publisher to a
live subscriber, and vLLM's ``CPUOffloadingManager`` with its events turned
into a ``KVEventBatch`` for vLLM's ``ZmqEventPublisher`` to a live subscriber.
Also the adapter's cost (kvscope's vLLM manager, no events, against its core
manager's own API) and the publisher's cost (endpoint against none, and the
time inside its calls on the scheduler's thread alone), in ns per block
reference. Best of R runs each, the sides taking turns; timings are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.tooling.common import count, emit
from bench.tooling.peer_workload import load_keys, replay
from bench.tooling.subscriber import Subscriber
from bench.tooling.vllm_config import kvscope_manager
from offload import CPUOffloadingManager as CoreManager
from offload.sim.mooncake import bundled_trace_path
from offload.sim.workload import run_workload

POLICIES = ("lru", "arc")
CAPACITIES = (1000, 4000)
TOKENS_PER_BLOCK = 16
"""tokens per block of the config bench.tooling.vllm_config builds (one block per chunk)."""


@dataclass(frozen=True, slots=True)
class Run:
    hits: int
    block_refs: int
    seconds: float
    received: int = 0
    """Messages the live subscriber got (0 where nothing was published)."""
    step_end_seconds: float = 0.0
    """Time inside ``on_schedule_end``, where kvscope's publisher encodes and sends."""

    @property
    def blocks_per_s(self) -> float:
        return self.block_refs / self.seconds

    @property
    def ns_per_block(self) -> float:
        return self.seconds * 1e9 / self.block_refs

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.block_refs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_kvscope(
    requests: list[list[bytes]], policy: str, capacity: int, *, publish: bool, events: bool
) -> Run:
    """kvscope through vLLM's factory; with ``publish``, its publisher to a live subscriber."""
    from vllm.v1.kv_offload.base import ScheduleEndContext

    extra: dict[str, Any] = {}
    subscriber = None
    if publish:
        port = free_port()
        extra["kvscope_endpoint"] = f"tcp://127.0.0.1:{port}"
    manager = kvscope_manager(capacity, policy, enable_events=events, **extra)
    if publish:
        subscriber = Subscriber(f"tcp://127.0.0.1:{port}")
    end = ScheduleEndContext((), ())

    def drain() -> None:
        deque(manager.take_events(), maxlen=0)

    in_step_end = [0.0]

    def step_end() -> None:
        started = time.perf_counter()
        manager.on_schedule_end(end)
        in_step_end[0] += time.perf_counter() - started

    try:
        hits, block_refs, seconds = replay(manager, requests, drain, step_end if publish else None)
    finally:
        manager.shutdown()
    received = 0
    if subscriber is not None:
        time.sleep(0.2)
        subscriber.close()
        received = subscriber.frames
    return Run(hits, block_refs, seconds, received, in_step_end[0])


def run_vllm(requests: list[list[bytes]], policy: str, capacity: int) -> Run:
    """vLLM 0.33's CPU manager, its events as KVEventBatches through vLLM's ZmqEventPublisher."""
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import (
        OffloadingEventsTracker,
    )
    from vllm.v1.kv_offload.base import OffloadingKVEventsConfig
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    port = free_port()
    manager = CPUOffloadingManager(num_chunks=capacity, cache_policy=policy, enable_events=True)
    # The connector's own translation (self-describing payloads off, vLLM's default).
    tracker = OffloadingEventsTracker(
        OffloadingKVEventsConfig(enable_kv_cache_events=True, self_describing_kv_events=False)
    )
    publisher = ZmqEventPublisher(0, endpoint=f"tcp://*:{port}")
    subscriber = Subscriber(f"tcp://127.0.0.1:{port}")

    def drain() -> None:
        # As the scheduler does: the connector's events, one batch per step.
        events = list(tracker.take_events(list(manager.take_events())))
        if events:
            publisher.publish(KVEventBatch(ts=time.time(), events=events))

    try:
        hits, block_refs, seconds = replay(manager, requests, drain)
    finally:
        publisher.shutdown()
    time.sleep(0.2)
    subscriber.close()
    return Run(hits, block_refs, seconds, subscriber.frames)


def run_core(requests: list[list[bytes]], policy: str, capacity: int) -> Run:
    """kvscope's core manager through its own API, events off, as bench.hot_path drives it."""
    result = run_workload(CoreManager(TOKENS_PER_BLOCK, capacity, policy), requests)
    return Run(result.hits, result.block_refs, result.seconds)


def best(runs: list[Run]) -> Run:
    return min(runs, key=lambda run: run.seconds)


SIDES: dict[str, Callable[[list[list[bytes]], str, int], Run]] = {
    "ours": partial(run_kvscope, publish=True, events=True),
    "peer": run_vllm,
    "bare_events": partial(run_kvscope, publish=False, events=True),
    "bare": partial(run_kvscope, publish=False, events=False),
    "core": run_core,
}
"""kvscope fully on, vLLM's path, kvscope without an endpoint, kvscope with
events off, and kvscope's core manager: the differences are the race, the
publisher's cost and the adapter's cost."""


def race(requests: list[list[bytes]], policy: str, capacity: int, repeat: int) -> dict[str, Run]:
    """The fastest of ``repeat`` runs of every side, the sides taking turns round by
    round, so a busy spell of a shared machine falls on all of them alike."""
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}
    for _ in range(repeat):
        for side, run in SIDES.items():
            runs[side].append(run(requests, policy, capacity))
    return {side: best(side_runs) for side, side_runs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=count, default=3, help="runs per side; best is kept")
    parser.add_argument("--requests", type=count, default=None, help="replay only the first N")
    args = parser.parse_args()
    from vllm.v1.kv_offload.base import make_offload_key

    requests = load_keys(bundled_trace_path(), make_offload_key)[: args.requests]
    for policy in POLICIES:
        for capacity in CAPACITIES:
            runs = race(requests, policy, capacity, args.repeat)
            ours, peer, bare_events = runs["ours"], runs["peer"], runs["bare_events"]
            bare, core = runs["bare"], runs["core"]
            base = {"bench": "vllm_race", "policy": policy, "capacity": capacity}
            emit(
                {
                    **base,
                    "measure": "race",
                    "requests": len(requests),
                    "block_refs": ours.block_refs,
                    "blocks_per_s": round(ours.blocks_per_s),
                    "vllm_blocks_per_s": round(peer.blocks_per_s),
                    "ratio": round(ours.blocks_per_s / peer.blocks_per_s, 2),
                    "hit_ratio": round(ours.hit_ratio, 4),
                    "vllm_hit_ratio": round(peer.hit_ratio, 4),
                    "ns_per_block": round(ours.ns_per_block, 1),
                    "vllm_ns_per_block": round(peer.ns_per_block, 1),
                    "messages_received": ours.received,
                    "vllm_messages_received": peer.received,
                }
            )
            emit(
                {
                    **base,
                    "measure": "adapter_cost",
                    "events": False,
                    "ns_per_block": round(bare.ns_per_block, 1),
                    "core_ns_per_block": round(core.ns_per_block, 1),
                    "adapter_ns_per_block": round(bare.ns_per_block - core.ns_per_block, 1),
                    "hit_ratio": round(bare.hit_ratio, 4),
                    "core_hit_ratio": round(core.hit_ratio, 4),
                }
            )
            emit(
                {
                    **base,
                    "measure": "publisher_cost",
                    "events": True,
                    "ns_per_block": round(ours.ns_per_block, 1),
                    "no_endpoint_ns_per_block": round(bare_events.ns_per_block, 1),
                    "publisher_ns_per_block": round(
                        ours.ns_per_block - bare_events.ns_per_block, 1
                    ),
                    "publisher_calls_ns_per_block": round(
                        ours.step_end_seconds * 1e9 / ours.block_refs, 1
                    ),
                }
            )


if __name__ == "__main__":
    main()
