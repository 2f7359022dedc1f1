"""A sidecar reaches its publisher by a host name of either address family, over real sockets.

ZMQ connects to IPv6 only from a socket with its IPv6 option set, and with it set takes only
the first address of an IPv6 lookup. So a name with IPv6 addresses alone (an IPv6-only
cluster's service) was retried for ever, and setting the option for every name would reach a
name with both families over IPv6 alone, missing a publisher bound on ``tcp://*`` (IPv4).

Names with one family or both need a hosts file that says so, which this machine's lacks, so
those tests run their sidecar in namespaces of its own (``unshare``, root only): a network
one, whose loopback gets an IPv6 address that is not ``::1`` (glibc answers an IPv4 lookup of
a name for ``::1`` with 127.0.0.1) and a link-local one, reached only with its zone (the
interface it is on), and a mount one, where a hosts file of the test's own stands over
/etc/hosts, and may be written while the sidecar runs. Elsewhere they are skipped.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from pydantic import ValidationError
from zmq import EVENT_CONNECT_RETRIED, EVENT_CONNECTED

from app.ingest.ingestor import Ingestor
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState
from offload.wire.endpoint_host import resolved_families
from offload.wire.endpoints import binds_ipv6, endpoint_refusal
from offload.wire.framing import DEFAULT_STATS_TOPIC, encode_seq
from offload.wire.publisher import EventPublisher
from tests.app.test_ingest import a_stats_frame, cpu_blocks, start_ingest, stored
from tests.support.http_app import served_views
from tests.support.ipv6 import needs_ipv6_loopback
from tests.support.polling import wait_until
from tests.support.zmq_connects import (
    first_connect_event,
    ipv6,
    pull_on_every_ipv4_address,
    reached,
)
from tests.support.zmq_peers import RawPublisher, kv_payload, stats_probe

pytestmark = pytest.mark.timeout(120)

_ADDRESS = "fd00:6b76::1"
"""A unique local IPv6 address the network namespace's loopback is given."""

_LINK_LOCAL = "fe80::6b76"
"""A link-local address the network namespace's loopback is given, besides."""

_HOSTS = f"127.0.0.1 localhost\n{_ADDRESS} v6only.test\n{_ADDRESS} both.test\n127.0.0.1 both.test\n"


def reach_by_name(bound: str, name: str, hosts: str | None = None) -> None:
    """A sidecar connecting by ``name`` to a publisher bound on ``bound`` subscribes and is
    replayed what it missed; run in the namespaces (``python -c``), and for ``localhost``.

    ``hosts``: the hosts file standing over /etc/hosts, where ``name`` is written for
    ``bound``'s address only once the sidecar has started, as a name that did not resolve
    then (so it connected over IPv4); the sidecar finds it and connects again."""
    with EventPublisher(f"tcp://{bound}:*", f"tcp://{bound}:*") as publisher:
        publisher.publish_events([stored(1, 2)])
        wait_until(lambda: publisher.batches_published == 1, "first batch sent")
        ports = (e.rpartition(":")[2] for e in (publisher.endpoint, publisher.replay_endpoint))
        connect, replay = (f"tcp://{name}:{port}" for port in ports)
        [by_name] = SidecarSettings(connect=[connect], replay=[replay]).publishers()
        if hosts is not None:  # no address yet: IPv4
            assert (by_name.family, by_name.replay_family) == (None, None)
        ingestor = start_ingest(by_name)
        try:
            state = ingestor.state.publishers[by_name.endpoint]
            if hosts is not None:
                with open(hosts, "a") as file:
                    file.write(f"{bound.strip('[]')} {name}\n")

            def subscribed() -> bool:
                publisher.publish_stats(a_stats_frame())
                return state.stats_frames > 0

            wait_until(subscribed, f"the sidecar subscribes to {name}")
            publisher.publish_events([stored(3)])  # the first frame seen: 1 and 2 replayed
            wait_until(lambda: cpu_blocks(ingestor) == {1, 2, 3}, f"a replay from {name}")
            # its socket made again, and its replay endpoint switched: each once, or never;
            # /metrics and /api/v1/stats say so alike
            metrics, publisher = served_views(ingestor.state, by_name.endpoint)
            changes = metrics["kvscope_sidecar_family_changes_total", (("publisher", state.name),)]
            assert changes == publisher["family_changes"] == (0 if hosts is None else 2)

            def kept() -> list[float | None]:  # and the history keeps the count
                window = ingestor.state.history.window(0, 1, state.name)
                return [v for k, _, vs in window.series if k.metric == "family_changes" for v in vs]

            wait_until(lambda: kept()[-1:] == [changes], "the history keeps the family changes")
        finally:
            ingestor.close()


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-m", "-n", "true"], capture_output=True).returncode == 0


