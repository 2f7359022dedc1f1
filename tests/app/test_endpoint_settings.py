"""Every endpoint setting refuses, by one rule, what ZMQ would refuse or never reach.

ZMQ checks an endpoint only when a socket binds or connects to it, and a connect to a
host name that cannot resolve is taken and retried in silence for ever; so the
settings refuse such an endpoint at start-up, naming the setting, the endpoint and what
is wrong. The forms users write are tried on real ZMQ sockets, so that the rule refuses
nothing ZMQ takes; ``zmq.IPC_PATH_MAX_LEN`` is the platform's limit (107 bytes on Linux).
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
import uuid
from collections.abc import Iterator
from ipaddress import IPv6Address

import pytest
import zmq
from pydantic import ValidationError
from zmq import EVENT_CONNECT_RETRIED

from app.settings import SidecarSettings
from offload.shown import shown_repr
from offload.wire.endpoint_host import (
    answer_address,
    connect_reaches,
    interfaces,
    listened_addresses,
)
from offload.wire.endpoints import endpoint_refusal
from tests.support.ipv6 import link_local, needs_ipv6_loopback, needs_link_local, other_interface
from tests.support.ports import held_tcp_ports
from tests.support.zmq_connects import first_connect_event, pull_on_every_ipv4_address, reached

LISTEN = "tcp://127.0.0.1:5557"
IPC_MAX = zmq.IPC_PATH_MAX_LEN

SETTINGS = {
    "connect": lambda endpoint: {"connect": [endpoint]},
    "replay": lambda endpoint: {"connect": ["tcp://engine:5557"], "replay": [endpoint]},
    "listen": lambda endpoint: {"listen": [endpoint]},
    "listen_replay": lambda endpoint: {"listen": [LISTEN], "listen_replay": [f"a@0={endpoint}"]},
}
CONNECTED = ("connect", "replay", "listen_replay")

REFUSED_EVERYWHERE = [
    ("tcp://-bad:5557", "'-bad' is not a host name or IP address"),
    ("tcp://a..b:5557", "'a..b' is not a host name or IP address: its part '' is not"),
    (f"tcp://{'a' * 64}.svc:5557", "is not 1 to 63 letters, digits, underscores or inner hyphens"),
    (f"tcp://{'.'.join(['a' * 63] * 4)}:5557", "the host name is 255 characters, more than"),
    ("tcp://999.1.1.1:5557", "'999.1.1.1' is not an IPv4 address"),
    ("tcp://1.2.3.4.5:5557", "'1.2.3.4.5' is not an IPv4 address"),
    ("tcp://[::1:5557", "the host's '[' has no closing ']'"),
    ("tcp://[::g]:5557", "'[::g]' is not an IP address in brackets"),
    ("tcp://::1:5557", "an IPv6 address goes in brackets"),
    ("tcp://[fe80::1%]:5557", "'[fe80::1%]' names no interface after its '%'"),
    ("tcp://[fe80::1%e@h]:5557", "the zone 'e@h' of '[fe80::1%e@h]' is not an interface: a name"),
    ("tcp://[fe80::1%4x]:5557", "the zone '4x' of '[fe80::1%4x]' is not an interface"),
    (f"tcp://[fe80::1%{'e' * 16}]:5557", "is not an interface: a name (a letter, then up to 14"),
    ("tcp://[fe80::1%0]:5557", "the zone of '[fe80::1%0]' is not an interface number from 1 to"),
    ("tcp://[127.0.0.1%lo]:5557", "names a zone, which only an IPv6 address has"),
    ("tcp://[fe80::1]:5557", "'[fe80::1]' is a link-local address, which needs its interface"),
    ("tcp://engine", "no :PORT after the host"),
    ("tcp://engine:65536", "the port '65536' is not a number from"),
    ("tcp://engine:065536", "the port '065536' is not a number from"),
    ("tcp://engine:port", "the port 'port' is not a number from"),
    ("ipc:///" + "x" * IPC_MAX, f"the ipc path is {IPC_MAX + 1} bytes, more than the {IPC_MAX}"),
    ("ipc://@" + "x" * IPC_MAX, f"the ipc path is {IPC_MAX + 1} bytes"),
    # Half as many characters as the limit, but two bytes each in UTF-8, as ZMQ is given it.
    ("ipc:///" + "é" * (IPC_MAX // 2 + 1), f"the ipc path is {IPC_MAX // 2 * 2 + 3} bytes"),
    ("ipc://@", "no ipc path, or no name after the '@'"),
    ("ipc:///", "the ipc path '/' ends in '/': a directory, never a socket"),
    ("ipc://run/kv/", "the ipc path 'run/kv/' ends in '/'"),
    ("ipc:///tmp/a\0b", "the ipc path holds a NUL character"),
    ("inproc://kv", "the transport must be tcp:// or ipc://"),
    ("udp://engine:5557", "the transport must be tcp:// or ipc://"),
]
REFUSED_TO_CONNECT = [
    ("tcp://*:5557", "'*' (every address) is for binding; a connect needs a host"),
    ("tcp://engine:*", "port '*' (a free one) is for binding; a connect needs a number"),
    ("tcp://engine:0", "the port '0' is not a number from 1 to 65535"),
    ("tcp://eth0:0;engine:0", "the port '0' is not a number from 1 to 65535"),
]
REFUSED_SOURCES = [
    ("tcp://eth0;engine:5557", "'eth0': no :PORT after it, which ZMQ needs: 0 for a free one"),
    ("tcp://;engine:5557", "'': nothing before ';', where an interface's name or an IP"),
    ("tcp://127.0.0.1;10.0.0.5:5557", "'127.0.0.1': no :PORT after it"),
    ("tcp://[::1];[::1]:5557", "'[::1]': no :PORT after it"),
    ("tcp://engine.example.com:0;10.0.0.5:5557", "'engine.example.com' is not an interface name"),
    ("tcp://*:0;engine:5557", "'*' is not an interface name or IP address"),
    ("tcp://127.0.0.1 x:0;engine:5557", "'127.0.0.1 x' is not an interface name or IP address"),
    ("tcp://a;eth0:0;engine:5557", "'a;eth0' is not an interface name or IP address"),
    ("tcp://eth0:00;engine:5557", "the port '00': a free port is written 0"),
    ("tcp://eth0:65536;engine:5557", "the port '65536' is not a number from 0 to 65535"),
    ("tcp://[fe80::1]:0;[fe80::2%eth0]:5557", "'[fe80::1]' is a link-local address"),
    ("tcp://[::1%]:0;[::1]:5557", "'[::1%]' names no interface after its '%'"),
    ("tcp://[::1]:0;10.0.0.5:5557", "it is IPv6 and the host '10.0.0.5' IPv4, and ZMQ connects"),
    ("tcp://127.0.0.1:0;[::1]:5557", "it is IPv4 and the host '[::1]' IPv6"),
    ("tcp://[::ffff:10.0.0.1]:0;[::1]:5557", "it is IPv4 and the host '[::1]' IPv6"),
    ("tcp://[fe80::1%eth0]:0;[fe80::2%eth1]:5557", "its zone 'eth0' is not the host's 'eth1'"),
    ("tcp://[fe80::1%2]:0;[fe80::2%3]:5557", "its zone '2' is not the host's '3'"),
]


def refusal(settings: dict[str, object]) -> tuple[tuple, str]:
    with pytest.raises(ValidationError) as refused:
        SidecarSettings(**settings)
    [error] = refused.value.errors()
    return error["loc"], error["msg"]


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize(("endpoint", "why"), REFUSED_EVERYWHERE)
def test_every_endpoint_setting_refuses_an_endpoint_zmq_cannot_use_saying_why(
    setting: str, endpoint: str, why: str
) -> None:
    loc, message = refusal(SETTINGS[setting](endpoint))
    action = "bind" if setting == "listen" else "connect to"
    assert loc == (setting,)
    assert f"{shown_repr(endpoint)} is not a ZMQ endpoint to {action}: " in message
    assert why in message


@pytest.mark.parametrize("setting", CONNECTED)
@pytest.mark.parametrize(("endpoint", "why"), REFUSED_TO_CONNECT)
def test_a_wildcard_or_port_0_is_refused_where_the_sidecar_connects(
    setting: str, endpoint: str, why: str
) -> None:
    loc, message = refusal(SETTINGS[setting](endpoint))
    assert (loc, why in message) == ((setting,), True), message


@pytest.mark.parametrize("setting", CONNECTED)
@pytest.mark.parametrize(("endpoint", "why"), REFUSED_SOURCES)
def test_a_source_address_zmq_cannot_leave_from_is_refused_saying_why(
    setting: str, endpoint: str, why: str
) -> None:
    loc, message = refusal(SETTINGS[setting](endpoint))
    assert loc == (setting,)
    assert "is not a ZMQ endpoint to connect to: the source address " in message
    assert why in message


def test_a_source_address_is_refused_where_the_sidecar_binds() -> None:
    loc, message = refusal({"listen": ["tcp://127.0.0.1:0;127.0.0.1:5557"]})
    assert loc == ("listen",)
    assert "'127.0.0.1:0' before ';' is a source address, which a connect leaves from" in message


@pytest.mark.parametrize(("endpoint", "bind"), [
    ("ipc:///tmp/" + "x" * (IPC_MAX - 4), True),
    ("ipc:///tmp/" + "x" * (IPC_MAX - 4), False),
    ("ipc://@" + "x" * IPC_MAX, False),
    ("ipc://@", False),
    ("tcp://*:5557", False),
    ("tcp://-bad:5557", False),
    ("tcp://*:65536", True),
    ("tcp://*:00", True),  # 0 is a free port, and 00001 port 1, but 00 is refused
    ("ipc:///", True),  # in use: a directory
    (f"ipc:///tmp/{uuid.uuid4().hex}/", True),  # no such directory
    ("tcp://[::1%]:*", True),
    ("tcp://[::1%0]:*", True),
    ("tcp://[::1%_lo]:*", True),  # a zone not starting with a letter is read as a number
    ("tcp://[::1%l@o]:5557", False),
    ("tcp://[fe80::1]:*", True),  # the kernel binds a link-local address only on its link
])  # fmt: skip
def test_zmq_itself_refuses_these_only_once_a_socket_uses_them(endpoint: str, bind: bool) -> None:
    with zmq.Context() as context, context.socket(zmq.PULL) as sock:
        sock.linger = 0
        sock.ipv6 = "[" in endpoint
        with pytest.raises(zmq.ZMQError) as refused:
            (sock.bind if bind else sock.connect)(endpoint)
    if endpoint.startswith("ipc://") and len(endpoint) > IPC_MAX + len("ipc://"):
        assert refused.value.errno == errno.ENAMETOOLONG


@pytest.mark.parametrize(
    "form",
    [
        "tcp://127.0.0.1;127.0.0.1:{port}",  # a source with no port
        "tcp://engine.example.com:0;127.0.0.1:{port}",  # a source by host name
        "tcp://[::1]:0;127.0.0.1:{port}",  # a source of the other family
        "tcp://[fe80::1]:{port}",  # a link-local address with no zone
        "tcp://[::1%0]:{port}",
        "tcp://nosuch0:0;127.0.0.1:{port}",  # a source naming no interface of this host
        "tcp://localhost:0;127.0.0.1:{port}",  # ... which a host name is not
        "tcp://203.0.113.9:0;127.0.0.1:{port}",  # a source address this host does not have
        "tcp://[fe80::1%nosuch0]:{port}",  # a zone naming no interface of this host
    ],
)
def test_zmq_takes_these_connects_and_never_connects(form: str) -> None:
    """Refused by the settings, and rightly: ZMQ's connect takes each without an error and
    then retries it in silence, which only a monitor sees."""
    endpoint, event = first_connect_event(form)
    assert refusal({"connect": [endpoint]})[0] == ("connect",)
    assert event == EVENT_CONNECT_RETRIED


@pytest.mark.parametrize("endpoint", ["tcp://*:00", "tcp://127.0.0.1:000"])
def test_a_free_port_to_bind_is_written_0_as_zmq_takes_it(endpoint: str) -> None:
    loc, message = refusal({"listen": [endpoint]})
    assert (loc, "a free port is written 0" in message) == (("listen",), True), message


@pytest.fixture
def port() -> Iterator[int]:
    with held_tcp_ports(1) as held:
        yield held


def longest_ipc_path() -> str:
    """A fresh path in /tmp exactly as long as a unix socket's address holds."""
    name = f"/tmp/kvscope-{uuid.uuid4().hex}-"
    return name + "x" * (IPC_MAX - len(name))


