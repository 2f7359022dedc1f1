"""The cost of observability: the replay hot path with telemetry fully on vs off.

Run from the repository root: .venv/bin/python -m bench.telemetry_overhead [--rounds N]
Off: counters only (they are always on), events disabled, no publisher.
On: events enabled and shipped every request through the ZMQ publisher to a
live subscriber in another process, a stats frame published every second (a
worker's cadence; checked every 256 requests), and the Prometheus exposition
rendered after every round. Rounds alternate
off/on so drift hits both sides alike; the best round of each is compared.
Target (BENCHMARKS.md): on is less than 3% slower.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from statistics import median

import zmq
from prometheus_client import generate_latest

from bench.common import BLOCK_SIZE, emit, trace
from offload import CPUOffloadingManager
from offload.publisher import EventPublisher
from offload.replay import replay_request
from offload.worker_telemetry import WorkerTelemetry

CHECK_EVERY = 256
STATS_PERIOD_S = 1.0


class Subscriber:
    """A live SUB socket in its own process, as the sidecar would be, counting frames.

    Out of process so that it competes with the replay for CPU as a real
    consumer does, not for this interpreter's lock as a thread would.
    """

    def __init__(self, endpoint: str) -> None:
        self._stop = multiprocessing.Event()
        self._frames = multiprocessing.Value("q", 0)
        self._process = multiprocessing.Process(
            target=_subscribe, args=(endpoint, self._stop, self._frames), daemon=True
        )
        self._process.start()

    @property
    def frames(self) -> int:
        return int(self._frames.value)

    def close(self) -> None:
        self._stop.set()
        self._process.join()


def _subscribe(endpoint: str, stop: EventType, frames: Synchronized) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    while not stop.is_set():
        if sock.poll(100):
            sock.recv_multipart()
            frames.value += 1
    sock.close(linger=0)
    ctx.term()


def run_off(requests: list[list[int]], policy: str, capacity: int) -> float:
    manager = CPUOffloadingManager(BLOCK_SIZE, capacity, policy, enable_events=False)
    start = time.perf_counter()
    for block_hashes in requests:
        replay_request(manager, block_hashes)
    return time.perf_counter() - start


def run_on(
    requests: list[list[int]], policy: str, capacity: int, publisher: EventPublisher
) -> float:
    manager = CPUOffloadingManager(BLOCK_SIZE, capacity, policy, enable_events=True)
    telemetry = WorkerTelemetry(manager, engine_id="bench", publisher=publisher)
    registry = telemetry.registry()
    sink = publisher.publish_events
    start = last_stats = time.perf_counter()
    telemetry.publish_stats()
    for index, block_hashes in enumerate(requests):
        replay_request(manager, block_hashes, sink)
        if index % CHECK_EVERY == 0 and time.perf_counter() - last_stats >= STATS_PERIOD_S:
            telemetry.publish_stats()
            last_stats = time.perf_counter()
    generate_latest(registry)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating off/on rounds")
    args = parser.parse_args()
    _, requests = trace()
    block_refs = sum(len(r) for r in requests)
    with EventPublisher("tcp://127.0.0.1:*") as publisher:
        subscriber = Subscriber(publisher.endpoint)
        try:
            for policy in ("lru", "arc"):
                capacity = 2000
                off, on = [], []
                for _ in range(args.rounds):
                    off.append(run_off(requests, policy, capacity))
                    on.append(run_on(requests, policy, capacity, publisher))
                emit(
                    {
                        "bench": "telemetry_overhead", "policy": policy, "capacity": capacity,
                        "off_blocks_per_s": round(block_refs / min(off)),
                        "on_blocks_per_s": round(block_refs / min(on)),
                        "overhead": round(min(on) / min(off) - 1, 4),
                        "overhead_median": round(median(on) / median(off) - 1, 4),
                        # The budget is stated per block (50-150 ns): same figure.
                        "cost_ns_per_block": round((min(on) - min(off)) / block_refs * 1e9),
                        "frames_received": subscriber.frames,
                        "frames_dropped": publisher.dropped,
                    }
                )  # fmt: skip
        finally:
            subscriber.close()


if __name__ == "__main__":
    main()