def in_namespaces(
    tmp_path: Path, hosts_text: str, bound: str, name: str, *, later: bool = False
) -> None:
    """``reach_by_name(bound, name)`` in namespaces of its own, ``hosts_text`` standing over
    /etc/hosts (written to by ``reach_by_name`` where ``later``)."""
    hosts = tmp_path / "hosts"
    arguments = (bound, name, str(hosts)) if later else (bound, name)
    run = (
        f"from tests.app.test_endpoint_families import reach_by_name; reach_by_name(*{arguments!r})"
    )
    run_in_namespaces(hosts, hosts_text, run)


def run_in_namespaces(hosts: Path, hosts_text: str, run: str) -> str:
    """What Python code ``run`` prints, run in namespaces of its own, ``hosts_text`` written
    to ``hosts`` standing over /etc/hosts."""
    hosts.write_text(hosts_text)
    script = (
        f"ip link set lo up && ip addr add {_ADDRESS}/128 dev lo && "
        f"ip addr add {_LINK_LOCAL}/64 dev lo nodad && "
        f'mount --bind {hosts} /etc/hosts && exec "$0" -c "$1"'
    )
    done = subprocess.run(
        ["unshare", "-m", "-n", "sh", "-c", script, sys.executable, run],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.skipif(not _namespaces_work(), reason="no network namespace to make")
@pytest.mark.parametrize(("host_zone", "connects"), [("v0", True), ("v1", False)])
def test_a_link_local_source_reaches_a_host_on_its_own_link_only(
    host_zone: str, connects: bool
) -> None:
    """Two links (a veth pair, each end a link-local address): from one link's address, ZMQ
    connects to a host named on that link, and a host named on the other it retries in
    silence (the kernel refuses a connect to another link than its source's), which the
    settings refuse. (The links are the namespace's: out here only the shape is checked.)"""
    source, host = "[fe80::6b77%v0]", f"[fe80::6b78%{host_zone}]"
    form = f"tcp://{source}:0;{host}:{{port}}"
    endpoint = form.format(port=5557)
    if connects:
        assert endpoint_refusal(endpoint, bind=False) is None
    else:
        with pytest.raises(ValueError, match="its zone 'v0' is not the host's 'v1'"):
            SidecarSettings(connect=[endpoint])
    run = (
        f"from tests.support.zmq_connects import first_connect_event; "
        f"print(first_connect_event({form!r})[1])"
    )
    script = (
        "ip link set lo up && ip link add v0 type veth peer name v1 && ip link set v0 up && "
        "ip link set v1 up && ip addr add fe80::6b77/64 dev v0 nodad && "
        'ip addr add fe80::6b78/64 dev v1 nodad && exec "$0" -c "$1"'
    )
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", script, sys.executable, run],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) == (EVENT_CONNECTED if connects else EVENT_CONNECT_RETRIED)


def test_a_connect_sets_ipv6_for_a_bracketed_address_and_a_bind_for_nothing_else() -> None:
    for endpoint in ("tcp://[::1]:5557", "tcp://[fe80::1%eth0]:5557", "tcp://[fe80::1%2]:5557"):
        assert ipv6(endpoint) and binds_ipv6(endpoint), endpoint
    for source in ("[::1]:0", "[fe80::1%eth0]:0"):  # ZMQ finds an IPv6 source only with it
        assert ipv6(f"tcp://{source};engine:5557"), source
    assert ipv6("tcp://eth0:0;[::1]:5557")
    assert not ipv6("tcp://127.0.0.1:0;localhost:5557")
    assert not binds_ipv6("tcp://*:5557") and not binds_ipv6("tcp://localhost:5557")
    for endpoint in ("tcp://127.0.0.1:5557", "tcp://localhost:5557", "ipc:///tmp/kv"):
        assert not ipv6(endpoint), endpoint
    assert not ipv6("tcp://no-such-name.invalid:5557")  # resolves later, if ever: IPv4
    # and is looked up again while unheard: no answer yet, where other names have theirs
    found = resolved_families(["tcp://no-such-name.invalid:5557", "tcp://localhost:5557"])
    assert found == {"tcp://no-such-name.invalid:5557": None, "tcp://localhost:5557": 4}


def start_lookups(connect: list[str], replay: list[str]) -> None:
    """Prints, as JSON, each look-up (host, family) Python's resolver was asked for while a
    sidecar's settings were read and its ingest thread made its sockets; run in a fresh
    interpreter (``python -c``): an audit hook, which sees every ``socket.getaddrinfo``, is
    never taken out again."""
    lookups: list[tuple[str, int]] = []

    def hook(event: str, args: tuple) -> None:
        if event == "socket.getaddrinfo":
            lookups.append((args[0], int(args[2])))

    sys.addaudithook(hook)
    state = SidecarState.from_settings(SidecarSettings(connect=connect, replay=replay))
    Ingestor(state).close()
    print(json.dumps(lookups))


@pytest.mark.skipif(
    "lo" not in [name for _, name in socket.if_nameindex()], reason="no interface named lo"
)
def test_the_sidecar_looks_each_host_name_up_once_as_it_starts() -> None:
    """A DNS server that does not answer holds up the start for as long as each look-up
    waits on it: the settings looked a connect's host name up to check its source, and
    the ingest thread looked it up again for its socket's family, and once more for its
    replay endpoint's. The settings' answer now travels to the ingest thread, so each
    name is looked up once, a family at a time (IPv4 first, then IPv6 where it has no
    IPv4 address), however many endpoints name it."""
    connect = [
        "tcp://lo:0;localhost:5557",
        "tcp://127.0.0.1:0;no-such-name.invalid:5557",
        "tcp://other.invalid:5557",
    ]
    replay = ["tcp://localhost:5558", "tcp://no-such-name.invalid:5558"]
    run = (
        "from tests.app.test_endpoint_families import start_lookups; "
        f"start_lookups({connect!r}, {replay!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", run], capture_output=True, text=True, timeout=90, check=True
    )
    v4, v6 = socket.AF_INET, socket.AF_INET6
    assert sorted(map(tuple, json.loads(done.stdout))) == [
        ("localhost", v4),
        ("no-such-name.invalid", v4),
        ("no-such-name.invalid", v6),
        ("other.invalid", v4),
        ("other.invalid", v6),
    ]


