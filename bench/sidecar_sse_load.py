"""Sidecar request latency with 200 event-stream readers open and events flowing.

Run from the repository root: .venv/bin/python -m bench.sidecar_sse_load [--quick]

Issue 15 (item 3) measured /healthz at p50 251 ms, p99 432 ms (from 3 ms)
with 200 Server-Sent-Events readers at about 120 events/s: every reader
rendered every event on the event loop. This is that load, as in production,
over loopback, in four processes: a feeder drives a real EventPublisher
(``--events-per-s`` block events a second, in events of 16 blocks, every
10 ms); ``kvscope serve --port 0`` follows it; a reader process holds
``--readers`` streams open (httpx, one connection each) and reads every
event; this process times sequential GETs of /healthz, /api/v1/stats and
/metrics over one kept-alive connection, interleaved, once every reader is
connected (by the sidecar's own ``kvscope_sidecar_sse_clients``).

One JSON line per endpoint: p50, p99 and max in milliseconds, ``p99_over_target``
(the target is a p99 under 50 ms), the readers connected before and after
(a reader the sidecar shed would show here, and in ``sse_shed``), and the
events the readers received while the client measured, against the events the
sidecar ingested (its ``kvscope_sidecar_events_total``) times the readers.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.sidecar_latency import (
    BLOCK_SIZE,
    BLOCKS_PER_EVENT,
    ENDPOINTS,
    TICK_S,
    join_or_kill,
    latency_fields,
    measure,
    percentiles,
    sidecar_process,
)
from bench.tooling.common import count, emit
from offload.base import OffloadingEvent
from offload.wire.publisher import EventPublisher

TARGET_P99_MS = 50.0
READERS = 200
EVENTS_PER_S = 120
ROUNDS, QUICK_ROUNDS = 500, 150
WARMUP_ROUNDS = 10
CONNECT_TIMEOUT_S = 60.0
STREAM = "/api/v1/events/stream"


def feed(events_per_s: int, stop: EventType, endpoints: Connection) -> None:
    """The feeder process: bind, say where, then store new blocks at a steady rate until ``stop``.

    Each tick publishes whole events of ``BLOCKS_PER_EVENT`` blocks; a rate
    below one event per tick is kept on average by carrying the remainder.
    """
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        endpoints.send((publisher.endpoint, publisher.replay_endpoint))
        owed, newest = 0.0, 0
        next_tick = time.monotonic()
        while not stop.is_set():
            owed += events_per_s * TICK_S
            count, owed = int(owed), owed - int(owed)
            if count:
                publisher.publish_events(
                    [
                        OffloadingEvent(
                            list(range(start, start + BLOCKS_PER_EVENT)), BLOCK_SIZE, "CPU", False
                        )
                        for start in range(newest, newest + count * BLOCKS_PER_EVENT, 16)
                    ]
                )
                newest += count * BLOCKS_PER_EVENT
            next_tick += TICK_S
            time.sleep(max(0.0, next_tick - time.monotonic()))


def read_streams(url: str, readers: int, stop: EventType, counts: Connection) -> None:
    """The reader process: ``readers`` streams read to the end; sends the events each received."""

    async def one(client: httpx.AsyncClient, received: list[int], index: int) -> None:
        async with client.stream("GET", STREAM) as response:
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    received[index] += 1

    async def all_readers() -> list[int]:
        received = [0] * readers
        limits = httpx.Limits(max_connections=readers + 1)
        async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
            tasks = [asyncio.create_task(one(client, received, i)) for i in range(readers)]
            while not stop.is_set():
                await asyncio.sleep(0.05)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return received

    counts.send(asyncio.run(all_readers()))


@contextmanager
def spawned(target: object, *args: object) -> Iterator[tuple[EventType, Connection]]:
    """A spawned process running ``target(*args, stop, sender)``; stopped on exit."""
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    receiver, sender = spawn.Pipe(duplex=False)
    process = spawn.Process(target=target, args=(*args, stop, sender), daemon=True)
    process.start()
    try:
        yield stop, receiver
    finally:
        stop.set()
        join_or_kill(process)


def sidecar_metric(http: httpx.Client, name: str) -> float:
    """One unlabelled sample of the sidecar's own metrics (0 when absent)."""
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return 0.0


def wait_for_readers(http: httpx.Client, readers: int) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while (open_now := sidecar_metric(http, "kvscope_sidecar_sse_clients")) < readers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {open_now:.0f} of {readers} readers connected")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--readers", type=count, default=READERS, help="event-stream readers")
    parser.add_argument("--events-per-s", type=count, default=EVENTS_PER_S, help="block events/s")
    args = parser.parse_args()
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    with (
        tempfile.NamedTemporaryFile("w+", prefix="kvscope-serve-", suffix=".log") as log,
        spawned(feed, args.events_per_s) as (_, endpoints),
    ):
        if not endpoints.poll(CONNECT_TIMEOUT_S):
            raise RuntimeError("the feeder did not bind")
        endpoint, replay_endpoint = endpoints.recv()
        with (
            sidecar_process(endpoint, replay_endpoint, log) as url,
            httpx.Client(base_url=url, timeout=30) as http,
            spawned(read_streams, url, args.readers) as (stop_readers, counts),
        ):
            wait_for_readers(http, args.readers)
            measure(http, WARMUP_ROUNDS)
            events_before, began = (
                sidecar_metric(http, "kvscope_sidecar_events_total"),
                time.monotonic(),
            )
            timings = measure(http, rounds)
            seconds = time.monotonic() - began
            events_after = sidecar_metric(http, "kvscope_sidecar_events_total")
            readers_after = sidecar_metric(http, "kvscope_sidecar_sse_clients")
            shed = sidecar_metric(http, "kvscope_sidecar_sse_shed_total")
            stop_readers.set()
            received = counts.recv() if counts.poll(CONNECT_TIMEOUT_S) else []
    ingested = events_after - events_before
    for path in ENDPOINTS:
        p99 = percentiles(timings[path])[1]
        emit(
            latency_fields("sidecar_sse_load", path, timings[path]) | {
                "target_p99_ms": TARGET_P99_MS,
                "p99_over_target": round(p99 / TARGET_P99_MS, 3),
                "target_met": p99 < TARGET_P99_MS,
                "readers": [args.readers, int(readers_after)], "sse_shed": int(shed),
                "events_per_s": round(ingested / seconds, 1),
                "events_received_by_readers": sum(received),
                "seconds": round(seconds, 1),
            }
        )  # fmt: skip


if __name__ == "__main__":
    main()
