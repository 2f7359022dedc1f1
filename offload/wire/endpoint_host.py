"""ZMQ endpoints checked against the host that uses them.

``endpoint_refusal`` (offload/wire/endpoints.py) reads an endpoint as text,
the same on every host. Where the host that checks an endpoint is the one that
uses it, ``interface_refusal`` also refuses a zone naming an interface that
host does not have, and ``source_refusal`` a source it cannot leave from, or
one of another family than all the target name resolves to there
(``resolved_addresses``, ``resolved_families``: each name looked up once, its
answer passed on to whatever else needs it); ``listened_addresses`` finds where
ZMQ binds each host an endpoint to bind names (the sidecar's listen endpoints, the
connector's publisher's), ``unbindable_host`` says why one it binds nothing for is
refused, and ``connect_reaches`` tells whether a connect reaches a socket this host
binds, by those answers.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from typing import Final

import zmq

from offload.shown import shown_repr
from offload.wire.endpoints import (
    ZONE_NUMBER,
    Family,
    bound_address,
    connect_target,
    connects_ipv6,
    family_mismatch,
    fixed_port,
    host_address,
    host_and_port,
    host_family,
    is_ipv4_text,
    link_zone,
)


def interface_refusal(endpoint: str) -> str | None:
    """Why this host cannot use ``endpoint``, one ``endpoint_refusal`` takes, for a zone (the
    host's or a connect source's) that names no interface here, as the rest of a sentence
    that starts with the endpoint; None where it names one, or none.

    The shape check takes any interface name as a zone. ZMQ refuses a bind to a zone
    naming no interface, but takes such a connect and retries it in silence for ever. So
    where an endpoint is checked on the host that uses it (the sidecar's settings, the
    connector's scheduler as it binds), each zone must name an interface of this host;
    not where vLLM reads the connector's endpoints in every worker process, on every node.
    Neither DNS nor a socket is used: a connect's source is ``source_refusal``'s.
    """
    if not endpoint.startswith("tcp://"):
        return None
    source, _, target = endpoint.removeprefix("tcp://").rpartition(";")
    source_host = host_and_port(source)[0] if source else None
    for host in (host_and_port(target)[0], source_host):
        problem = None if host is None else _zone_absent(host)
        if problem is not None:
            return f"cannot be used on this host: {problem}"
    return None


def source_refusal(endpoint: str, family: Family | None) -> str | None:
    """Why this host cannot leave from the source address of ``endpoint``, a connect
    ``interface_refusal`` takes, as the rest of a sentence that starts with the endpoint;
    None where it can, or the connect has no source. ``family``: what its host resolved to
    (``resolved_families``), so that a name is looked up once however many checks and
    sockets use the answer.

    The shape check takes any source. ZMQ takes a connect leaving from an interface this
    host lacks, or one with no address of the connect's family, from an address this host
    does not have, or from a port another socket holds, and retries it in silence for
    ever; so a source is bound here as ZMQ binds it for the connect
    (``_source_bind_problem``). From an interface's name ZMQ leaves from its address of the
    connect's family (``connects_ipv6``); from an address, of its own family, it never
    reaches a name that resolves to the other family alone (``family_mismatch``). Call it
    at start-up: it binds a socket.
    """
    if not endpoint.startswith("tcp://"):
        return None
    source = endpoint.removeprefix("tcp://").rpartition(";")[0]
    if not source:
        return None
    if host_family(host_and_port(source)[0]) is None:  # an interface's name
        problem = _source_bind_problem(source, ipv6=connects_ipv6(endpoint, family))
    else:
        problem = family_mismatch(endpoint, family) or _source_bind_problem(
            source, ipv6=source.startswith("[")
        )
    if problem is None:
        return None
    return f"cannot be used on this host: the source address {shown_repr(source)}: {problem}"


_LISTED_INTERFACES: Final = 8
"""Most of this host's interfaces a refusal names: a node may have hundreds (a veth a pod)."""


def _zone_absent(host: str) -> str | None:
    """Why the zone of a bracketed ``host`` names no interface of this host; None where it
    names one, or ``host`` has none."""
    if not host.startswith("[") or "%" not in host:
        return None
    zone = host[1:-1].partition("%")[2]
    try:
        if ZONE_NUMBER.fullmatch(zone):
            socket.if_indextoname(int(zone))
        else:
            socket.if_nametoindex(zone)
    except OSError:
        return (
            f"the zone of {shown_repr(host)} names no interface of this host "
            f"(its interfaces: {interfaces()})"
        )
    return None


def _source_bind_problem(source: str, *, ipv6: bool) -> str | None:
    """Why ZMQ cannot leave from ``source``, ``SOURCE:PORT`` (an interface's name or an IP
    address); None where it can.

    ZMQ resolves a source as it does the address of a bind (no DNS, an interface's name
    looked up among this host's, the connect's IPv6 option choosing the family), and
    binds the connecting socket to it, at its port: so a bind of the same source fails
    where the connect would, and for the same reason (a port another socket holds too)."""
    host, port = host_and_port(source)
    family = 6 if ipv6 else 4
    is_name = not host.startswith("[") and not is_ipv4_text(host)
    if is_name:
        try:
            socket.if_nametoindex(host)
        except OSError:
            return (
                f"{shown_repr(host)} is no interface of this host (its interfaces: {interfaces()})"
            )
    with zmq.Context() as context, context.socket(zmq.PULL) as sock:
        sock.linger = 0
        sock.ipv6 = ipv6
        try:
            sock.bind(f"tcp://{source}")
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"its port {port} is in use on this host (0 leaves from a free one)"
            if is_name:
                return (
                    f"the interface {shown_repr(host)} has no IPv{family} address, which ZMQ "
                    "leaves from for this connect"
                )
            return (
                f"ZMQ cannot leave from {shown_repr(host)} (IPv{family}): "
                f"{zmq.strerror(exc.errno)}; it must be an address of this host"
            )
    return None


def interfaces() -> str:
    """This host's interfaces by name and number, at most ``_LISTED_INTERFACES`` of them."""
    named = [f"{name} ({index})" for index, name in socket.if_nameindex()]
    more = len(named) - _LISTED_INTERFACES
    listed = ", ".join(named[:_LISTED_INTERFACES])
    return f"{listed} and {more} more" if more > 0 else listed


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
"""An IP address as a look-up or an endpoint's text gives it (its zone aside)."""


def resolved_addresses(endpoints: Iterable[str]) -> dict[str, Address | None]:
    """The address each connect endpoint's host stands for now, the one ZMQ connects to: an
    address's own, and a name's first of the family it is looked up in, that of its source
    address first where it has one (else IPv4 first: a name of both families is reached
    over IPv4, ``connects_ipv6``), the other where the name has addresses of it alone;
    None for a name with no address now (its service not up yet), whose answer is still
    to come (the sidecar looks such a name up again while its publisher is unheard:
    app/ingest/families.py), and for ipc.

    Each host name is looked up once for all the endpoints that name it from sources of
    one family (a publisher's live and replay endpoints), one family at a time as ZMQ
    looks it up. May wait on DNS: call it where a start may wait, not on a path that must
    not stall; and pass its answer on (``families_of``, ``connect_reaches``) rather than
    look up again.
    """
    looked_up: dict[tuple[str, Family], Address | None] = {}
    found: dict[str, Address | None] = {}
    for endpoint in endpoints:
        if not endpoint.startswith("tcp://"):
            found[endpoint] = None
            continue
        source, _, target = endpoint.removeprefix("tcp://").rpartition(";")
        host = host_and_port(target)[0]
        if host_family(host) is not None:
            found[endpoint] = _literal_address(host)
            continue
        first = (host_family(host_and_port(source)[0]) if source else None) or 4
        if (host, first) not in looked_up:
            looked_up[host, first] = _name_address(host, first)
        found[endpoint] = looked_up[host, first]
    return found


def resolved_families(endpoints: Iterable[str]) -> dict[str, Family | None]:
    """The family each connect endpoint's host resolves to now (``resolved_addresses``, whose
    look-up and terms it shares)."""
    return families_of(resolved_addresses(endpoints))


def families_of(addresses: Mapping[str, Address | None]) -> dict[str, Family | None]:
    """The family of each endpoint's address (an IPv4-mapped one's is 4), as
    ``resolved_addresses`` found it; None where it found none."""
    return {
        endpoint: None if address is None else (4 if address.version == 4 else 6)
        for endpoint, address in addresses.items()
    }


def _literal_address(host: str) -> Address:
    """The address ``host``, an IP address (``host_family`` has one), stands for, the short
    IPv4 forms the resolver reads (``127.1``) included."""
    return host_address(host) or ipaddress.IPv4Address(socket.inet_aton(host))


def _name_address(host: str, first: Family) -> Address | None:
    """The first address of ``first`` the name ``host`` has now, else the first of the other
    family, else None."""
    other: Family = 6 if first == 4 else 4
    for family in (first, other):
        address = _first_address(host, socket.AF_INET if family == 4 else socket.AF_INET6)
        if address is not None:
            return address
    return None


def _first_address(host: str, family: socket.AddressFamily) -> Address | None:
    """The first address of ``family`` ``host`` has now, as ZMQ takes it (an IPv4 literal
    has none in IPv6); None for none."""
    try:
        found = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    return answer_address(found[0][4]) if found else None


def answer_address(sockaddr: tuple[str, int] | tuple[str, int, int, int]) -> Address:
    """The address of a socket address ``getaddrinfo`` answers, as ZMQ connects to it: a
    link-local IPv6 one with its zone, the number of the interface it is on (the answer's
    ``scope_id``: a resolver that knows the link, mDNS's, gives one), which makes it one
    address per link as a zone written in an endpoint does; any other without one, as the
    kernel ignores it."""
    address = _literal_address(sockaddr[0])
    if address.version == 6 and address.is_link_local and len(sockaddr) == 4 and sockaddr[3]:
        return ipaddress.IPv6Address(f"{address}%{sockaddr[3]}")
    return address


def listened_addresses(endpoints: Iterable[str]) -> dict[str, Address | str]:
    """What each endpoint kvscope binds (one ``endpoint_refusal`` takes to bind) binds
    its host at, as ZMQ binds it: an address's own, ``*`` 0.0.0.0 (``bound_address``), and a
    name's the address ZMQ binds for it; for a name ZMQ binds nothing for, why, as ZMQ says
    it; ipc:// endpoints are left out.

    ZMQ binds a name as an interface's, at its first IPv4 address (``tcp://eth0:5557``; the
    sidecar and the connector's publisher bind a name without the IPv6 option,
    ``binds_ipv6``), else as a host name looked up, at its first IPv4 address
    (``localhost`` is 127.0.0.1), case and a trailing dot included (``LO`` and ``lo.``
    name no interface). Rather than follow that here, each name is bound as ZMQ binds it,
    at a free port, and its ``LAST_ENDPOINT`` read. Call it at start-up: it binds a socket
    for each name, and may wait on DNS.
    """
    found: dict[str, Address | str] = {}
    for endpoint in endpoints:
        if not endpoint.startswith("tcp://"):
            continue
        host = host_and_port(endpoint.removeprefix("tcp://"))[0]
        found[endpoint] = bound_address(host) or _bind_name(host)
    return found


def unbindable_host(reason: str) -> str:
    """Why an endpoint to bind is refused whose host name ZMQ binds no address for
    (``listened_addresses`` answered ``reason``, ZMQ's words), as the rest of a sentence
    that starts with the endpoint: what a name to bind is, and this host's interfaces.
    One sentence for every endpoint kvscope binds (the sidecar's ``--listen``, the
    connector's publisher), said before the socket that would fail is made."""
    return (
        f"cannot be bound on this host: ZMQ binds no address for its host ({reason}); a name "
        "to bind is one of this host's interfaces or a host name of one of its IPv4 addresses "
        f"(its interfaces: {interfaces()})"
    )


def _bind_name(host: str) -> Address | str:
    """The address ZMQ binds for the name ``host`` (``listened_addresses``), or ZMQ's reason
    for binding nothing there."""
    with zmq.Context() as context, context.socket(zmq.PULL) as sock:
        sock.linger = 0
        try:
            sock.bind(f"tcp://{host}:0")
        except zmq.ZMQError as exc:
            return zmq.strerror(exc.errno)
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return _literal_address(host_and_port(bound.removeprefix("tcp://"))[0])


def connect_reaches(
    connect: str, resolved: Address | None, bound: str, listened: Address | None
) -> bool:
    """Whether a connect to ``connect`` (one ``endpoint_refusal`` takes to connect to), whose
    host stood for ``resolved`` (``resolved_addresses``), reaches the socket this host binds
    at ``bound`` (one it takes to bind), whose host ZMQ binds at ``listened``
    (``listened_addresses``; None: nothing, or ipc).

    Endpoints are compared as ZMQ reads them, not as written: a port's leading zeros
    and a connect's source address aside, an address however written (``127.0.0.1``,
    ``[::ffff:127.0.0.1]``, ``127.1``), a connect's host name as the address it resolved
    to, the one ZMQ connects to (``localhost`` is 127.0.0.1), and a bind's as the address
    ZMQ binds for it (``lo`` is 127.0.0.1). A link-local address is one per link: its zone
    is part of it, compared by the interface it names (``%2`` is ``%eth0`` where eth0 is
    interface 2; a name's, by the interface its answer gave, ``answer_address``), while
    the kernel ignores any other address's zone. A wildcard binds every address of its
    family on this host (``*`` and ``0.0.0.0`` every IPv4 one, ``[::]`` every one of both
    families, as ZMQ binds it dual-stack), so it is reached by a connect to any address
    this host has there, loopback, an interface's or a link-local one on its own link,
    and by no other: a worker elsewhere at the same port is not the sidecar itself.
    """
    if not (connect.startswith("tcp://") and bound.startswith("tcp://")):
        return connect == bound
    host, _, port = connect_target(connect).removeprefix("tcp://").rpartition(":")
    fixed = fixed_port(bound)
    if fixed is None or fixed[1] != int(port):  # a free port is none a connect names
        return False
    link = _link_index(host) if host_family(host) is not None else _answer_link(resolved)
    if resolved is None or listened is None or link is None:
        return False  # no address, or a zone naming no interface here
    address = _unzoned(resolved)
    if listened.is_unspecified:  # a wildcard
        return (listened.version == 6 or address.version == 4) and _is_this_hosts(address, link)
    return listened == address and link == _link_index(fixed[0])


def _answer_link(resolved: Address | None) -> int | None:
    """The number of the interface a link-local address a name resolved to is on, as the
    look-up gave it (``answer_address``); 0 for any other address, whose zone the kernel
    ignores; None for a link-local one without a zone, which the kernel reaches on no
    link, or no address."""
    if not isinstance(resolved, ipaddress.IPv6Address) or not resolved.is_link_local:
        return None if resolved is None else 0
    return int(resolved.scope_id) if resolved.scope_id else None


def _unzoned(address: Address) -> Address:
    """``address`` without its zone (which ``_answer_link`` reads), as an endpoint's text
    without its zone gives it."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        return ipaddress.IPv6Address(int(address))
    return address


def _link_index(host: str) -> int | None:
    """The number of the interface a link-local IPv6 ``host``'s zone names, as the kernel
    reads it (the ``scope_id`` of its socket address); 0 for any other host, whose zone,
    if any, the kernel ignores; None for a zone naming no interface of this host."""
    zone = link_zone(host)
    if zone is None:
        return 0
    if ZONE_NUMBER.fullmatch(zone):
        return int(zone)
    try:
        return socket.if_nametoindex(zone)
    except OSError:
        return None


def _is_this_hosts(address: Address, link: int) -> bool:
    """Whether ``address``, on the interface numbered ``link`` where it is link-local, is one
    of this host's: a loopback one, or one a socket can be bound to (the kernel binds none
    it does not have, and a link-local one only on its own link)."""
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    where = (str(address), 0) if address.version == 4 else (str(address), 0, 0, link)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(where)
        except OSError:
            return False
    return True