def refusal_lookups(connect: list[str], listen: list[str]) -> None:
    """Prints, as JSON, the refusal of settings with ``connect`` and ``listen`` and each
    look-up (host, family) Python's resolver was asked for while they were read; run in a
    fresh interpreter, as ``start_lookups``."""
    lookups: list[tuple[str, int]] = []

    def hook(event: str, args: tuple) -> None:
        if event == "socket.getaddrinfo":
            lookups.append((args[0], int(args[2])))

    sys.addaudithook(hook)
    with pytest.raises(ValidationError) as refused:
        SidecarSettings(connect=connect, listen=listen)
    print(json.dumps([refused.value.errors()[0]["msg"], lookups]))


def test_a_connect_by_a_name_of_this_host_reaches_a_listen_endpoint_and_is_refused() -> None:
    """ZMQ connects to the address a name resolves to: ``localhost`` reaches the sidecar's
    own listen socket as 127.0.0.1 does (a real connect shows it), and so does 127.0.0.1
    in the short form the resolver reads, ``127.1``. Each is refused, by the answer of the
    one look-up the settings make of a name as the sidecar starts: comparing adds none,
    so a DNS server that does not answer holds up the start once."""
    with pull_on_every_ipv4_address() as (context, pull, port):
        for listen, connect in [
            (f"tcp://*:{port}", f"tcp://localhost:{port}"),
            (f"tcp://127.0.0.1:{port}", f"tcp://LocalHost:{port}"),
            (f"tcp://*:{port}", f"tcp://127.1:{port}"),
        ]:
            assert reached(context, pull, connect).bytes == b"reached"
            run = (
                "from tests.app.test_endpoint_families import refusal_lookups; "
                f"refusal_lookups({[connect]!r}, {[listen]!r})"
            )
            done = subprocess.run(
                [sys.executable, "-c", run], capture_output=True, text=True, timeout=90, check=True
            )
            message, lookups = json.loads(done.stdout)
            assert f"{connect} (KVSCOPE_CONNECT) reaches {listen} (KVSCOPE_LISTEN): " in message
            name = connect.removeprefix("tcp://").rpartition(":")[0]
            assert lookups == ([] if name == "127.1" else [[name, socket.AF_INET]])
    assert SidecarSettings(connect=["tcp://localhost:5557"], listen=["tcp://*:5558"]).connect
    assert SidecarSettings(
        connect=["tcp://no-such-name.invalid:5557"], listen=["tcp://*:5557"]
    ).connect  # no address now: none of this host's


