"""What ZMQ makes of a connect, as only its monitor tells.

ZMQ takes a connect it can never make (a source it cannot leave from, a zone of
another link) without an error and retries it in silence: the settings refuse
such endpoints, and the tests show ZMQ's side with a real connect.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import zmq
from zmq import EVENT_CONNECT_RETRIED, EVENT_CONNECTED
from zmq.utils.monitor import recv_monitor_message

from offload.wire.endpoint_host import resolved_families
from offload.wire.endpoints import connects_ipv6


def first_connect_event(form: str) -> tuple[str, int]:
    """The endpoint ``form`` names (``{port}`` the port of a socket bound here on every
    address, IPv6 included) and the first of ``EVENT_CONNECTED`` and
    ``EVENT_CONNECT_RETRIED`` ZMQ's monitor sees of a connect to it."""
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.ipv6 = True
        pull.bind("tcp://[::]:*")
        endpoint = form.format(port=pull.last_endpoint.decode().rpartition(":")[2])
        with context.socket(zmq.PUSH) as push:
            push.linger = 0
            push.ipv6 = ipv6(endpoint)
            with push.get_monitor_socket(EVENT_CONNECTED | EVENT_CONNECT_RETRIED) as monitor:
                monitor.linger = 0
                monitor.rcvtimeo = 60_000  # a bound on a failure, not a measured time
                push.connect(endpoint)
                event = recv_monitor_message(monitor)["event"]
                push.disable_monitor()
    return endpoint, event


@contextmanager
def pull_on_every_ipv4_address() -> Iterator[tuple[zmq.Context, zmq.Socket, str]]:
    """A context, a PULL socket bound on every IPv4 address (``tcp://*:*``, as a listen
    endpoint of ``*`` binds) and its port, for ``reached``."""
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        pull.bind("tcp://*:*")
        yield context, pull, pull.last_endpoint.decode().rpartition(":")[2]


def reached(context: zmq.Context, pull: zmq.Socket, endpoint: str) -> zmq.Frame:
    """What ``pull`` receives of a message sent through a connect to ``endpoint`` (with ZMQ's
    IPv6 option as the settings would set it)."""
    with context.socket(zmq.PUSH) as push:
        push.linger = 0
        push.ipv6 = ipv6(endpoint)
        push.connect(endpoint)
        push.send(b"reached")
        return pull.recv(copy=False)


def ipv6(endpoint: str) -> bool:
    """ZMQ's IPv6 option for a connect to ``endpoint``, as the sidecar sets it."""
    return connects_ipv6(endpoint, resolved_families([endpoint])[endpoint])
