"""A publisher speaking vLLM's KV-event protocol on real sockets, under a test's control.

kvscope's own EventPublisher never loses a frame or restarts its sequence on
purpose; the sidecar must cope with publishers that do, so tests use this
minimal peer (PUB + ROUTER replay, vLLM's framing) to produce such streams.
Like vLLM's publisher, it binds its PUB socket or connects it to a listening
sidecar.
"""

from __future__ import annotations

import socket
import threading

import zmq

from app.settings import PublisherEndpoints
from offload.base import OffloadingEvent
from offload.wire.framing import END_OF_REPLAY_SEQ
from offload.wire.kv_events import KVEventBatch, encode_batch, to_kv_events


class RawPublisher:
    """vLLM's protocol on real sockets, under the test's control: it can lose frames.

    ``connect``: a listening sidecar's endpoint to connect the PUB socket to;
    without it the PUB socket binds a free port. ``topic`` is the KV topic.
    """

    def __init__(self, connect: str | None = None, topic: bytes = b"") -> None:
        self.ctx = zmq.Context()
        self.topic = topic
        self.pub = self.ctx.socket(zmq.PUB)
        if connect is None:
            self.pub.bind("tcp://127.0.0.1:*")
        else:
            self.pub.connect(connect)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind("tcp://127.0.0.1:*")
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def endpoints(self) -> PublisherEndpoints:
        return PublisherEndpoints(
            self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
            self.router.getsockopt_string(zmq.LAST_ENDPOINT),
        )

    def send(self, seq: int, payload: bytes, *, lose: bool = False) -> None:
        with self._lock:
            self.buffer.append((seq, payload))
        if not lose:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            identity, _, start = self.router.recv_multipart()
            with self._lock:
                self.replay_requests += 1
                answers = [(s, p) for s, p in self.buffer if s >= int.from_bytes(start, "big")]
            for seq, payload in answers:
                self.router.send_multipart(
                    [identity, b"", self.topic, seq.to_bytes(8, "big"), payload]
                )
            self.router.send_multipart([identity, b"", b"", END_OF_REPLAY_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.ctx.destroy(linger=0)


def kv_payload(*events: OffloadingEvent, rank: int | None = None) -> bytes:
    batch = KVEventBatch(ts=1.0, events=to_kv_events(list(events)), data_parallel_rank=rank)
    return encode_batch(batch)


def free_tcp_endpoint() -> str:
    """``tcp://127.0.0.1:PORT`` for a port free right now.

    For a peer that must be given its port before anything binds it: vLLM's
    publisher reports a wildcard endpoint as given, not the port it bound.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"
