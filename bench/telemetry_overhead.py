"""The cost of observability: the replay hot path with telemetry fully on vs off.

Run from the repository root: .venv/bin/python -m bench.telemetry_overhead [--rounds N]

Off: counters only (they are always on), events disabled, no publisher.
On: events enabled and shipped every request (each request is a scheduler
step here; vLLM ships once per step, which may hold several prefills, but
shipping once per 8 requests measured within a point or two of this: the
cost is per event, not per call) through the ZMQ publisher to a live
subscriber in another process, a stats frame published and the Prometheus
exposition rendered every second.

The two sides run side by side in one process, interleaved: the trace is cut
into chunks of ``--chunk`` requests (about a millisecond each) and every chunk
is replayed by the off manager and by the on manager, in alternating order,
each timed on its own. A noisy neighbour, a frequency change or a page-cache
hiccup lasts far longer than a chunk and so lands on both sides alike, where
whole-run rounds compared off against on would swing by tens of percent on a
shared host. The publisher's encoding and sending happen inside the on
chunks (its callers flush; see offload/wire/publisher.py); what its background
thread and ZMQ's I/O thread take from the process lands on both sides.

Each round also pairs a fresh off side, the same way, with the bound: the
manager's events made into bytes by one call into C per step and nothing
else (see EncodeBound). Every publisher must do at least that on the
scheduler's thread, so where the bound alone costs about 3%, no publisher
reaches the target.

Each round replays the whole trace with fresh managers; one JSON line per
policy gives every round's overhead, their median (the headline figure), the
bound's, and the cost per block reference. Target: under 3%.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from statistics import median

import msgspec
from prometheus_client import generate_latest

from bench.tooling.common import count, emit, trace
from bench.tooling.pairing import paired_round
from bench.tooling.subscriber import Subscriber
from offload import CPUOffloadingManager
from offload.base import BlockHash
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE
from offload.sim.workload import EventSink, run_request
from offload.wire.publisher import EventPublisher
from offload.worker_telemetry import WorkerTelemetry

EXPORT_PERIOD_S = 1.0
CAPACITY = 2000
FLUSH_INTERVAL_S = 0.01
"""The publisher's default flush interval, which the bound's buffer is emptied at."""


class EventsSide:
    """A replay side with events on: each step's events to a sink, a chore per period.

    The chore runs every ``period_s`` seconds; whether it is due is checked
    once per chunk, so the check costs nothing per request.
    """

    period_s: float

    def __init__(self, policy: str, sink: EventSink) -> None:
        self.manager = CPUOffloadingManager(
            BUNDLED_TRACE_BLOCK_SIZE, CAPACITY, policy, enable_events=True
        )
        self._sink = sink
        self._next_chore = 0.0

    def replay(self, chunk: Sequence[Sequence[BlockHash]]) -> None:
        manager, sink = self.manager, self._sink
        for block_hashes in chunk:
            run_request(manager, block_hashes, sink)
        if time.perf_counter() >= self._next_chore:
            self.chore()
            self._next_chore = time.perf_counter() + self.period_s

    def chore(self) -> None:
        raise NotImplementedError


class TelemetryOn(EventsSide):
    """The on side: the manager's events to the publisher, a stats frame and a scrape per second."""

    period_s = EXPORT_PERIOD_S

    def __init__(self, policy: str, publisher: EventPublisher) -> None:
        super().__init__(policy, publisher.publish_events)
        self.telemetry = WorkerTelemetry(self.manager, engine_id="bench", publisher=publisher)
        self._registry = self.telemetry.registry()

    def chore(self) -> None:
        self.telemetry.publish_stats()
        generate_latest(self._registry)


class TelemetryOff:
    """The off side's replay step: the same loop, events disabled, nothing shipped."""

    def __init__(self, policy: str) -> None:
        self.manager = CPUOffloadingManager(
            BUNDLED_TRACE_BLOCK_SIZE, CAPACITY, policy, enable_events=False
        )

    def replay(self, chunk: Sequence[Sequence[BlockHash]]) -> None:
        manager = self.manager
        for block_hashes in chunk:
            run_request(manager, block_hashes)


class EncodeBound(EventsSide):
    """The bound: each step's events made into bytes by one call into C, nothing more.

    Under the GIL, neither a thread nor another process can take the encoding
    off the scheduler's thread without the same serialisation first, so every
    publisher pays at least this: msgspec's C encoder writing the manager's
    own event structs (not even translated to vLLM's schema) onto a buffer
    that is emptied every flush interval and sent nowhere. No queue, no
    socket, no subscriber, no stats; the handing over is the one Python call
    per step that any sink costs.
    """

    period_s = FLUSH_INTERVAL_S

    def __init__(self, policy: str) -> None:
        buffer = bytearray()
        encode_into = msgspec.msgpack.Encoder().encode_into
        super().__init__(policy, lambda events: encode_into(events, buffer, -1))
        self._buffer = buffer

    def chore(self) -> None:
        self._buffer.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count, default=5, help="whole-trace rounds per policy")
    parser.add_argument("--chunk", type=count, default=32, help="requests per timed chunk")
    args = parser.parse_args()
    _, requests = trace()
    block_refs = sum(len(r) for r in requests)
    with EventPublisher("tcp://127.0.0.1:*") as publisher:
        subscriber = Subscriber(publisher.endpoint)
        try:
            for policy in ("lru", "arc"):
                rounds, bound_overheads = [], []
                for _ in range(args.rounds):
                    off, on = TelemetryOff(policy), TelemetryOn(policy, publisher)
                    rounds.append(paired_round(requests, args.chunk, off.replay, on.replay))
                    off, bound = TelemetryOff(policy), EncodeBound(policy)
                    off_s, bound_s = paired_round(requests, args.chunk, off.replay, bound.replay)
                    bound_overheads.append(bound_s / off_s - 1)
                overheads = [on_s / off_s - 1 for off_s, on_s in rounds]
                off_s = median(off_s for off_s, _ in rounds)
                on_s = median(on_s for _, on_s in rounds)
                emit(
                    {
                        "bench": "telemetry_overhead", "policy": policy, "capacity": CAPACITY,
                        "chunk_requests": args.chunk,
                        "off_blocks_per_s": round(block_refs / off_s),
                        "on_blocks_per_s": round(block_refs / on_s),
                        "overhead": round(median(overheads), 4),
                        "overhead_rounds": [round(o, 4) for o in overheads],
                        "bound_overhead": round(median(bound_overheads), 4),
                        "bound_rounds": [round(o, 4) for o in bound_overheads],
                        # The budget is also stated per block (50-150 ns).
                        "cost_ns_per_block": round((on_s - off_s) / block_refs * 1e9),
                        "frames_received": subscriber.frames,
                        "frames_dropped": publisher.dropped,
                    }
                )  # fmt: skip
        finally:
            subscriber.close()


if __name__ == "__main__":
    main()
