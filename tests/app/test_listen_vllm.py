"""vLLM's own KV-event publisher, from the installed vLLM, connecting to a listening sidecar.

vLLM's ``ZmqEventPublisher`` connects its PUB socket when its endpoint names a
host (``tcp://sidecar:5557``) and binds its replay socket; the sidecar binds
the listen socket and asks that replay socket for what it missed. Nothing of
vLLM is stood in for: the publisher, its thread, its sockets and its encoding
are the installed release's. Skips where vLLM is not installed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from app.ingest import Ingestor
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState
from offload.base import OffloadingEvent
from offload.wire.framing import END_OF_REPLAY_SEQ, decode_seq, replay_request
from offload.wire.publisher import EventPublisher
from tests.support.polling import wait_for, wait_until

kv_events = pytest.importorskip("vllm.distributed.kv_events")

pytestmark = pytest.mark.timeout(120)

LISTEN = "tcp://127.0.0.1:*"
STREAM = "vllm-gpu@0"
"""vLLM's topic, set below, and its data-parallel rank, which it stamps on every batch."""


def digest(n: int) -> bytes:
    """A block hash as vLLM's are: 32 bytes of sha256."""
    return n.to_bytes(32, "big")


def stored(*blocks: int, parent: int | None = None) -> Any:
    return kv_events.BlockStored(
        block_hashes=[digest(b) for b in blocks],
        parent_block_hash=None if parent is None else digest(parent),
        token_ids=list(range(16 * len(blocks))), block_size=16, lora_id=None,
        medium=None, lora_name=None,
    )  # fmt: skip


def batch(*events: Any) -> Any:
    return kv_events.KVEventBatch(ts=time.time(), events=list(events))


def buffered(replay_endpoint: str) -> list[int]:
    """The sequence numbers vLLM's replay socket holds, asked as the sidecar asks."""
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_endpoint)
        dealer.send_multipart(replay_request(0))
        held = []
        while dealer.poll(5000):
            _, _, seq, _ = dealer.recv_multipart()
            if seq == END_OF_REPLAY_SEQ:
                return held
            held.append(decode_seq(seq))
        raise AssertionError(f"no end marker from {replay_endpoint}")
    finally:
        ctx.destroy(linger=0)


def gpu_blocks(ingestor: Ingestor) -> set[bytes | int]:
    with ingestor.state.lock:
        entries = [ingestor.state.index.get(digest(n)) for n in range(100)]
    return {e.block_hash for e in entries if e is not None and "GPU" in e.media}


def sidecar(**settings: object) -> Ingestor:
    """The sidecar's ingestor as ``kvscope serve --listen`` builds it, its listen socket
    bound to a loopback port of its own choosing; not started, so no handshake completes
    (its gate does not answer yet) and nothing published is received until it is.

    Bound before vLLM's publisher is made, because that publisher must be told the
    port to connect to: a port probed free and bound by the sidecar only later could
    be taken in between."""
    return Ingestor(SidecarState.from_settings(SidecarSettings(listen=[LISTEN], **settings)))


@contextmanager
def vllm_publisher(ingestor: Ingestor, replay: str | None = None) -> Iterator[Any]:
    """vLLM's publisher, connecting to ``ingestor``'s listen socket as bound, its replay
    socket bound to ``replay`` (none without it)."""
    listener = ingestor.state.listener
    assert listener is not None
    publisher = kv_events.ZmqEventPublisher(
        data_parallel_rank=0, endpoint=listener.bound[0], replay_endpoint=replay, topic="vllm-gpu"
    )
    try:
        yield publisher
    finally:
        publisher.shutdown()


def test_vllms_publisher_connects_to_a_listening_sidecar_that_catches_up_by_replay(
    tmp_path: Path,
) -> None:
    # The sidecar must be told the replay endpoint before it binds, and vLLM its listen
    # endpoint, bound by then: vLLM's replay socket is an ipc:// path, known before anything
    # binds it and taken by nothing else, where a TCP port would have to be probed free.
    replay = f"ipc://{tmp_path / 'replay'}"
    ingestor = sidecar(listen_replay=[f"{STREAM}={replay}"])
    try:
        with vllm_publisher(ingestor, replay) as publisher:
            # Published before the sidecar runs: nobody is subscribed, only vLLM's buffer
            # holds them.
            publisher.publish(batch(stored(1, 2)))
            publisher.publish(batch(stored(3, parent=2)))
            wait_for(lambda: buffered(replay), lambda held: held == [0, 1], "vLLM sent both")

            ingestor.start()
            state = ingestor.state.publishers[STREAM]

            def probe() -> bool:  # each probe is a batch of its own, received or replayed
                publisher.publish(batch(stored(50)))
                return state.seen

            wait_until(probe, "vLLM's publisher connects to the listen socket")
            removal = kv_events.BlockRemoved(block_hashes=[digest(1)], medium=None)
            publisher.publish(batch(removal))
            expected = {digest(2), digest(3), digest(50)}
            wait_until(lambda: gpu_blocks(ingestor) == expected, "vLLM's batches and removal")
            assert state.replayed >= 2  # the two published before the sidecar started
            assert (state.gaps, state.missed, state.restarts, state.malformed) == (0, 0, 0, 0)
            assert state.source.mode == "listen"
            with ingestor.state.lock:
                third = ingestor.state.index.get(digest(3))
            assert third is not None
            assert (third.media, third.publishers, third.block_size) == (("GPU",), (STREAM,), 16)
    finally:
        ingestor.close()


def test_one_sidecar_sees_vllms_gpu_events_and_kvscopes_cpu_events_of_one_engine() -> None:
    """vLLM's publisher connects to the listen socket; kvscope's binds and is connected to."""
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as cpu:
        ingestor = sidecar(connect=[cpu.endpoint], replay=[cpu.replay_endpoint])
        try:
            with vllm_publisher(ingestor) as gpu:
                ingestor.start()
                gpu.publish(batch(stored(1, 2)))
                cpu.publish_events([OffloadingEvent([digest(1)], 16, "CPU", False)])

                def both_seen() -> bool:  # slow joiners both ways: resend until each is heard
                    publishers = ingestor.state.publishers
                    if STREAM not in publishers:
                        gpu.publish(batch(stored(1, 2)))
                    if publishers[cpu.endpoint].batches_applied == 0:
                        cpu.publish_events([OffloadingEvent([digest(1)], 16, "CPU", False)])
                    return STREAM in publishers and publishers[cpu.endpoint].batches_applied > 0

                wait_until(both_seen, "the sidecar hears both publishers")
            with ingestor.state.lock:
                entry = ingestor.state.index.get(digest(1))
                by_medium = ingestor.state.index.blocks_by_medium()
            assert entry is not None
            assert entry.media == ("CPU", "GPU")
            assert entry.publishers == tuple(sorted((STREAM, cpu.endpoint)))
            assert by_medium == {"GPU": 2, "CPU": 1}
        finally:
            ingestor.close()
