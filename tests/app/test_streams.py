"""Listen-mode stream names, and the listen settings that use them: what is refused, and why."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import SidecarSettings
from app.streams import MAX_TOPIC_BYTES, ListenStream, parse_stream_name, stream_name


@pytest.mark.parametrize(
    ("topic", "rank", "name"),
    [
        (b"vllm-gpu", 0, "vllm-gpu@0"),
        (b"", 0, "@0"),  # vLLM's default topic
        (b"cpu-tier", None, "cpu-tier@-"),
        (b"pods/a.b_c", -1, "pods/a.b_c@-1"),
        (b"kv events#1", 3, "hex:6b76206576656e74732331@3"),
        ("été".encode(), 0, "hex:c3a974c3a9@0"),
        (b"\x1b[31mred", 2, "hex:1b5b33316d726564@2"),  # a terminal escape, never printed
        (b"t" * MAX_TOPIC_BYTES, 7, "t" * MAX_TOPIC_BYTES + "@7"),
    ],
)
def test_every_stream_has_one_printable_name_that_reads_back(
    topic: bytes, rank: int | None, name: str
) -> None:
    assert stream_name(topic, rank) == name
    assert parse_stream_name(name) == (topic, rank)
    assert ListenStream(topic, rank).name == name


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("vllm-gpu", "expected TOPIC@RANK"),
        ("vllm-gpu@", "expected TOPIC@RANK"),
        ("vllm-gpu@zero", "expected TOPIC@RANK"),
        ("vllm-gpu@01", "names stream 'vllm-gpu@1'"),
        ("hex:616@0", "bad hex after 'hex:'"),
        ("hex:61@0", "names stream 'a@0'"),
        ("kv events@0", "names stream 'hex:6b76206576656e7473@0'"),
        ("t" * (MAX_TOPIC_BYTES + 1) + "@0", f"a stream's is at most {MAX_TOPIC_BYTES}"),
    ],
)
def test_a_text_that_names_no_stream_in_one_way_says_why(text: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_stream_name(text)
    assert why in str(refused.value)


LISTEN = "tcp://127.0.0.1:5557"
TWO_STREAMS = ["a@0=tcp://engine:6557", "b@0=tcp://engine:6558"]


@pytest.mark.parametrize(
    ("settings", "setting", "why"),
    [
        ({"listen": ["5557"]}, "listen", "'5557' is not a ZMQ endpoint to bind"),
        ({"listen": ["tcp://*"]}, "listen", "is not a ZMQ endpoint to bind"),
        ({"listen": ["tcp://*:port"]}, "listen", "is not a ZMQ endpoint to bind"),
        ({"listen": ["tcp://*:70000"]}, "listen", "is not a ZMQ endpoint to bind"),
        ({"listen": ["udp://*:5557"]}, "listen", "is not a ZMQ endpoint to bind"),
        ({"listen": ["inproc://kv"]}, "listen", "is not a ZMQ endpoint to bind"),
        ({"connect": ["tcp://engine"]}, "connect", "'tcp://engine' is not a ZMQ endpoint"),
        ({"connect": ["foo://engine:5557"]}, "connect", "is not a ZMQ endpoint to connect to"),
        ({"connect": ["tcp://*:5557"]}, "connect", "is not a ZMQ endpoint to connect to"),
        ({"connect": ["tcp://e:0"]}, "connect", "is not a ZMQ endpoint to connect to"),
        (
            {"connect": ["tcp://e:1"], "replay": ["tcp://no such host:5558"]},
            "replay",
            "'tcp://no such host:5558' is not a ZMQ endpoint to connect to",
        ),
        ({"listen": [LISTEN, LISTEN]}, "listen", f"'{LISTEN}' is listed twice"),
        ({"listen": [LISTEN], "listen_replay": ["a@0"]}, "listen_replay", "not STREAM=ENDPOINT"),
        (
            {"listen": [LISTEN], "listen_replay": ["a=tcp://engine:5558"]},
            "listen_replay",
            "'a' is not a stream name",
        ),
        (
            {"listen": [LISTEN], "listen_replay": ["a@0=engine:5558"]},
            "listen_replay",
            "'engine:5558' is not a ZMQ endpoint",
        ),
        (
            {"listen": [LISTEN], "listen_replay": ["a@0=tcp://e:1", "a@0=tcp://e:2"]},
            "listen_replay",
            "'a@0' is given more than one replay endpoint",
        ),
        ({"listen": [LISTEN], "listen_max_publishers": 0}, "listen_max_publishers", "equal to 1"),
        (
            {"connect": ["tcp://w:5557"], "listen_replay": ["a@0=tcp://e:1"]},
            None,
            "listen_replay (KVSCOPE_LISTEN_REPLAY) needs listen (KVSCOPE_LISTEN)",
        ),
        (
            {"listen": [LISTEN], "listen_replay": TWO_STREAMS, "listen_max_publishers": 1},
            None,
            "declares 2 streams, more than listen_max_publishers (1)",
        ),
        ({}, None, "no publisher to read: give connect (--connect / KVSCOPE_CONNECT"),
    ],
)
def test_bad_endpoint_and_listen_settings_are_refused_by_name(
    settings: dict[str, object], setting: str | None, why: str
) -> None:
    """``setting`` None: a rule between settings, whose message names them itself."""
    with pytest.raises(ValidationError) as refused:
        SidecarSettings(**settings)
    [error] = refused.value.errors()
    assert error["loc"] == (() if setting is None else (setting,))
    assert why in error["msg"]


LONG = "x" * 100_000
LONG_ENDPOINT = f"tcp://{'h' * 63}.{'.'.join(['h' * 61] * 3)}:5557"
"""Among the longest endpoints taken (a 249-character host name): a longer one is refused
as an endpoint, before the checks of repeats and overlaps that show it too."""


@pytest.mark.parametrize(
    "settings",
    [
        {"connect": [LONG]},
        {"connect": ["tcp://e:1"], "replay": [LONG]},
        {"listen": [LONG]},
        {"listen": [LONG_ENDPOINT, LONG_ENDPOINT]},
        {"connect": [LONG_ENDPOINT], "listen": [LONG_ENDPOINT]},
        {"listen": [f"ipc://@{LONG}"], "listen_allow": ["10.0.0.0/8"]},
        {"listen": [LISTEN], "listen_allow": [LONG]},
        {"listen": [LISTEN], "listen_replay": [LONG]},
        {"listen": [LISTEN], "listen_replay": [f"{LONG}=tcp://e:1"]},
        {"listen": [LISTEN], "listen_replay": [f"hex:{'zz' * 100_000}@0=tcp://e:1"]},
        {"listen": [LISTEN], "listen_replay": [f"a@0={LONG}"]},
        {"connect": ["tcp://e:1"], "allowed_hosts": [f"{LONG}!"]},
        {"connect": ["tcp://e:1"], "insight_policies": [LONG]},
    ],
    ids=[
        "connect", "replay", "listen", "listen twice", "listen and connect", "abstract ipc",
        "listen_allow", "listen_replay pair", "stream name", "stream hex", "replay endpoint",
        "allowed_hosts", "insight_policies",
    ],
)  # fmt: skip
def test_a_refused_setting_is_shown_cut_to_one_short_line(settings: dict[str, object]) -> None:
    """Its value is the operator's, but an environment variable may hold megabytes: each was
    echoed whole (a 100 kB endpoint made a 100 kB error line; a bad hex stream name, 200 kB)."""
    with pytest.raises(ValidationError) as refused:
        SidecarSettings(**settings)
    [error] = refused.value.errors()
    assert len(error["msg"]) < 500, error["msg"][:500]


def test_listen_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_LISTEN", "tcp://*:5557, tcp://*:5558")
    monkeypatch.setenv(
        "KVSCOPE_LISTEN_REPLAY", '["vllm-gpu@0=tcp://engine:6557", "vllm-gpu@1=tcp://engine:6558"]'
    )
    monkeypatch.setenv("KVSCOPE_LISTEN_MAX_PUBLISHERS", "8")
    settings = SidecarSettings()
    assert (settings.connect, settings.listen) == ([], ["tcp://*:5557", "tcp://*:5558"])
    assert settings.listen_max_publishers == 8
    assert settings.listen_streams() == [
        ListenStream(b"vllm-gpu", 0, "tcp://engine:6557"),
        ListenStream(b"vllm-gpu", 1, "tcp://engine:6558"),
    ]