def test_a_publisher_on_ipv4_loopback_is_reached_by_localhost() -> None:
    reach_by_name("127.0.0.1", "localhost")


@needs_ipv6_loopback
@pytest.mark.parametrize("zone", ["lo", str(socket.if_nametoindex("lo"))])
def test_an_ipv6_address_with_its_zone_is_taken_bound_and_delivered_through(zone: str) -> None:
    """The zone of a loopback address, by name or number: its settings take it, and ZMQ binds
    and connects to it with the IPv6 option each side sets."""
    bound = f"tcp://[::1%{zone}]:*"
    assert SidecarSettings(listen=[bound]).listen == [bound]
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.linger = 0
        pull.rcvtimeo = 60_000  # a bound on a failure, not a measured time
        pull.ipv6 = binds_ipv6(bound)
        pull.bind(bound)
        endpoint = bound.replace("*", pull.last_endpoint.decode().rpartition(":")[2])
        assert SidecarSettings(connect=[endpoint]).connect == [endpoint]
        assert reached(context, pull, endpoint).bytes == b"reached"


@pytest.mark.skipif(not _namespaces_work(), reason="no network and mount namespaces to make")
@pytest.mark.parametrize(
    ("bound", "name"),
    [
        (f"[{_ADDRESS}]", "v6only.test"),
        ("127.0.0.1", "both.test"),
        (f"[{_ADDRESS}]", "lo:0;v6only.test"),
        (f"[{_LINK_LOCAL}%lo]", f"[{_LINK_LOCAL}%lo]"),
        (f"[{_LINK_LOCAL}%lo]", f"[{_LINK_LOCAL}%1]"),
    ],
    ids=[
        "ipv6-only-name",
        "dual-stack-name-publisher-on-ipv4",
        "ipv6-only-name-from-a-source-interface",
        "link-local-address-with-its-zone",
        "link-local-address-with-its-zone-number",
    ],
)
def test_a_publisher_is_reached_by_a_name_of_its_family_or_a_zoned_address(
    tmp_path: Path, bound: str, name: str
) -> None:
    in_namespaces(tmp_path, _HOSTS, bound, name)


@pytest.mark.skipif(not _namespaces_work(), reason="no network and mount namespaces to make")
def test_a_name_that_resolves_only_once_the_sidecar_runs_is_reached_over_ipv6(
    tmp_path: Path,
) -> None:
    """A service whose pods are not up as the sidecar starts: its name does not resolve, so
    the sidecar connects over IPv4; once the name resolves to an IPv6 address alone, the
    sidecar's next look-up finds it and connects over IPv6, where the publisher listens."""
    in_namespaces(tmp_path, "127.0.0.1 localhost\n", f"[{_ADDRESS}]", "late.test", later=True)


