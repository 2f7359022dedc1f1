"""kvscope's endpoints under ``vllm serve --data-parallel-size N``, and endpoints that fail.

vLLM hands every data-parallel engine the same ``kv_connector_extra_config``
and a real ``OffloadingConfig`` whose ``parallel.data_parallel_index`` is the
engine's rank; the tests build one spec per rank from it, as vLLM does, and
read what each publishes on a live SUB socket with vLLM's own event types.
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher
from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext, make_offload_key

from bench.tooling.vllm_config import offloading_config
from offload.cpu.config import ConfigError
from offload.cpu.policies import registry
from offload.vllm import KVScopeOffloadingSpec
from offload.vllm.manager import KVScopeManager
from offload.wire.endpoint_host import interfaces
from offload.wire.framing import DEFAULT_KV_TOPIC, DEFAULT_STATS_TOPIC
from offload.wire.publisher import EventPublisher
from offload.wire.rank_offsets import ports_overlap
from offload.wire.stats_frame import decode_stats_frame
from tests.support.ipv6 import needs_ipv6_loopback
from tests.support.polling import wait_until
from tests.support.ports import held_tcp_ports

_VLLM_EVENTS = msgspec.msgpack.Decoder(KVEventBatch)


def _managers(extra: dict, ranks: int) -> list[KVScopeManager]:
    """One manager per data-parallel rank, each built from the same extra config."""
    managers = []
    try:
        for rank in range(ranks):
            config = offloading_config(
                {"num_cpu_blocks": 4, "sample_rate": 0, **extra},
                engine_id=f"engine-dp{rank}",
                data_parallel_rank=rank,
                data_parallel_size=ranks,
            )
            manager = KVScopeOffloadingSpec(config).get_manager()
            assert isinstance(manager, KVScopeManager)
            managers.append(manager)
    except BaseException:
        for manager in managers:
            manager.shutdown()
        raise
    return managers


@pytest.fixture
def base() -> Iterator[int]:
    """The first of four consecutive loopback ports (two ranks, two endpoints each), held
    for the whole test: nothing else takes one before a manager binds it, or between a
    manager freeing it and the next binding it again."""
    with held_tcp_ports(4) as first:
        yield first


def test_each_data_parallel_rank_binds_its_port_moved_as_vllm_moves_its_own(base: int) -> None:
    extra = {
        "kvscope_endpoint": f"tcp://127.0.0.1:{base}",
        "kvscope_replay_endpoint": f"tcp://127.0.0.1:{base + 2}",
    }
    managers = _managers(extra, 2)
    try:
        bound = [
            (m.telemetry.publisher.endpoint, m.telemetry.publisher.replay_endpoint)
            for m in managers
            if m.telemetry is not None
        ]
        vllm_rule = ZmqEventPublisher.offset_endpoint_port
        assert bound == [
            (
                vllm_rule(extra["kvscope_endpoint"], r),
                vllm_rule(extra["kvscope_replay_endpoint"], r),
            )
            for r in (0, 1)
        ]
        # Rank 1's batches and stats frames say so, as vLLM stamps its own batches.
        context = zmq.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(bound[1][0])
        manager, ctx, frames = managers[1], ReqContext(req_id="r"), {}
        rounds = iter(range(10**6))

        def heard() -> bool:
            key = make_offload_key(next(rounds).to_bytes(8, "big"), 0)
            output = manager.prepare_store([key], ctx)
            if output is not None:
                manager.complete_store(output.keys_to_store, ctx)
            manager.on_schedule_end(ScheduleEndContext((), ()))
            manager.telemetry.publish_stats()
            while sub.poll(20):
                topic, _seq, payload = sub.recv_multipart()
                frames.setdefault(topic, payload)
            return {DEFAULT_KV_TOPIC, DEFAULT_STATS_TOPIC} <= frames.keys()

        try:
            wait_until(heard, "a KV batch and a stats frame from data-parallel rank 1")
        finally:
            sub.close(0)
            context.term()
        assert _VLLM_EVENTS.decode(frames[DEFAULT_KV_TOPIC]).data_parallel_rank == 1
        stats = decode_stats_frame(frames[DEFAULT_STATS_TOPIC])
        assert (stats.engine_id, stats.rank) == ("engine-dp1", 1)
    finally:
        for m in managers:
            m.shutdown()


def test_an_ipc_endpoint_gets_a_path_of_its_own_per_rank(tmp_path: Path) -> None:
    """ZMQ would let rank 1 take rank 0's path without an error: each rank binds its own."""
    path = f"ipc://{tmp_path}/kvscope"
    managers = _managers({"kvscope_endpoint": path}, 2)
    try:
        assert [m.telemetry.publisher.endpoint for m in managers if m.telemetry] == [
            path,
            f"{path}_dp1",
        ]
    finally:
        for m in managers:
            m.shutdown()


