"""A live ZMQ subscriber in a process of its own, for benchmarks that publish.

Out of process, as the sidecar is: it competes with the measured side for
CPU as a real consumer does, not for this interpreter's lock as a thread
would (an in-process receiving thread was charged to the publisher's cost).
Spawned, not forked: a forked child shares the parent's pages copy-on-write,
and the parent's next pass over a trace would then pay a page fault per page
it touches (measured: +30% on bench.telemetry_overhead's first round).
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType

import zmq

START_TIMEOUT_S = 60.0
SUBSCRIBE_S = 0.2
"""How long a new subscription takes to reach the publisher over loopback, generously:
frames published before it arrives are not delivered."""


class Subscriber:
    """A SUB socket subscribed to every topic, counting the frames it receives."""

    def __init__(self, endpoint: str) -> None:
        """Start the process; returns once its subscription has had time to arrive."""
        spawn = multiprocessing.get_context("spawn")
        ready = spawn.Event()
        self._stop = spawn.Event()
        self._frames = spawn.Value("q", 0)
        self._process = spawn.Process(
            target=_subscribe, args=(endpoint, ready, self._stop, self._frames), daemon=True
        )
        self._process.start()
        if not ready.wait(START_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the subscriber to {endpoint} did not start in {START_TIMEOUT_S} s")
        time.sleep(SUBSCRIBE_S)

    @property
    def frames(self) -> int:
        """Frames received so far."""
        return int(self._frames.value)

    def close(self) -> None:
        self._stop.set()
        self._process.join()


def _subscribe(endpoint: str, ready: EventType, stop: EventType, frames: Synchronized) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    ready.set()
    while not stop.is_set():
        if sock.poll(100):
            sock.recv_multipart()
            frames.value += 1
    sock.close(linger=0)
    ctx.term()
