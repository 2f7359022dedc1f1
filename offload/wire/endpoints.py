"""ZMQ endpoints as users write them, checked where they are given.

ZMQ itself refuses a malformed endpoint only when a socket first binds or
connects to it: at start-up that is a traceback from inside ZMQ, and for a
replay endpoint, used only once a gap shows, it was a failure at every later
frame. Worse, a connect to a host name that can never resolve (``a..b``,
``999.1.1.1``), or to port 0, is taken without an error and retried in silence
for ever. So an endpoint is checked here, as text, against what ZMQ
binds or connects to for the transports that reach another process (a sidecar
never shares a process with its workers, so ``inproc`` is refused too); the
tests try the accepted forms on real sockets. Where the host that checks an
endpoint is the one that uses it, ``interface_refusal`` also refuses a zone
naming an interface that host does not have, and ``source_refusal`` a source
it cannot leave from, or one of another family than all the target name
resolves to there (``resolved_families``: each name looked up once, its answer
passed on to whatever else needs it).
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Final, Literal

import zmq

from offload.shown import shown_repr

Family = Literal[4, 6]
"""An IP version: the address family a connect reaches its host in."""

_LABEL: Final = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
"""One label of a host name: 1 to 63 letters, digits, underscores and inner hyphens (RFC
1123's, and the underscore, which DNS itself carries and Docker's resolver answers for a
compose service named ``vllm_worker``)."""

_MAX_NAME: Final = 253
"""Most characters of a DNS name, without its trailing dot (RFC 1035's 255 bytes on the wire)."""

_IPV4: Final = re.compile(r"[0-9A-Fa-fXx.]+")
"""What an IPv4 address may hold, in every form the resolver reads (``0x7f.1``): ``inet_aton``
alone takes ``127.0.0.1 x`` for 127.0.0.1, stopping at the space."""

_IPV6: Final = re.compile(r"[0-9A-Fa-f:.]+")
"""What a bracketed address may hold before its zone (``%`` and an interface)."""

_INTERFACE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,14}")
"""An interface's name, as a zone or a source: ZMQ reads a zone as a name only when it starts
with a letter (as a number else), Linux's names hold at most 15 characters, and ZMQ's
connect refuses characters other than these."""

_ZONE_NUMBER: Final = re.compile(r"[0-9]+")

_MAX_ZONE_NUMBER: Final = 2**31 - 1
"""The highest interface number: ZMQ reads a zone's number as a C int."""

_PORT: Final = re.compile(r"0*[0-9]{1,5}")
"""A port's digits: ZMQ reads leading zeros as nothing (``05557`` is port 5557), however
many, so they count against no limit."""


def endpoint_refusal(endpoint: str, *, bind: bool) -> str | None:
    """Why ZMQ would refuse ``endpoint`` (or never reach it), as the rest of a sentence that
    starts with the endpoint; None for one it takes.

    ``bind``: the endpoint is bound, so ``*`` may stand for every address or
    for a free port, and port 0 for a free port; a connect needs both.
    """
    problem = _problem(endpoint, bind=bind)
    if problem is None:
        return None
    example = "tcp://*:5557 or tcp://10.0.0.5:5557" if bind else "tcp://engine:5557"
    action = "bind" if bind else "connect to"
    return (
        f"is not a ZMQ endpoint to {action}: {problem} (expected tcp://HOST:PORT, "
        f"e.g. {example}, or ipc://PATH)"
    )


def _problem(endpoint: str, *, bind: bool) -> str | None:
    transport, separator, address = endpoint.partition("://")
    if not separator or transport not in ("tcp", "ipc"):
        return "the transport must be tcp:// or ipc://"
    if transport == "ipc":
        return _ipc_problem(address)
    return _tcp_problem(address, bind=bind)


