"""A publisher speaking vLLM's KV-event protocol on real sockets, under a test's control.

kvscope's own EventPublisher never loses a frame or restarts its sequence on
purpose; the sidecar must cope with publishers that do, so tests use this
minimal peer (PUB + ROUTER replay, vLLM's framing) to produce such streams.
"""

from __future__ import annotations

import threading

import zmq

from app.settings import PublisherEndpoints
from offload.base import OffloadingEvent
from offload.wire.framing import END_OF_REPLAY_SEQ
from offload.wire.kv_events import KVEventBatch, encode_batch, to_kv_events


class RawPublisher:
    """vLLM's protocol on real sockets, under the test's control: it can lose frames."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind("tcp://127.0.0.1:*")
        self.buffer: list[tuple[int, bytes]] = []
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
            self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            identity, _, start = self.router.recv_multipart()
            with self._lock:
                answers = [(s, p) for s, p in self.buffer if s >= int.from_bytes(start, "big")]
            for seq, payload in answers:
                self.router.send_multipart([identity, b"", b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([identity, b"", b"", END_OF_REPLAY_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.ctx.destroy(linger=0)


def kv_payload(*events: OffloadingEvent) -> bytes:
    return encode_batch(KVEventBatch(ts=1.0, events=to_kv_events(list(events))))