def replay_by_a_late_name(hosts: str) -> None:
    """A listen-mode stream heard all along, whose replay endpoint's name resolves to nothing
    as the sidecar starts, then to an IPv6 address alone, where the engine's replay socket
    is: the sidecar switches its replays to IPv6 while the stream is heard, and a gap is
    then filled by replay; run in the namespaces, ``hosts`` standing over /etc/hosts."""
    raw = RawPublisher(topic=b"late", bind=False, replay=f"tcp://[{_ADDRESS}]:*")
    try:
        port = raw.router.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2]
        settings = SidecarSettings(
            listen=["tcp://127.0.0.1:*"], listen_replay=[f"late@0=tcp://late.test:{port}"]
        )
        ingestor = Ingestor(SidecarState.from_settings(settings))
        ingestor.start()
        try:
            assert ingestor.state.listener is not None
            raw.pub.connect(ingestor.state.listener.bound[0])
            state = ingestor.state.publishers["late@0"]

            def heard() -> bool:  # a stats frame names its stream, and carries no seq
                raw.pub.send_multipart([DEFAULT_STATS_TOPIC, encode_seq(0), stats_probe("late")])
                return state.stats_frames > 0 and state.connected(time.time())

            wait_until(heard, "the stream is heard on the listen socket")
            with open(hosts, "a") as file:
                file.write(f"{_ADDRESS} late.test\n")
            wait_until(
                lambda: heard() and state.family_changes == 1,
                "the replays of a stream heard all along switched to IPv6",
                wait_s=60,
            )
            raw.send(0, kv_payload(stored(100), rank=0))
            raw.send(1, kv_payload(stored(101), rank=0), lose=True)
            raw.send(2, kv_payload(stored(102), rank=0))
            wait_until(lambda: state.replays["complete"] == 1, "the gap replayed over IPv6")
            assert (state.gaps, state.missed, state.replayed) == (1, 0, 1)
        finally:
            ingestor.close()
    finally:
        raw.close()


@pytest.mark.skipif(not _namespaces_work(), reason="no network and mount namespaces to make")
def test_a_heard_listen_streams_replay_endpoint_follows_its_late_name(tmp_path: Path) -> None:
    """A listen-mode stream is heard on the sidecar's own socket, which proves nothing of its
    replay endpoint: an engine that publishes before its name resolves (a headless
    service's, before its pod is ready) had that name looked up only while unheard, so
    while it kept publishing each replay was asked over IPv4 of a name that came to
    resolve to IPv6 alone, and timed out."""
    hosts = tmp_path / "hosts"
    run = (
        "from tests.app.test_endpoint_families import replay_by_a_late_name; "
        f"replay_by_a_late_name({str(hosts)!r})"
    )
    run_in_namespaces(hosts, "127.0.0.1 localhost\n", run)


