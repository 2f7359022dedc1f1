"""ZMQ endpoints as users write them, checked where they are given.

ZMQ itself refuses a malformed endpoint only when a socket first binds or
connects to it: at start-up that is a traceback from inside ZMQ, and for a
replay endpoint, used only once a gap shows, it was a failure at every later
frame. Worse, a connect to a host name that can never resolve (``a..b``,
``999.1.1.1``), or to port 0, is taken without an error and retried in silence
for ever. So an endpoint is checked here, as text, against what ZMQ
binds or connects to for the transports that reach another process (a sidecar
never shares a process with its workers, so ``inproc`` is refused too); the
tests try the accepted forms on real sockets. What only the host that uses an
endpoint can tell (its interfaces, its addresses, what a name resolves to
there) is checked in offload/wire/endpoint_host.py, by the rules read here.
"""

from __future__ import annotations

import ipaddress
import re
import socket
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

ZONE_NUMBER: Final = re.compile(r"[0-9]+")
"""A zone written as an interface's number, not its name: the shape check bounds the number,
the host's check looks the interface up by it."""

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


def host_and_port(address: str) -> tuple[str, str | None]:
    """HOST and PORT where ZMQ parts them, at the last ':' (a bracketed host kept whole);
    None for no ``:PORT``."""
    if address.startswith("[") and "]" in address:
        host, _, rest = address.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else None
    host, colon, port = address.rpartition(":")
    return (host, port) if colon else (address, None)


def _target_problem(address: str, *, bind: bool) -> str | None:
    host, port = host_and_port(address)
    if port is None:
        return "no :PORT after the host"
    return _host_problem(host, bind=bind) or _port_problem(port, bind=bind)


def _source_problem(source: str, target: str) -> str | None:
    """``SOURCE:PORT``, where a connect leaves from: an interface's name or an IP address (ZMQ
    looks no name up in DNS for it) of the target's family, and a port, ``0`` or ``*`` for a
    free one. ZMQ takes any other source and then never connects."""
    host, port = host_and_port(source)
    if not source:
        problem = "nothing before ';', where an interface's name or an IP address and a port go"
    elif port is None:
        problem = f"no :PORT after it, which ZMQ needs: 0 for a free one, {shown_repr(host + ':0')}"
    else:
        problem = (
            _source_host_problem(host)
            or _port_problem(port, bind=True)
            or _families_problem(host, host_and_port(target)[0])
            or _zones_problem(host, host_and_port(target)[0])
        )
    return None if problem is None else f"the source address {shown_repr(source)}: {problem}"


def _source_host_problem(host: str) -> str | None:
    if host.startswith("["):
        return _bracketed_problem(host)
    if _INTERFACE.fullmatch(host) or (_IPV4.fullmatch(host) and is_ipv4_text(host)):
        return None
    return (
        f"{shown_repr(host)} is not an interface name or IP address (an IPv6 one in brackets; "
        "ZMQ resolves no host name for a source)"
    )


def _families_problem(source: str, target: str) -> str | None:
    """A source and a target of two address families: the connect could never be made."""
    ours, theirs = host_family(source), host_family(target)
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
    ours, theirs = link_zone(source), link_zone(target)
    if ours is None or theirs is None or ours.isdigit() != theirs.isdigit():
        return None
    if (int(ours) == int(theirs)) if ours.isdigit() else ours == theirs:
        return None
    return (
        f"its zone {shown_repr(ours)} is not the host's {shown_repr(theirs)}, and a link-local "
        "source connects on its own link only"
    )


def link_zone(host: str) -> str | None:
    """The zone of a bracketed link-local IPv6 address (which has one); None for any other
    host."""
    address = host_address(host)
    if not host.startswith("[") or address is None or address.version == 4:
        return None
    return host[1:-1].partition("%")[2] if address.is_link_local else None


def host_family(host: str) -> Family | None:
    """The IP version of an address (an IPv4-mapped one's is 4); None for a name."""
    if is_ipv4_text(host):
        return 4
    address = host_address(host)
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
    if labels[-1].isdigit() and not is_ipv4_text(name):
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
    if ZONE_NUMBER.fullmatch(zone):
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


def is_ipv4_text(text: str) -> bool:
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
    if _PORT.fullmatch(port) is None or not lowest <= port_number(port) <= 65535:
        return f"the port {shown_repr(port)} is not a number from {lowest} to 65535"
    if port_number(port) == 0 and port != "0":  # ZMQ takes 00001 for port 1, but 0 only as "0"
        return f"the port {shown_repr(port)}: a free port is written 0 (ZMQ refuses it else)"
    return None


def port_number(port: str) -> int:
    """The port ZMQ reads of digits ``_PORT`` matches: its leading zeros dropped first, as
    ``int`` refuses text of more than 4,300 digits."""
    return int(port.lstrip("0") or "0")


def family_mismatch(endpoint: str, family: Family | None) -> str | None:
    """Why a connect to ``endpoint`` from a source address can never be made, its host
    having resolved to ``family`` alone (``resolved_families``: the source's family first)
    and the source being of the other: ZMQ connects within one family, and would retry such
    a connect in silence; None where it can be made, or nothing resolved. The shape check
    compares a source with a host's address; a name's family only a look-up tells."""
    source, _, target = endpoint.removeprefix("tcp://").rpartition(";")
    ours = host_family(host_and_port(source)[0]) if source else None
    host = host_and_port(target)[0]
    if ours is None or family is None or family == ours or host_family(host) is not None:
        return None  # no source address, no answer, one family, or an address (its shape checked)
    return (
        f"it is IPv{ours} and the host {shown_repr(host)} resolves here to IPv{family} "
        "addresses alone, and ZMQ connects within one family"
    )


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
    return f"tcp://{host}:{port_number(port)}"


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
    if source and host_family(host_and_port(source)[0]) == 4:
        return False
    return family == 6


def host_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A host's IP address without its zone (an IPv4-mapped IPv6 one as its IPv4 address);
    None for a name."""
    address = _ip(host.removeprefix("[").removesuffix("]").partition("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def bound_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a bind's ``host`` covers, as ``host_address`` gives it, ``*`` being
    ``0.0.0.0``: a socket binding it is left without ZMQ's IPv6 option (``binds_ipv6``), so
    it listens on every IPv4 address of this host and no IPv6 one."""
    return ipaddress.IPv4Address(0) if host == "*" else host_address(host)


def fixed_port(endpoint: str) -> tuple[str, int] | None:
    """A bindable TCP endpoint's host and port; None for ipc, a wildcard port or port 0.

    Only for an endpoint ``endpoint_refusal`` takes to bind: its port is last, after the
    last colon, whatever its host.
    """
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if port == "*" or port_number(port) == 0:
        return None
    return host, port_number(port)