@pytest.mark.parametrize(
    ("extra", "ranks", "named"),
    [
        (
            {"kvscope_endpoint": "tcp://*:5557", "kvscope_replay_endpoint": "tcp://*:5557"},
            1,
            "kvscope_replay_endpoint='tcp://*:5557' is kvscope_endpoint's too",
        ),
        (
            {"kvscope_endpoint": "ipc:///tmp/k", "kvscope_replay_endpoint": "ipc:///tmp/k"},
            2,
            "kvscope_replay_endpoint='ipc:///tmp/k' is kvscope_endpoint's too",
        ),
        (
            {"kvscope_endpoint": "tcp://*:5557", "kvscope_replay_endpoint": "tcp://*:5558"},
            2,
            "keep the ports at least 2 apart",
        ),
        (
            {"kvscope_endpoint": "tcp://*:5557", "kvscope_replay_endpoint": "tcp://127.0.0.1:5559"},
            4,
            "keep the ports at least 4 apart",
        ),
        # A wildcard address binds the port on every address it covers.
        (
            {
                "kvscope_endpoint": "tcp://0.0.0.0:5557",
                "kvscope_replay_endpoint": "tcp://127.0.0.1:5558",
            },
            2,
            "keep the ports at least 2 apart",
        ),
        (
            {"kvscope_endpoint": "tcp://[::1]:5557", "kvscope_replay_endpoint": "tcp://[::]:5558"},
            2,
            "keep the ports at least 2 apart",
        ),
        (
            {"kvscope_endpoint": "tcp://0.0.0.0:5557", "kvscope_replay_endpoint": "tcp://*:5559"},
            3,
            "keep the ports at least 3 apart",
        ),
        (
            {"kvscope_endpoint": "tcp://127.0.0.1:65535"},
            2,
            "kvscope_endpoint='tcp://127.0.0.1:65535': data-parallel rank 1 binds "
            "'tcp://127.0.0.1:65536', which is not a ZMQ endpoint to bind: the port '65536' "
            "is not a number from 0 to 65535",
        ),
        (
            {"kvscope_endpoint": "ipc:///tmp/" + "k" * 102},  # 107 bytes: rank 0's fits
            2,
            f"data-parallel rank 1 binds 'ipc:///tmp/{'k' * 102}_dp1', which is not a ZMQ "
            "endpoint to bind: the ipc path is 111 bytes, more than the 107",
        ),
        (
            {"kvscope_endpoint": "tcp://a..b:5557"},
            1,
            "kvscope_endpoint='tcp://a..b:5557' is not a ZMQ endpoint to bind: 'a..b' is not "
            "a host name or IP address",
        ),
    ],
)
def test_endpoints_two_ranks_or_sockets_would_share_are_refused_naming_the_key(
    extra: dict, ranks: int, named: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        for rank in range(ranks):
            config = offloading_config(
                {"num_cpu_blocks": 4, "sample_rate": 0, **extra},
                data_parallel_rank=rank,
                data_parallel_size=ranks,
            )
            KVScopeOffloadingSpec(config)


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        ("0.0.0.0", "127.0.0.1", True),
        ("10.1.2.3", "0.0.0.0", True),
        ("0.0.0.0", "localhost", True),  # a name may be any address
        ("[::]", "[::1]", True),
        ("[::]", "127.0.0.1", True),  # ZMQ binds [::] dual-stack
        ("[0:0::0]", "10.1.2.3", True),  # [::] written another way
        ("*", "127.0.0.1", True),
        ("*", "[::]", True),  # [::] binds IPv4 too
        ("*", "[::1]", False),  # * is bound IPv4 only, as 0.0.0.0 is
        ("[::ffff:127.0.0.1]", "127.0.0.1", True),  # one address, written two ways
        ("0.0.0.0", "[::1]", False),  # an IPv4 wildcard covers no IPv6 address
        ("127.0.0.1", "127.0.0.2", False),
        ("[::1]", "127.0.0.1", False),
    ],
)
def test_a_wildcard_address_overlaps_every_address_it_binds(
    first: str, second: str, overlap: bool
) -> None:
    assert ports_overlap(f"tcp://{first}:5557", f"tcp://{second}:5558", 2) is overlap
    assert ports_overlap(f"tcp://{second}:5557", f"tcp://{first}:5558", 2) is overlap