def _ipc_problem(path: str) -> str | None:
    """A path (``@name``: Linux's abstract namespace) that fits a unix socket's address and
    may name a socket."""
    if path in ("", "@"):
        return "no ipc path, or no name after the '@' of an abstract one"
    if "\0" in path:
        return "the ipc path holds a NUL character (ZMQ would cut the path there)"
    if path.endswith("/") and not path.startswith("@"):  # a bind fails, a connect never ends
        return f"the ipc path {shown_repr(path)} ends in '/': a directory, never a socket"
    try:
        size = len(path.encode())
    except UnicodeEncodeError:  # an environment variable's bytes that are not UTF-8
        return "the ipc path is not UTF-8 text"
    if size > zmq.IPC_PATH_MAX_LEN:
        return (
            f"the ipc path is {size} bytes, more than the {zmq.IPC_PATH_MAX_LEN} a unix "
            "socket address holds; choose a shorter one"
        )
    return None


def _tcp_problem(address: str, *, bind: bool) -> str | None:
    source, semicolon, target = address.rpartition(";")  # where ZMQ splits them
    if not semicolon:
        return _target_problem(target, bind=bind)
    if bind:
        return (
            f"{shown_repr(source)} before ';' is a source address, which a connect leaves "
            "from; a bind takes HOST:PORT alone"
        )
    return _target_problem(target, bind=False) or _source_problem(source, target)


def _host_and_port(address: str) -> tuple[str, str | None]:
    """HOST and PORT where ZMQ parts them, at the last ':' (a bracketed host kept whole);
    None for no ``:PORT``."""
    if address.startswith("[") and "]" in address:
        host, _, rest = address.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else None
    host, colon, port = address.rpartition(":")
    return (host, port) if colon else (address, None)


def _target_problem(address: str, *, bind: bool) -> str | None:
    host, port = _host_and_port(address)
    if port is None:
        return "no :PORT after the host"
    return _host_problem(host, bind=bind) or _port_problem(port, bind=bind)


def _source_problem(source: str, target: str) -> str | None:
    """``SOURCE:PORT``, where a connect leaves from: an interface's name or an IP address (ZMQ
    looks no name up in DNS for it) of the target's family, and a port, ``0`` or ``*`` for a
    free one. ZMQ takes any other source and then never connects."""
    host, port = _host_and_port(source)
    if not source:
        problem = "nothing before ';', where an interface's name or an IP address and a port go"
    elif port is None:
        problem = f"no :PORT after it, which ZMQ needs: 0 for a free one, {shown_repr(host + ':0')}"
    else:
        problem = (
            _source_host_problem(host)
            or _port_problem(port, bind=True)
            or _families_problem(host, _host_and_port(target)[0])
            or _zones_problem(host, _host_and_port(target)[0])
        )
    return None if problem is None else f"the source address {shown_repr(source)}: {problem}"


def _source_host_problem(host: str) -> str | None:
    if host.startswith("["):
        return _bracketed_problem(host)
    if _INTERFACE.fullmatch(host) or (_IPV4.fullmatch(host) and _is_ipv4_text(host)):
        return None
    return (
        f"{shown_repr(host)} is not an interface name or IP address (an IPv6 one in brackets; "
        "ZMQ resolves no host name for a source)"
    )


def _families_problem(source: str, target: str) -> str | None:
    """A source and a target of two address families: the connect could never be made."""
    ours, theirs = _family(source), _family(target)
    if ours is None or theirs is None or ours == theirs:
        return None
    return (
        f"it is IPv{ours} and the host {shown_repr(target)} IPv{theirs}, and ZMQ connects "
        "within one family"
    )


def _zones_problem(source: str, target: str) -> str | None:
    """A link-local source and host on two links: the kernel refuses to connect a socket
    bound on one link to an address on another, and ZMQ retries it in silence. Zones are
    compared only when written alike, both names or both numbers: which interface a number
    is, only the host the connect runs on knows."""
    ours, theirs = _link_zone(source), _link_zone(target)
    if ours is None or theirs is None or ours.isdigit() != theirs.isdigit():
        return None
    if (int(ours) == int(theirs)) if ours.isdigit() else ours == theirs:
        return None
    return (
        f"its zone {shown_repr(ours)} is not the host's {shown_repr(theirs)}, and a link-local "
        "source connects on its own link only"
    )