@pytest.mark.parametrize(
    "form",
    [
        "tcp://*:{port}",
        "tcp://0.0.0.0:{port}",
        "tcp://[::]:{port}",
        "tcp://localhost:{port}",
        "tcp://127.0.0.1:*",
        "tcp://127.0.0.1:0",
        "ipc://{ipc}",
        "ipc://@kvscope-{name}",
        "ipc://@kvscope-{name}/",  # an abstract name is no path: it may end in '/'
    ],
)
def test_what_users_listen_on_is_taken_and_zmq_binds_it(form: str, port: int) -> None:
    endpoint = form.format(port=port, ipc=longest_ipc_path(), name=uuid.uuid4().hex)
    assert SidecarSettings(listen=[endpoint]).listen == [endpoint]
    with zmq.Context() as context, context.socket(zmq.PULL) as sock:
        sock.linger = 0
        sock.ipv6 = "[" in endpoint
        sock.bind(endpoint)


@pytest.mark.parametrize(
    ("bound", "form"),
    [
        ("tcp://[::]:*", "tcp://localhost:{port}"),
        ("tcp://[::]:*", "tcp://0.0.0.0:{port}"),
        ("tcp://[::]:*", "tcp://[::]:{port}"),
        ("tcp://[::]:*", "tcp://[::1]:{port}"),
        ("tcp://[::]:*", "tcp://[127.0.0.1]:{port}"),
        ("tcp://[::]:*", "tcp://127.1:{port}"),
        ("tcp://[::]:*", "tcp://127.0.0.1:0;127.0.0.1:{port}"),
        ("tcp://[::]:*", "tcp://lo:*;127.0.0.1:{port}"),
        ("tcp://[::]:*", "tcp://lo:0;127.0.0.1:{port}"),  # ZMQ leaves from lo's IPv4 address
        ("tcp://[::]:*", "tcp://lo:0;[::1]:{port}"),  # ... and its IPv6 one over IPv6
        ("tcp://[::]:*", "tcp://[::1]:0;[::1]:{port}"),
        ("tcp://[::]:*", "tcp://[::ffff:127.0.0.1]:0;127.0.0.1:{port}"),
        ("ipc://{ipc}", "ipc://{ipc}"),
        ("ipc://@kvscope-{name}", "ipc://@kvscope-{name}"),
    ],
)
def test_what_users_connect_to_is_taken_and_zmq_delivers_through_it(bound: str, form: str) -> None:
    names = {"ipc": longest_ipc_path(), "name": uuid.uuid4().hex}
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.ipv6 = True
        pull.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        pull.bind(bound.format(**names))
        port = pull.last_endpoint.decode().rpartition(":")[2]
        endpoint = form.format(port=port, **names)
        settings = SidecarSettings(connect=[endpoint], replay=[endpoint])
        assert (settings.connect, settings.replay) == ([endpoint], [endpoint])
        assert reached(context, pull, endpoint).bytes == b"reached"


