"""ZMQ endpoints as users write them, checked where they are given.

ZMQ itself refuses a malformed endpoint only when a socket first binds or
connects to it: at start-up that is a traceback from inside ZMQ, and for a
replay endpoint, used only once a gap shows, it was a failure at every later
frame. These patterns accept what ZMQ accepts for the transports that reach
another process (a sidecar never shares a process with its workers, so
``inproc`` is refused too).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

_HOST: Final = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
_BINDABLE: Final = re.compile(rf"tcp://(?P<host>\*|{_HOST}):(?P<port>\*|[0-9]{{1,5}})|ipc://.+")
_CONNECTABLE: Final = re.compile(rf"tcp://{_HOST}:(?P<port>[0-9]{{1,5}})|ipc://.+")


def is_bindable(endpoint: str) -> bool:
    """tcp://HOST:PORT (``*`` for every address, or for a free port) or ipc://PATH."""
    return _fits(_BINDABLE, endpoint, lowest_port=0)


def offset_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint that data-parallel rank ``rank`` binds, so that ranks sharing one
    configuration do not collide.

    vLLM's rule for its own KV-event publisher: a TCP port moves up by the
    rank, a wildcard or 0 port is left to the OS. vLLM leaves an ipc path as
    it is, but ZMQ lets a second socket take over a bound path without an
    error, so here an ipc path gets ``_dp<rank>`` appended, as vLLM names its
    inproc endpoints. A moved port may pass 65535: check the result with
    ``is_bindable``.
    """
    if not rank:
        return endpoint
    if endpoint.startswith("ipc://"):
        return f"{endpoint}_dp{rank}"
    tcp = _fixed_port(endpoint)
    return endpoint if tcp is None else f"tcp://{tcp[0]}:{tcp[1] + rank}"


def ports_overlap(first: str, second: str, ranks: int) -> bool:
    """Whether ``ranks`` data-parallel ranks, each moving both ports up by its rank, would
    bind one port twice: fixed TCP ports fewer than ``ranks`` apart on addresses that
    overlap (``_addresses_overlap``)."""
    a, b = _fixed_port(first), _fixed_port(second)
    if a is None or b is None or not _addresses_overlap(a[0], b[0]):
        return False
    return abs(a[1] - b[1]) < ranks


def _addresses_overlap(first: str, second: str) -> bool:
    """Whether binding one port on both hosts can collide.

    A wildcard binds the port on every address it covers, so the bind of
    another address there fails: ``*`` covers every address, ``0.0.0.0``
    every IPv4 one, and ``[::]`` every address (IPv6, and IPv4 too, as ZMQ
    binds it dual-stack). A host name or interface may be any address, so it
    overlaps every wildcard; two specific addresses overlap when they are one
    address however written (``127.0.0.1``, ``[::ffff:127.0.0.1]``).
    """
    if first == second or "*" in (first, second):
        return True
    a, b = _address(first), _address(second)
    if a is not None and b is not None:
        return a == b or any(
            address.is_unspecified and (address.version == 6 or other.version == 4)
            for address, other in ((a, b), (b, a))
        )
    known = a if a is not None else b
    return known is not None and known.is_unspecified


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A host's IP address (an IPv4-mapped IPv6 one as its IPv4 address); None for a name."""
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _fixed_port(endpoint: str) -> tuple[str, int] | None:
    """A bindable TCP endpoint's host and port; None for ipc, a wildcard port or port 0."""
    match = _BINDABLE.fullmatch(endpoint)
    if match is None or match["port"] in (None, "*") or int(match["port"]) == 0:
        return None
    return match["host"], int(match["port"])


def is_connectable(endpoint: str) -> bool:
    """tcp://HOST:PORT (a host name or address, a port from 1) or ipc://PATH."""
    return _fits(_CONNECTABLE, endpoint, lowest_port=1)


def _fits(pattern: re.Pattern[str], endpoint: str, lowest_port: int) -> bool:
    match = pattern.fullmatch(endpoint)
    if match is None:
        return False
    port = match["port"]
    return port in (None, "*") or lowest_port <= int(port) <= 65535