def _link_zone(host: str) -> str | None:
    """The zone of a bracketed link-local IPv6 address (which has one); None for any other
    host."""
    address = _address(host)
    if not host.startswith("[") or address is None or address.version == 4:
        return None
    return host[1:-1].partition("%")[2] if address.is_link_local else None


def _family(host: str) -> Family | None:
    """The IP version of an address (an IPv4-mapped one's is 4); None for a name."""
    if _is_ipv4_text(host):
        return 4
    address = _address(host)
    if address is None:
        return None
    return 4 if address.version == 4 else 6


def _host_problem(host: str, *, bind: bool) -> str | None:
    """An IP address (IPv6 in brackets), a DNS name, or ``*`` to bind every address."""
    if host == "*":
        return None if bind else "'*' (every address) is for binding; a connect needs a host"
    if host.startswith("["):
        return _bracketed_problem(host)
    if not host:
        return "no host before :PORT"
    if ":" in host:
        return f"{shown_repr(host)} holds ':': an IPv6 address goes in brackets, [::1]"
    name = host.removesuffix(".")  # a fully qualified name may end in its root's dot
    if len(name) > _MAX_NAME:
        return f"the host name is {len(name)} characters, more than DNS's {_MAX_NAME}"
    labels = name.split(".")
    for label in labels:
        if _LABEL.fullmatch(label) is None:
            return (
                f"{shown_repr(host)} is not a host name or IP address: its part "
                f"{shown_repr(label)} is not 1 to 63 letters, digits, underscores or inner hyphens"
            )
    if labels[-1].isdigit() and not _is_ipv4_text(name):
        return f"{shown_repr(host)} is not an IPv4 address, and a host name cannot end in a number"
    return None


def _bracketed_problem(host: str) -> str | None:
    """An IP address in brackets; an IPv6 one may name its interface, as its zone (``%`` and
    the interface's name or number), which a link-local one (``fe80::/10``) needs: the kernel
    binds it or connects to it on no other terms."""
    if not host.endswith("]"):
        return "the host's '[' has no closing ']'"
    text, percent, zone = host[1:-1].partition("%")
    address = _ip(text) if _IPV6.fullmatch(text) else None
    if address is None:
        return f"{shown_repr(host)} is not an IP address in brackets"
    if not percent:
        if address.version == 6 and address.is_link_local:
            return (
                f"{shown_repr(host)} is a link-local address, which needs its interface as "
                f"its zone ([{text}%eth0])"
            )
        return None
    if address.version == 4:
        return f"{shown_repr(host)} names a zone, which only an IPv6 address has"
    return _zone_problem(host, zone)


def _zone_problem(host: str, zone: str) -> str | None:
    """An interface's name (starting with a letter) or its number, 1 or more."""
    if not zone:
        return f"{shown_repr(host)} names no interface after its '%'"
    if _ZONE_NUMBER.fullmatch(zone):
        if 1 <= int(zone) <= _MAX_ZONE_NUMBER:
            return None
        return (
            f"the zone of {shown_repr(host)} is not an interface number from 1 to "
            f"{_MAX_ZONE_NUMBER}"
        )
    if _INTERFACE.fullmatch(zone):
        return None
    return (
        f"the zone {shown_repr(zone)} of {shown_repr(host)} is not an interface: a name (a "
        "letter, then up to 14 letters, digits, '.', '_' or '-') or a number"
    )


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _is_ipv4_text(text: str) -> bool:
    """IPv4 address text as the system's resolver reads it, which ZMQ uses: ``10.0.0.5``, and
    the shorter forms it also takes (``127.1``)."""
    try:
        socket.inet_aton(text)
    except OSError:
        return False
    return True