def test_a_connect_leaves_from_its_source_address() -> None:
    """127.0.0.2 is on the loopback too: the publisher's side sees the connect come from it."""
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        pull.bind("tcp://127.0.0.1:*")
        endpoint = f"tcp://127.0.0.2:0;{pull.last_endpoint.decode().removeprefix('tcp://')}"
        assert SidecarSettings(connect=[endpoint]).connect == [endpoint]
        frame = reached(context, pull, endpoint)
        assert (frame.bytes, frame.get("Peer-Address")) == (b"reached", "127.0.0.2")


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://vllm-worker-0.vllm.svc.cluster.local:5557",
        "tcp://vllm-worker-0.vllm.svc.cluster.local.:5557",
        f"tcp://{'a' * 63}.{'.'.join(['b' * 61] * 3)}:5557",  # 63 + 3 * 62 = 249 characters
        "tcp://engine-0:05557",
        "tcp://engine-0:0000005557",  # ZMQ reads leading zeros as nothing, however many
        "tcp://vllm_worker:5557",  # a compose service's name, which Docker's resolver answers
    ],
)
def test_a_name_resolved_only_where_it_runs_is_taken(endpoint: str) -> None:
    """A cluster's service names resolve nowhere here: ZMQ takes them, and so do the settings."""
    assert SidecarSettings(connect=[endpoint]).connect == [endpoint]
    with zmq.Context() as context, context.socket(zmq.PUSH) as push:
        push.linger = 0
        push.connect(endpoint)