class _Warnings(logging.Handler):
    """The warnings a logger writes, each as its line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def source_of_the_other_family(hosts: str) -> None:
    """A sidecar connecting from an IPv4 source address to a name that resolves to nothing
    as it starts, then to an IPv6 address alone, then to IPv4 again; run in the namespaces,
    ``hosts`` standing over /etc/hosts."""
    warned = _Warnings()
    logging.getLogger("app.ingest").addHandler(warned)
    warnings = warned.lines
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        publisher.publish_events([stored(1, 2)])
        wait_until(lambda: publisher.batches_published == 1, "first batch sent")
        ports = (e.rpartition(":")[2] for e in (publisher.endpoint, publisher.replay_endpoint))
        connect, replay = (f"tcp://127.0.0.1:0;late.test:{port}" for port in ports)
        [endpoints] = SidecarSettings(connect=[connect], replay=[replay]).publishers()
        ingestor = start_ingest(endpoints)
        try:
            state = ingestor.state.publishers[connect]
            with open(hosts, "a") as file:
                file.write(f"{_ADDRESS} late.test\n")
            wait_until(
                lambda: state.source_family_mismatches == 2,
                "the live and the replay endpoint found unable to leave from their source",
                wait_s=60,
            )
            assert state.family_changes == 0  # no socket made again: neither family connects
            for endpoint in (connect, replay):
                assert any(
                    warning.startswith(
                        f"{endpoint} cannot be connected to from its source address: it is "
                        "IPv4 and the host 'late.test' resolves here to IPv6 addresses alone"
                    )
                    for warning in warnings
                ), warnings
            Path(hosts).write_text("127.0.0.1 localhost\n127.0.0.1 late.test\n")

            def subscribed() -> bool:
                publisher.publish_stats(a_stats_frame())
                return state.stats_frames > 0

            wait_until(subscribed, "the socket kept connects once late.test is IPv4", wait_s=60)
            publisher.publish_events([stored(3)])  # the first frame seen: 1 and 2 replayed
            wait_until(lambda: cpu_blocks(ingestor) == {1, 2, 3}, "a replay from late.test")
            metrics, shown = served_views(ingestor.state, connect)
            counted = metrics[
                "kvscope_sidecar_source_family_mismatches_total", (("publisher", connect),)
            ]
            assert counted == shown["source_family_mismatches"] == 2
            assert state.family_changes == 0
        finally:
            ingestor.close()


@pytest.mark.skipif(not _namespaces_work(), reason="no network and mount namespaces to make")
def test_a_source_whose_host_comes_to_resolve_to_the_other_family_is_reported(
    tmp_path: Path,
) -> None:
    """The settings refuse a source address and a name of the other family alone as the
    sidecar starts, but a name that resolves to nothing then may resolve so later: ZMQ
    retries the connect in silence, over either family. The look-up that follows an
    unheard publisher's name reports it (a warning, a count on /metrics and
    /api/v1/stats) and leaves the socket in the source's family, where it connects once
    the name resolves to that family again."""
    hosts = tmp_path / "hosts"
    run = (
        "from tests.app.test_endpoint_families import source_of_the_other_family; "
        f"source_of_the_other_family({str(hosts)!r})"
    )
    run_in_namespaces(hosts, "127.0.0.1 localhost\n", run)


_MIXED_FAMILIES = {
    "tcp://127.0.0.1:0;v6only.test:{port}": "it is IPv4 and the host 'v6only.test' resolves "
    "here to IPv6 addresses alone, and ZMQ connects within one family",
    f"tcp://[{_ADDRESS}]:0;v4only.test:{{port}}": "it is IPv6 and the host 'v4only.test' "
    "resolves here to IPv4 addresses alone",
    "tcp://127.0.0.1:0;both.test:{port}": None,
    f"tcp://[{_ADDRESS}]:0;v6only.test:{{port}}": None,
    "tcp://[::ffff:127.0.0.1]:0;v4only.test:{port}": None,  # an IPv4-mapped source is IPv4
}
"""Connects from a source address to a name, and what the settings say of each (None: taken)."""


def source_verdicts(forms: list[str]) -> None:
    """Prints, as JSON, what the settings say of a connect of each form (None where they
    take it) and the first event ZMQ's monitor sees of it; run in the namespaces."""
    verdicts: list[tuple[str | None, int]] = []
    for form in forms:
        try:
            SidecarSettings(connect=[form.format(port=5557)])
            said = None
        except ValidationError as exc:
            said = exc.errors()[0]["msg"]
        verdicts.append((said, first_connect_event(form)[1]))
    print(json.dumps(verdicts))


@pytest.mark.skipif(not _namespaces_work(), reason="no network and mount namespaces to make")
def test_a_source_address_and_a_name_of_the_other_family_alone_are_refused(
    tmp_path: Path,
) -> None:
    """From an IPv4 source address ZMQ never reaches a name with IPv6 addresses alone, nor
    from an IPv6 one a name with IPv4 ones alone: it retries in silence, as its monitor
    shows, so the settings refuse them where the name resolves so as the sidecar starts. A
    source of the name's family, or a name of both, is taken, and connects."""
    forms = list(_MIXED_FAMILIES)
    run = (
        f"from tests.app.test_endpoint_families import source_verdicts; source_verdicts({forms!r})"
    )
    hosts_text = _HOSTS + "127.0.0.1 v4only.test\n"
    verdicts = json.loads(run_in_namespaces(tmp_path / "hosts", hosts_text, run))
    for (said, event), (form, refused) in zip(verdicts, _MIXED_FAMILIES.items(), strict=True):
        if refused is None:
            assert (said, event) == (None, EVENT_CONNECTED), form
        else:
            assert said is not None and refused in said, (form, said)
            assert event == EVENT_CONNECT_RETRIED, form