def _port_problem(port: str, *, bind: bool) -> str | None:
    """1 to 65535; to bind, also ``0`` (no other way written) or ``*``, a free port the
    system picks."""
    if port == "*":
        return None if bind else "port '*' (a free one) is for binding; a connect needs a number"
    lowest = 0 if bind else 1
    if _PORT.fullmatch(port) is None or not lowest <= _port_number(port) <= 65535:
        return f"the port {shown_repr(port)} is not a number from {lowest} to 65535"
    if _port_number(port) == 0 and port != "0":  # ZMQ takes 00001 for port 1, but 0 only as "0"
        return f"the port {shown_repr(port)}: a free port is written 0 (ZMQ refuses it else)"
    return None


def _port_number(port: str) -> int:
    """The port ZMQ reads of digits ``_PORT`` matches: its leading zeros dropped first, as
    ``int`` refuses text of more than 4,300 digits."""
    return int(port.lstrip("0") or "0")


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
    source_host = _host_and_port(source)[0] if source else None
    for host in (_host_and_port(target)[0], source_host):
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
    if _family(_host_and_port(source)[0]) is None:  # an interface's name
        problem = _source_bind_problem(source, ipv6=connects_ipv6(endpoint, family))
    else:
        problem = family_mismatch(endpoint, family) or _source_bind_problem(
            source, ipv6=source.startswith("[")
        )
    if problem is None:
        return None
    return f"cannot be used on this host: the source address {shown_repr(source)}: {problem}"


def family_mismatch(endpoint: str, family: Family | None) -> str | None:
    """Why a connect to ``endpoint`` from a source address can never be made, its host
    having resolved to ``family`` alone (``resolved_families``: the source's family first)
    and the source being of the other: ZMQ connects within one family, and would retry such
    a connect in silence; None where it can be made, or nothing resolved. The shape check
    compares a source with a host's address; a name's family only a look-up tells."""
    source, _, target = endpoint.removeprefix("tcp://").rpartition(";")
    ours = _family(_host_and_port(source)[0]) if source else None
    host = _host_and_port(target)[0]
    if ours is None or family is None or family == ours or _family(host) is not None:
        return None  # no source address, no answer, one family, or an address (its shape checked)
    return (
        f"it is IPv{ours} and the host {shown_repr(host)} resolves here to IPv{family} "
        "addresses alone, and ZMQ connects within one family"
    )


_LISTED_INTERFACES: Final = 8
"""Most of this host's interfaces a refusal names: a node may have hundreds (a veth a pod)."""


def _zone_absent(host: str) -> str | None:
    """Why the zone of a bracketed ``host`` names no interface of this host; None where it
    names one, or ``host`` has none."""
    if not host.startswith("[") or "%" not in host:
        return None
    zone = host[1:-1].partition("%")[2]
    try:
        if _ZONE_NUMBER.fullmatch(zone):
            socket.if_indextoname(int(zone))
        else:
            socket.if_nametoindex(zone)
    except OSError:
        return (
            f"the zone of {shown_repr(host)} names no interface of this host "
            f"(its interfaces: {_interfaces()})"
        )
    return None