def test_one_publisher_listed_with_two_source_addresses_is_refused() -> None:
    """A source address says where a connect leaves from, not what it reads: listed once
    with one and once without (or with another), one publisher was read by two sockets, as
    two publishers, every block of it held twice."""
    first = "tcp://127.0.0.1:0;engine:5557"
    for second in ("tcp://engine:5557", "tcp://127.0.0.2:0;engine:5557"):
        loc, message = refusal({"connect": [first, second]})
        assert loc == ("connect",)
        assert f"'{second}' is listed twice, as '{first}' too: both reach 'tcp://engine:5557'" in (
            message
        )
    assert SidecarSettings(connect=["tcp://lo:0;a:5557", "tcp://lo:0;b:5557"]).connect


def test_one_publisher_listed_with_its_port_written_two_ways_is_refused() -> None:
    """ZMQ reads a port's leading zeros as nothing: a connect to ``05557`` reaches the
    publisher bound at 5557, so listing it beside ``5557`` read one publisher twice."""
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        pull.bind("tcp://127.0.0.1:*")
        endpoint = pull.last_endpoint.decode()  # tcp://127.0.0.1:PORT
        zeros = endpoint.replace("1:", "1:00")
        assert reached(context, pull, zeros).bytes == b"reached"
    from_source = zeros.replace("//", "//127.0.0.2:0;")
    for listed in ([endpoint, zeros], [zeros, from_source]):
        loc, message = refusal({"connect": listed})
        assert loc == ("connect",)
        assert f"both reach '{endpoint}' (a source address and a port's leading zeros" in message
    assert SidecarSettings(connect=["tcp://engine:05557", "tcp://engine:05558"]).connect


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://[fe80::1%eth0]:0;[fe80::2%eth0]:5557",
        "tcp://[fe80::1%02]:0;[fe80::2%2]:5557",  # one number, as ZMQ reads it
        "tcp://[fe80::1%eth0]:0;[fe80::2%2]:5557",  # which interface 2 is, only its host knows
        "tcp://[2001:db8::1%eth0]:0;[fe80::2%eth1]:5557",  # a zone the kernel ignores
    ],
)
def test_a_link_local_source_on_the_hosts_link_or_one_not_known_here_is_taken(
    endpoint: str,
) -> None:
    """By shape, as the connector reads it on every node (the sidecar checks its own
    interfaces besides: ``interface_refusal``)."""
    assert endpoint_refusal(endpoint, bind=False) is None