@needs_ipv6_loopback
def test_a_star_bind_leaves_an_ipv6_address_its_port() -> None:
    """What the check above rests on for ``*``: a publisher binding ``tcp://*`` listens on
    IPv4 alone (``binds_ipv6``), so another binds the same port at ``[::1]``. The check
    took ``*`` for every address and refused two ranks there that bind."""
    with EventPublisher("tcp://*:0") as star:
        port = star.endpoint.rpartition(":")[2]
        with EventPublisher(f"tcp://[::1]:{port}") as ipv6:
            assert ipv6.endpoint == f"tcp://[::1]:{port}"
    assert not ports_overlap("tcp://*:5557", "tcp://[::1]:5557", 1)


def test_ports_far_enough_apart_serve_every_rank(base: int) -> None:
    extra = {
        "kvscope_endpoint": f"tcp://127.0.0.1:{base}",
        "kvscope_replay_endpoint": f"tcp://127.0.0.1:{base + 2}",
    }
    for manager in _managers(extra, 2):
        manager.shutdown()


def test_an_endpoint_that_cannot_be_bound_is_a_clear_error_naming_its_key(
    tmp_path: Path,
) -> None:
    missing = f"ipc://{tmp_path}/no-such-folder/kvscope"
    foreign = "tcp://192.0.2.1:5557"  # TEST-NET-1: documentation only, on no host
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        for extra, named in [
            ({"kvscope_endpoint": missing}, f"kvscope_endpoint: cannot bind {missing!r}"),
            ({"kvscope_endpoint": foreign}, f"kvscope_endpoint: cannot bind {foreign!r}"),
            (
                {"kvscope_endpoint": "tcp://127.0.0.1:*", "kvscope_replay_endpoint": busy},
                f"kvscope_replay_endpoint: cannot bind {busy!r}",
            ),
        ]:
            spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 4, **extra}))
            with pytest.raises(ConfigError, match=re.escape(named)):
                spec.get_manager()


def test_an_ipc_path_that_cannot_be_bound_is_named_on_one_line_escaped(tmp_path: Path) -> None:
    """A file name may hold a newline or a terminal escape, which the endpoint's shape check
    lets through; ZMQ's reason for refusing the bind quotes the path raw, and the error put
    that reason in whole, so it forged a second log line and recoloured the reader's screen."""
    endpoint = f"ipc://{tmp_path}/no such\n[FAKE] ERROR\x1b[31m/kvscope"
    spec = KVScopeOffloadingSpec(
        offloading_config({"num_cpu_blocks": 4, "kvscope_endpoint": endpoint})
    )
    with pytest.raises(ConfigError, match=re.escape(f"cannot bind {endpoint!r}")) as refused:
        spec.get_manager()
    message = str(refused.value)
    assert "\n" not in message
    assert "\x1b" not in message
    assert "No such file or directory" in message


@pytest.mark.parametrize("key", ["kvscope_endpoint", "kvscope_replay_endpoint"])
def test_a_zone_naming_no_interface_is_refused_where_the_scheduler_binds_not_on_every_node(
    key: str,
) -> None:
    """Workers read the endpoints too, on nodes whose interfaces may differ: the spec takes
    the zone's shape, and the scheduler's manager refuses it, naming this host's interfaces."""
    endpoint = "tcp://[fe80::1%nosuch0]:5557"
    extra = {"kvscope_endpoint": "tcp://127.0.0.1:*", key: endpoint}
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 4, **extra}))
    index, name = socket.if_nameindex()[0]
    with pytest.raises(ConfigError) as refused:
        spec.get_manager()
    assert str(refused.value).startswith(
        f"{key}={endpoint!r} cannot be used on this host: the zone of '[fe80::1%nosuch0]' "
        f"names no interface of this host (its interfaces: {name} ({index})"
    )