def _source_bind_problem(source: str, *, ipv6: bool) -> str | None:
    """Why ZMQ cannot leave from ``source``, ``SOURCE:PORT`` (an interface's name or an IP
    address); None where it can.

    ZMQ resolves a source as it does the address of a bind (no DNS, an interface's name
    looked up among this host's, the connect's IPv6 option choosing the family), and
    binds the connecting socket to it, at its port: so a bind of the same source fails
    where the connect would, and for the same reason (a port another socket holds too)."""
    host, port = _host_and_port(source)
    family = 6 if ipv6 else 4
    is_name = not host.startswith("[") and not _is_ipv4_text(host)
    if is_name:
        try:
            socket.if_nametoindex(host)
        except OSError:
            return (
                f"{shown_repr(host)} is no interface of this host (its interfaces: {_interfaces()})"
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


def _interfaces() -> str:
    """This host's interfaces by name and number, at most ``_LISTED_INTERFACES`` of them."""
    named = [f"{name} ({index})" for index, name in socket.if_nameindex()]
    more = len(named) - _LISTED_INTERFACES
    listed = ", ".join(named[:_LISTED_INTERFACES])
    return f"{listed} and {more} more" if more > 0 else listed


def binds_ipv6(endpoint: str) -> bool:
    """Whether a socket binding ``endpoint`` needs ZMQ's IPv6 option: only a bracketed IPv6
    address, which ZMQ refuses to bind without it ('No such device'). Left unset for every
    other endpoint, so ``tcp://*`` binds IPv4 only, as it always did (with the option set it
    would listen on IPv6 too)."""
    return endpoint.startswith("tcp://[")


def connect_target(endpoint: str) -> str:
    """The endpoint a connect reaches, one ``endpoint_refusal`` takes to connect to: without
    the source address it leaves from (``tcp://SOURCE:PORT;HOST:PORT``), and its port as
    the number ZMQ reads (``05557`` is port 5557). Connects that differ in these alone read
    one publisher."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint.rpartition(";")[2].removeprefix("tcp://").rpartition(":")
    return f"tcp://{host}:{_port_number(port)}"


def connects_ipv6(endpoint: str, family: Family | None) -> bool:
    """Whether a socket connecting to ``endpoint``, whose host resolved to ``family``
    (``resolved_families``), needs ZMQ's IPv6 option.

    Without it ZMQ reaches no IPv6 address: a bracketed one, or a host name whose addresses
    are all IPv6 (an IPv6-only cluster's service), is retried for ever in silence. With it,
    ZMQ takes only the first address of an IPv6 lookup, so a name with addresses of both
    families would be reached over IPv6 alone, where a publisher bound on ``tcp://*``
    (IPv4) is not listening. So the option is set for a bracketed address, the host's or a
    source address's (ZMQ finds an IPv6 source only with it), and for a host name that
    resolved to IPv6 addresses and no IPv4 one; a name that did not resolve keeps ZMQ's
    IPv4 lookup, until the sidecar finds it resolves (app/ingest/families.py). A source
    address holds its connect to its own family whatever the name resolves to: from it
    ZMQ reaches no address of the other (``family_mismatch``), so only the name's coming
    back to the source's family can let the connect be made, and a socket of that family
    then makes it.
    """
    if not endpoint.startswith("tcp://"):
        return False
    if "[" in endpoint:  # the host's address, or the source's
        return True
    source = endpoint.removeprefix("tcp://").rpartition(";")[0]
    if source and _family(_host_and_port(source)[0]) == 4:
        return False
    return family == 6


def resolved_families(endpoints: Iterable[str]) -> dict[str, Family | None]:
    """The family each connect endpoint's host resolves to now: an address's own, and a
    name's, that of its source address first where it has one (else IPv4 first: a name of
    both families is reached over IPv4, ``connects_ipv6``), the other where the name has
    addresses of it alone; None for a name with no address now (its service not up yet),
    whose answer is still to come (the sidecar looks such a name up again while its
    publisher is unheard: app/ingest/families.py), and for ipc.

    Each host name is looked up once for all the endpoints that name it from sources of
    one family (a publisher's live and replay endpoints), one family at a time as ZMQ
    looks it up. May
    wait on DNS: call it where a start may wait, not on a path that must not stall; and
    pass its answer on (``connects_ipv6``, ``source_refusal``) rather than look up again.
    """
    looked_up: dict[tuple[str, Family], Family | None] = {}
    found: dict[str, Family | None] = {}
    for endpoint in endpoints:
        if not endpoint.startswith("tcp://"):
            found[endpoint] = None
            continue
        source, _, target = endpoint.removeprefix("tcp://").rpartition(";")
        host = _host_and_port(target)[0]
        address = _family(host)
        if address is not None:
            found[endpoint] = address
            continue
        first = (_family(_host_and_port(source)[0]) if source else None) or 4
        if (host, first) not in looked_up:
            looked_up[host, first] = _name_family(host, first)
        found[endpoint] = looked_up[host, first]
    return found


def _name_family(host: str, first: Family) -> Family | None:
    """``first`` where the name ``host`` has an address of it now, else the other family where
    it has one of that, else None."""
    other: Family = 6 if first == 4 else 4
    for family in (first, other):
        if _resolves(host, socket.AF_INET if family == 4 else socket.AF_INET6):
            return family
    return None


def _resolves(host: str, family: socket.AddressFamily) -> bool:
    """Whether ``host`` has an address of ``family`` now (an IPv4 literal has none in IPv6)."""
    try:
        return bool(socket.getaddrinfo(host, None, family, socket.SOCK_STREAM))
    except (socket.gaierror, UnicodeError):
        return False


def offset_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint that data-parallel rank ``rank`` binds, so that ranks sharing one
    configuration do not collide.

    vLLM's rule for its own KV-event publisher: a TCP port moves up by the
    rank, a wildcard or 0 port is left to the OS. vLLM leaves an ipc path as
    it is, but ZMQ lets a second socket take over a bound path without an
    error, so here an ipc path gets ``_dp<rank>`` appended, as vLLM names its
    inproc endpoints. A moved port may pass 65535, and a longer path a unix
    socket's limit: check the result with ``endpoint_refusal``.
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


def connect_reaches(connect: str, bound: str) -> bool:
    """Whether a connect to ``connect`` (one ``endpoint_refusal`` takes to connect to) reaches
    the socket this host binds at ``bound`` (one it takes to bind).

    Endpoints are compared as ZMQ reads them, not as written: a port's leading zeros
    and a connect's source address aside, an address however written (``127.0.0.1``,
    ``[::ffff:127.0.0.1]``). A wildcard binds every address of its family on this host
    (``*`` and ``0.0.0.0`` every IPv4 one, ``[::]`` every one of both families, as ZMQ
    binds it dual-stack), so it is reached by a connect to any address this host has
    there, loopback or an interface's, and by no other: a worker elsewhere at the same
    port is not the sidecar itself. A host name is compared as a name (case and a
    trailing dot aside); which address it stands for, only a look-up would say.
    """
    if not (connect.startswith("tcp://") and bound.startswith("tcp://")):
        return connect == bound
    host, _, port = connect_target(connect).removeprefix("tcp://").rpartition(":")
    fixed = _fixed_port(bound)
    if fixed is None or fixed[1] != int(port):  # a free port is none a connect names
        return False
    listened = fixed[0]
    bound_address = ipaddress.IPv4Address(0) if listened == "*" else _address(listened)
    address = _address(host)
    if bound_address is not None and bound_address.is_unspecified:  # a wildcard
        return (
            address is not None
            and (bound_address.version == 6 or address.version == 4)
            and _is_this_hosts(address)
        )
    if bound_address is not None or address is not None:
        return bound_address == address
    return _name(host) == _name(listened)


def _is_this_hosts(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is one of this host's: a loopback one, or one a socket can be
    bound to (the kernel binds none it does not have)."""
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def _name(host: str) -> str:
    """A host name as DNS compares it: case and a fully qualified name's trailing dot aside."""
    return host.lower().removesuffix(".")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A host's IP address without its zone (an IPv4-mapped IPv6 one as its IPv4 address);
    None for a name."""
    address = _ip(host.removeprefix("[").removesuffix("]").partition("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _fixed_port(endpoint: str) -> tuple[str, int] | None:
    """A bindable TCP endpoint's host and port; None for ipc, a wildcard port or port 0.

    Only for an endpoint ``endpoint_refusal`` takes to bind: its port is last, after the
    last colon, whatever its host.
    """
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if port == "*" or _port_number(port) == 0:
        return None
    return host, _port_number(port)