ABSENT_INTERFACES = [
    ("tcp://[fe80::1%nosuch0]:5557", "the zone of '[fe80::1%nosuch0]' names no interface of this"),
    (f"tcp://[fe80::1%{2**31 - 1}]:5557", "names no interface of this host (its interfaces: "),
]


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize(("endpoint", "why"), ABSENT_INTERFACES)
def test_a_zone_naming_no_interface_of_this_host_is_refused_naming_those_it_has(
    setting: str, endpoint: str, why: str
) -> None:
    """ZMQ binds such a zone with an error, but takes the connect and retries it for ever."""
    loc, message = refusal(SETTINGS[setting](endpoint))
    assert loc == (setting,)
    assert f"{shown_repr(endpoint)} cannot be used on this host: " in message
    assert why in message
    index, name = socket.if_nameindex()[0]
    assert f"(its interfaces: {name} ({index})" in message


@pytest.mark.parametrize("setting", CONNECTED)
@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("nosuch0:0", "'nosuch0' is no interface of this host (its interfaces: "),
        ("localhost:0", "'localhost' is no interface of this host"),  # ZMQ looks up no name
        ("203.0.113.9:0", "ZMQ cannot leave from '203.0.113.9' (IPv4): Cannot assign requested"),
    ],
)
def test_a_source_this_host_cannot_leave_from_is_refused_saying_why(
    setting: str, source: str, why: str
) -> None:
    endpoint = f"tcp://{source};127.0.0.1:5557"
    loc, message = refusal(SETTINGS[setting](endpoint))
    assert loc == (setting,)
    assert f"cannot be used on this host: the source address {shown_repr(source)}: " in message
    assert why in message


def test_the_interfaces_named_in_a_refusal_are_at_most_eight() -> None:
    """A node may have an interface per pod: the refusal names a few, and counts the rest.
    (Containers come and go on a host: the interfaces are read before and after.)"""
    before = _listed(socket.if_nameindex())
    message = refusal({"connect": ["tcp://[fe80::1%nosuch0]:5557"]})[1]
    assert message.endswith((before, _listed(socket.if_nameindex())))