@pytest.mark.parametrize("key", ["kvscope_endpoint", "kvscope_replay_endpoint"])
@pytest.mark.parametrize(
    "host",
    [
        "no-such-host.invalid",  # no interface, and no host name (RFC 6761)
        "LO",  # an interface's name is compared as it is written, case and all
        "lo.",
    ],
)
def test_a_host_name_zmq_binds_nothing_for_is_refused_as_the_sidecars_listen_is(
    key: str, host: str
) -> None:
    """ZMQ's own bind refused such a name as "No such device", saying nothing of what a
    name to bind is; the scheduler now says it before binding, in the sidecar's words for
    its ``--listen``, naming the key and this host's interfaces."""
    endpoint = f"tcp://{host}:5557"
    with zmq.Context() as context, context.socket(zmq.PUB) as pub:
        pub.linger = 0
        with pytest.raises(zmq.ZMQError) as zmq_refused:
            pub.bind(endpoint)
    extra = {"kvscope_endpoint": "tcp://127.0.0.1:*", key: endpoint}
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 4, **extra}))
    with pytest.raises(ConfigError) as refused:
        spec.get_manager()
    assert str(refused.value) == (
        f"{key}={endpoint!r} cannot be bound on this host: ZMQ binds no address for its host "
        f"({zmq.strerror(zmq_refused.value.errno)}); a name to bind is one of this host's "
        f"interfaces or a host name of one of its IPv4 addresses (its interfaces: {interfaces()})"
    )


def test_a_manager_that_fails_to_build_leaves_its_endpoint_free_for_the_next_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: int
) -> None:
    """A policy that fails as it is built, after the publisher bound its port, left the port
    bound and the publisher's thread running: built again in the same process, the manager
    failed with "Address already in use" instead of the policy's own error."""
    (tmp_path / "failing_policy.py").write_text(
        "from offload.cpu.policies.lru import LRUCachePolicy\n\n"
        "class failing(LRUCachePolicy):\n"
        "    name = 'failing'\n\n"
        "    def __init__(self, capacity):\n"
        "        raise RuntimeError('needs a database')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # The policy registers itself for the process; the registry is as it was afterwards.
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    endpoint = f"tcp://127.0.0.1:{base}"
    extra = {
        "num_cpu_blocks": 4,
        "kvscope_endpoint": endpoint,
        "eviction_policy": "failing",
        "cache_policy_module_path": "failing_policy",
    }
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="needs a database"):
                KVScopeOffloadingSpec(offloading_config(extra)).get_manager()
    finally:
        sys.modules.pop("failing_policy", None)
    # The port is free: a working manager binds it.
    manager = KVScopeOffloadingSpec(
        offloading_config({"num_cpu_blocks": 4, "kvscope_endpoint": endpoint})
    ).get_manager()
    manager.shutdown()


def test_a_shutdown_whose_last_stats_frame_fails_still_frees_its_endpoint(
    monkeypatch: pytest.MonkeyPatch, base: int
) -> None:
    """Shutdown publishes what is left before closing the publisher; a stats frame that
    could not be made there (the heartbeat logs the same failure) left the publisher open,
    its thread running and its port bound, so the connector built again failed to bind."""
    endpoint = f"tcp://127.0.0.1:{base}"
    extra = {"num_cpu_blocks": 4, "kvscope_endpoint": endpoint}
    manager = KVScopeOffloadingSpec(offloading_config(extra)).get_manager()
    assert isinstance(manager, KVScopeManager) and manager.telemetry is not None

    def unmade() -> None:
        raise OSError("the snapshot's source is gone")

    monkeypatch.setattr(manager.telemetry, "stats_frame", unmade)
    with pytest.raises(OSError, match="source is gone"):
        manager.shutdown()
    # The failure is the caller's to see, and the port is free: a new manager binds it.
    again = KVScopeOffloadingSpec(offloading_config(extra)).get_manager()
    again.shutdown()
