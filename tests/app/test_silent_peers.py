"""A worker whose connection went silent without closing is dropped and connected again.

A subscriber sends nothing once subscribed, so when the worker's host vanished
(or the network between them was cut) its connection looked alive forever,
and the sidecar never connected to the worker that came back at the same
address. A real TCP relay on loopback stands between them here and stalls its
connections: open, carrying nothing.
"""

from __future__ import annotations

import socket

import pytest
import zmq

from app.ingest import Ingestor
from app.ingest.sockets import receiving_socket
from app.settings import IngestConfig, PublisherEndpoints
from offload.base import OffloadingEvent
from offload.wire.heartbeat import PINGS_PER_TIMEOUT
from offload.wire.publisher import EventPublisher
from tests.support.polling import wait_until
from tests.support.tcp_relay import TcpRelay
from tests.support.zmq_peers import ingesting
from tests.support.zmtp_peer import READ_LIMIT_S, handshake, pings_until_closed

pytestmark = pytest.mark.timeout(120)


def address(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def follows(ingestor: Ingestor, publisher: EventPublisher, block: int) -> bool:
    """Publish ``block`` (again: a subscription takes a moment) and say whether it is held."""
    publisher.publish_events([OffloadingEvent([block], 16, "CPU", False)])
    with ingestor.state.lock:
        return ingestor.state.index.get(block) is not None


def test_a_worker_behind_a_silent_connection_is_followed_again_once_it_is_back() -> None:
    with (
        EventPublisher("tcp://127.0.0.1:*") as first,
        TcpRelay(address(first.endpoint)) as relay,
        ingesting(
            PublisherEndpoints(f"tcp://127.0.0.1:{relay.port}"),
            config=IngestConfig(peer_timeout_s=1),
        ) as ingestor,
    ):
        wait_until(lambda: follows(ingestor, first, 1), "the sidecar follows the worker")
        with EventPublisher("tcp://127.0.0.1:*") as second:  # the worker, back
            # Back before the stall: the sidecar connects again within a second of it, and
            # through to the first worker, still alive, if the relay still pointed there.
            relay.target = address(second.endpoint)
            assert relay.stall() == 1
            wait_until(lambda: follows(ingestor, second, 2), "the sidecar follows it again")
        assert relay.accepted == 2


def test_a_publisher_that_answers_no_ping_is_pinged_as_the_publisher_pings_its_peers() -> None:
    """The sidecar's sockets and the publisher's follow one rule (offload/wire/heartbeat.py):
    PINGS_PER_TIMEOUT pings in a peer timeout, then the cut. Each PING is timed from the
    one before, so where the I/O thread runs late some fall past the cut: more than half of
    them (every third of the timeout, the old rule of the publisher, gave half) must come."""
    ctx = zmq.Context()
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(READ_LIMIT_S)
        sub = receiving_socket(ctx, zmq.SUB, IngestConfig(peer_timeout_s=2.4))
        try:
            sub.connect(f"tcp://127.0.0.1:{server.getsockname()[1]}")
            peer, _ = server.accept()
            with peer:
                handshake(peer, b"PUB")
                pings = pings_until_closed(peer)
        finally:
            sub.close(linger=0)
            ctx.term()
    assert PINGS_PER_TIMEOUT // 2 < pings <= PINGS_PER_TIMEOUT