def _listed(interfaces: list[tuple[int, str]]) -> str:
    named = [f"{name} ({index})" for index, name in interfaces[:8]]
    more = f" and {len(interfaces) - 8} more" if len(interfaces) > 8 else ""
    return f"(its interfaces: {', '.join(named)}{more})"


def test_every_interface_of_this_host_is_taken_as_a_zone_by_name_and_number() -> None:
    for index, name in socket.if_nameindex():
        for zone in (name, str(index)):
            endpoint = f"tcp://[fe80::1%{zone}]:5557"
            settings = SidecarSettings(connect=[endpoint], listen=[f"tcp://[fe80::1%{zone}]:*"])
            assert settings.connect == [endpoint]


def test_an_interface_without_an_address_of_the_connects_family_is_refused() -> None:
    """ZMQ leaves from an interface's first address of the connect's family: from one
    with none it retries the connect for ever."""
    bare = [name for _, name in socket.if_nameindex() if not _has_ipv4_address(name)]
    if not bare:
        pytest.skip("every interface of this host has an IPv4 address")
    endpoint = f"tcp://{bare[0]}:0;127.0.0.1:5557"
    message = refusal({"connect": [endpoint]})[1]
    assert f"the interface {shown_repr(bare[0])} has no IPv4 address, which ZMQ leaves" in message


def _has_ipv4_address(name: str) -> bool:
    """Whether the interface ``name`` has an IPv4 address (Linux's SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError:
            return False
    return True


_SIOCGIFADDR = 0x8915
"""Linux's ioctl that reads an interface's IPv4 address."""


def test_the_declared_streams_are_read_as_checked_not_checked_again() -> None:
    """Checking a listen-replay endpoint's source binds a socket and may wait on DNS: it is
    done once, as the settings are read. The sidecar reading the streams they declare (as
    it starts) does not check again, where a host that changed since raised a ValueError
    from inside the sidecar instead of the settings' error. A copy, which pydantic does not
    validate, stands for such a host: its source address is none of this host's now."""
    settings = SidecarSettings(**SETTINGS["listen_replay"]("tcp://127.0.0.1:0;127.0.0.1:5558"))
    moved = "tcp://203.0.113.9:0;127.0.0.1:5558"
    assert refusal(SETTINGS["listen_replay"](moved))[0] == ("listen_replay",)
    copy = settings.model_copy(update={"listen_replay": [f"a@0={moved}"]})
    [stream] = copy.listen_streams()
    assert (stream.name, stream.replay_endpoint) == ("a@0", moved)


@pytest.mark.parametrize("interface", ["127.0.0.1", "lo"])
def test_a_source_port_in_use_on_this_host_is_refused_saying_so(interface: str) -> None:
    """ZMQ binds the connecting socket to the source's own port: one another socket holds
    fails that bind, and ZMQ retries the connect in silence for ever. The check bound a
    free port instead, and took it."""
    if interface == "lo" and "lo" not in [name for _, name in socket.if_nameindex()]:
        pytest.skip("this host has no interface named lo")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        source = f"{interface}:{port}"
        loc, message = refusal({"connect": [f"tcp://{source};127.0.0.1:5557"]})
        assert loc == ("connect",)
        assert (
            f"cannot be used on this host: the source address {shown_repr(source)}: its port "
            f"{port} is in use on this host (0 leaves from a free one)"
        ) in message
    assert SidecarSettings(connect=[f"tcp://{source};127.0.0.1:5557"]).connect  # free again


def test_a_connect_that_reaches_a_listen_endpoint_however_written_is_refused() -> None:
    """The sidecar would read its own socket. Compared as text, a port written with a
    leading zero, another address the wildcard binds, an IPv4 one written as IPv6 or a
    connect from a source passed; each reaches the socket the listen endpoint binds, as a
    real one shows, and each is refused, naming both."""
    with pull_on_every_ipv4_address() as (context, pull, port):
        for listen, connect in [
            (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:0{port}"),
            (f"tcp://*:{port}", f"tcp://127.0.0.1:{port}"),
            (f"tcp://*:{port}", f"tcp://127.0.0.2:{port}"),
            (f"tcp://0.0.0.0:{port}", f"tcp://[::ffff:127.0.0.1]:{port}"),
            (f"tcp://*:{port}", f"tcp://lo:0;127.0.0.1:{port}"),
        ]:
            assert reached(context, pull, connect).bytes == b"reached"
            loc, message = refusal({"connect": [connect], "listen": [listen]})
            assert loc == ()
            assert f"{connect} (KVSCOPE_CONNECT) reaches {listen} (KVSCOPE_LISTEN): " in message


@pytest.mark.skipif(
    "lo" not in [name for _, name in socket.if_nameindex()], reason="no interface named lo"
)
@pytest.mark.parametrize("name", ["lo", "localhost"])
def test_a_listen_name_is_compared_as_the_address_zmq_binds_for_it(name: str) -> None:
    """ZMQ binds a name as an interface's first IPv4 address, else as a host name's: ``lo``
    and ``localhost`` bind 127.0.0.1. Compared as text, a connect to 127.0.0.1 passed
    (``tcp://lo:P`` is not ``tcp://127.0.0.1:P``) though it reaches the socket, as a real
    one shows; it is refused, and a connect to another address at that port is taken."""
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        pull.bind(f"tcp://{name}:*")
        port = pull.last_endpoint.decode().rpartition(":")[2]
        listen = f"tcp://{name}:{port}"
        for connect in (f"tcp://127.0.0.1:{port}", f"tcp://localhost:0{port}"):
            assert reached(context, pull, connect).bytes == b"reached"
            loc, message = refusal({"connect": [connect], "listen": [listen]})
            assert loc == ()
            assert f"{connect} (KVSCOPE_CONNECT) reaches {listen} (KVSCOPE_LISTEN): " in message
    elsewhere = f"tcp://127.0.0.2:{port}"
    assert SidecarSettings(connect=[elsewhere], listen=[listen]).connect == [elsewhere]


@pytest.mark.parametrize(
    "host",
    [
        "no-such-host.invalid",  # no interface, and no host name (RFC 6761)
        "LO",  # an interface's name is compared as it is written, case and all
        "lo.",
    ],
)
def test_a_listen_name_zmq_binds_nothing_for_is_refused_naming_the_interfaces(host: str) -> None:
    """Where ZMQ binds no address for a listen host, the settings say so at start-up, in
    ZMQ's words, naming this host's interfaces, rather than the sidecar failing as it binds
    (or, compared as names, ``Engine.`` being judged to reach ``engine``)."""
    endpoint = f"tcp://{host}:5557"
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        with pytest.raises(zmq.ZMQError) as zmq_refused:
            pull.bind(endpoint)
    loc, message = refusal({"connect": ["tcp://127.0.0.1:5557"], "listen": [endpoint]})
    assert loc == ("listen",)
    assert message.endswith(
        f"{shown_repr(endpoint)} cannot be bound on this host: ZMQ binds no address for its "
        f"host ({zmq.strerror(zmq_refused.value.errno)}); a name to bind is one of this "
        "host's interfaces or a host name of one of its IPv4 addresses (its interfaces: "
        f"{interfaces()})"
    )


@pytest.mark.parametrize(
    ("listen", "connect"),
    [
        ("tcp://*:5557", "tcp://203.0.113.9:5557"),  # a worker elsewhere, at the same port
        ("tcp://*:5557", "tcp://engine:5557"),
        ("tcp://*:5557", "tcp://127.0.0.1:5558"),
        ("tcp://*:0", "tcp://127.0.0.1:5557"),  # a free port: none a connect names
        ("tcp://127.0.0.1:5557", "tcp://127.0.0.2:5557"),
        ("ipc:///tmp/kvscope-a", "ipc:///tmp/kvscope-b"),
    ],
)
def test_a_connect_that_reaches_no_listen_endpoint_is_taken(listen: str, connect: str) -> None:
    assert SidecarSettings(connect=[connect], listen=[listen]).listen == [listen]


@needs_ipv6_loopback
def test_an_ipv4_wildcard_is_not_reached_over_ipv6() -> None:
    """ZMQ binds ``*`` on IPv4 alone, and ``[::]`` on both families (``binds_ipv6``): a
    connect to ``[::1]`` reaches the second only."""
    assert SidecarSettings(connect=["tcp://[::1]:5557"], listen=["tcp://*:5557"]).connect
    assert refusal({"connect": ["tcp://[::1]:5557"], "listen": ["tcp://[::]:5557"]})[0] == ()


@needs_link_local
def test_a_link_local_connect_reaches_a_listen_endpoint_on_its_own_link_only() -> None:
    """A link-local address is one per link, its zone part of it: the listen endpoint's
    address on its interface, by name or by number, is the socket it binds (a real connect
    reaches it, and is refused); the same address on another interface is another
    socket's, and taken."""
    ours = link_local()
    assert ours is not None
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.ipv6 = True
        pull.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        pull.bind(f"tcp://[{ours.address}%{ours.interface}]:*")
        port = pull.last_endpoint.decode().rpartition(":")[2]
        listen = f"tcp://[{ours.address}%{ours.interface}]:{port}"
        numbered = f"tcp://[{ours.address}%{ours.index}]:{port}"
        assert reached(context, pull, numbered).bytes == b"reached"
        loc, message = refusal({"connect": [numbered], "listen": [listen]})
        assert loc == ()
        assert f"{numbered} (KVSCOPE_CONNECT) reaches {listen} (KVSCOPE_LISTEN): " in message
    other = other_interface(ours.interface)
    if other is None:
        pytest.skip(f"no interface on this machine but {ours.interface}, to zone another link")
    elsewhere = f"tcp://[{ours.address}%{other}]:5557"
    listen = f"tcp://[{ours.address}%{ours.interface}]:5557"
    assert SidecarSettings(connect=[elsewhere], listen=[listen]).connect == [elsewhere]


@needs_link_local
def test_a_name_answered_with_a_link_local_address_is_compared_on_the_answers_link() -> None:
    """A resolver that knows the link (mDNS's) answers a name with a link-local address and
    the interface it is on, its ``scope_id``, and ZMQ connects there. That zone was
    dropped, so a name standing for the sidecar's own link-local listen address was judged
    on no link, and taken. No resolver here answers a name so: a zoned address's look-up
    gives the same answer. On another link, or with no zone (ZMQ retries a link-local
    connect without one), it reaches neither the address nor ``[::]``."""
    ours = link_local()
    assert ours is not None
    sockaddr = socket.getaddrinfo(
        f"{ours.address}%{ours.interface}", None, socket.AF_INET6, socket.SOCK_STREAM
    )[0][4]
    answer = answer_address(sockaddr)
    assert answer == IPv6Address(f"{ours.address}%{ours.index}")
    other = other_interface(ours.interface)
    elsewhere = [answer_address((ours.address, 0, 0, 0))]  # no zone
    if other is not None:
        elsewhere.append(IPv6Address(f"{ours.address}%{socket.if_nametoindex(other)}"))
    connect = "tcp://engine.local:5557"
    for listen in (f"tcp://[{ours.address}%{ours.interface}]:5557", "tcp://[::]:5557"):
        listened = listened_addresses([listen])[listen]
        assert not isinstance(listened, str)
        assert connect_reaches(connect, answer, listen, listened), listen
        for address in elsewhere:
            assert not connect_reaches(connect, address, listen, listened), (listen, address)


@needs_link_local
def test_a_link_local_connect_reaches_the_dual_stack_wildcard_on_its_own_link() -> None:
    """``[::]`` binds every address of this host, link-local ones on their links included:
    a connect to one with its own interface as zone reaches it and is refused; the same
    address zoned on another interface reaches nothing (ZMQ retries it), and ``*`` (IPv4
    alone) is reached by neither, so both are taken."""
    ours = link_local()
    assert ours is not None
    form = f"tcp://[{ours.address}%{ours.interface}]:{{port}}"
    connect, event = first_connect_event(form)
    assert event == zmq.EVENT_CONNECTED
    port = connect.rpartition(":")[2]
    loc, message = refusal({"connect": [connect], "listen": [f"tcp://[::]:{port}"]})
    assert loc == ()
    assert f"{connect} (KVSCOPE_CONNECT) reaches tcp://[::]:{port} (KVSCOPE_LISTEN)" in message
    assert SidecarSettings(connect=[connect], listen=[f"tcp://*:{port}"]).connect == [connect]
    other = other_interface(ours.interface)
    if other is None:
        pytest.skip(f"no interface on this machine but {ours.interface}, to zone another link")
    connect, event = first_connect_event(f"tcp://[{ours.address}%{other}]:{{port}}")
    assert event == EVENT_CONNECT_RETRIED
    port = connect.rpartition(":")[2]
    assert SidecarSettings(connect=[connect], listen=[f"tcp://[::]:{port}"]).connect == [connect]
