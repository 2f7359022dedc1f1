"""The replay command end to end, as a user runs it: a real process."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from app.otel import MAX_BSP_VALUE
from offload import CPUOffloadingManager
from offload.sim import mooncake
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE, TraceError, load_trace
from offload.sim.workload import run_workload


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with no KVSCOPE_* setting but those given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    return {**clean, **(env or {})}


def kvscope(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command, with no KVSCOPE_* setting but those given."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True, text=True, timeout=120, env=environment(env),
    )  # fmt: skip


def test_replay_prints_one_json_line_of_totals(trace_slice: Path) -> None:
    result = kvscope("replay", str(trace_slice), "--capacity", "200", "--policy", "arc")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    totals = json.loads(lines[0])
    requests = load_trace(trace_slice)
    expected = run_workload(
        CPUOffloadingManager(BUNDLED_TRACE_BLOCK_SIZE, 200, "arc", enable_events=True), requests
    )
    assert totals["requests"] == 300 == expected.requests
    assert totals["block_refs"] == sum(len(r) for r in requests)
    assert totals["hits"] == expected.hits > 0
    assert totals["hit_ratio"] == pytest.approx(expected.hits / expected.block_refs)
    assert totals["seconds"] > 0 and totals["blocks_per_s"] > 0
    assert (totals["policy"], totals["capacity"]) == ("arc", 200)


def test_replay_defaults_to_the_bundled_trace() -> None:
    result = kvscope("replay", "--capacity", "2000")
    assert result.returncode == 0, result.stderr
    totals = json.loads(result.stdout)
    assert (totals["requests"], totals["block_refs"]) == (12031, 288500)
    assert totals["trace"].endswith("conversation_trace.jsonl")


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, ["--capacity", "10"], "trace file not found"),
        ('{"hash_ids": [1, 2]}\nnot json\n', [], ":2: not valid JSON"),
        ('{"hash_ids": [1, "x"]}\n', [], ':1: hash_ids[1] is "x"; hash ids are integers from 0'),
        ('{"hash_ids": [1, -2]}\n', [], ":1: hash_ids[1] is -2; hash ids are integers from 0"),
        ('{"hash_ids": [2.5]}\n', [], ":1: hash_ids[0] is 2.5; hash ids are integers from 0"),
        (
            '{"hash_ids": [1]}\n{"hash_ids": [\xe9]}\n'.encode("latin-1"),
            [],
            ":2: not UTF-8 (byte 15 of the line is 0xe9)",
        ),
        (gzip.compress(b'{"hash_ids": [1]}\n'), [], "is gzip-compressed: decompress it first"),
        (
            '{"hash_ids": [1, 2]}\n{"hash_ids": [1,, 2]}\n',
            [],
            ":2: not valid JSON (Expecting value at column 17)",
        ),
        (
            '{"hash_ids": [1], "a": "\x01"}\n',
            [],
            ":1: not valid JSON (Invalid control character at column 25)",
        ),
        ('{"hash_ids": [1]}\n\x0c\n', [], ":2: not valid JSON (Expecting value at column 1)"),
        (
            '{"hash_ids": [1]}\n{"hash_ids": [1, 2\n',
            [],
            ":2: not valid JSON (Expecting ',' delimiter at the end of the line: is it cut short?)",
        ),
        (
            '{"hash_ids": [1]}\n{"hash_ids": [1, 2',
            [],
            ":2: not valid JSON (Expecting ',' delimiter at the end of the line: is it cut short?)",
        ),
        (
            '\u00a0\n{"hash_ids": [1]}\n'.encode(),
            [],
            ":1: not valid JSON (Expecting value at column 1)",
        ),
        ("[1, 2]\n", [], ":1: expected a JSON object, got an array"),
        ('{"hash_ids": null}\n', [], ":1: 'hash_ids' must be a list, got null"),
        ('{"hash_ids": {"0": 1}}\n', [], ":1: 'hash_ids' must be a list, got an object"),
        ('{"input_length": 3}\n', [], ":1: missing 'hash_ids' list"),
        ('{"hash_ids": "0 1 2"}\n', [], ":1: 'hash_ids' must be a list, got a string"),
        (
            '{"hash_ids": [1]}\n{"hash_ids": [1], "hash_ids": [2]}\n',
            [],
            ":2: 'hash_ids' given more",
        ),
        ("\n\n", [], "holds no requests"),
        ('{"hash_ids": []}\n{"hash_ids": []}\n', [], "holds no block references"),
        (
            '{"hash_ids": [1], "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            [],
            ":1: JSON nested too deeply",
        ),
        ('{"hash_ids": [1], "t": ' + "9" * 5000 + "}\n", [], ":1: a number of more than 4,300"),
        ('{"hash_ids": [1]}\n', ["--capacity", "0"], "capacity must be at least 1"),
        ('{"hash_ids": [1]}\n', ["--capacity", "many"], "capacity must be plain decimal digits"),
        ('{"hash_ids": [1]}\n', ["--capacity", "1_000"], "it has an underscore, got '1_000'"),
        ('{"hash_ids": [1]}\n', ["--capacity", "\u0663"], "it has a digit that is not ASCII"),
        (
            '{"hash_ids": [1]}\n',
            ["--capacity", str(10**19)],
            "capacity must be at most 4294967296 blocks",
        ),
        ('{"hash_ids": [1]}\n', ["--policy", "mru"], "invalid choice: 'mru'"),
        (
            '{"hash_ids": [1]}\n',
            ["--capacity", "1,,2"],
            "argument --capacity: '1,,2' has an empty item: one comma between each two values",
        ),
        (
            '{"hash_ids": [1]}\n',
            ["--policy", "lru,"],
            "argument --policy: 'lru,' has an empty item: one comma between each two values",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(
    tmp_path: Path, content: str | bytes | None, args: list[str], message: str
) -> None:
    trace = tmp_path / "trace.jsonl"
    if isinstance(content, bytes):
        trace.write_bytes(content)
    elif content is not None:
        trace.write_text(content)
    result = kvscope("replay", str(trace), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_trace_from_windows_tools_reads_as_any_other(tmp_path: Path) -> None:
    """A byte-order mark, CRLF line ends, and a lone CR (JSON whitespace) inside a line."""
    plain, windows = tmp_path / "plain.jsonl", tmp_path / "windows.jsonl"
    plain.write_bytes(b'{"hash_ids": [1, 2]}\n{"hash_ids": [1, 2, 3]}\n')
    windows.write_bytes(b'\xef\xbb\xbf{"hash_ids": [1, 2]}\r\n{"hash_ids": [1,\r2, 3]}\r\n')
    assert load_trace(windows) == load_trace(plain) == [[1, 2], [1, 2, 3]]


def test_a_device_is_refused_before_a_byte_is_held() -> None:
    result = kvscope("replay", "/dev/zero")
    assert result.returncode == 2
    assert "trace path is a device, not a file: /dev/zero" in result.stderr


def test_dash_with_standard_input_from_a_device_says_so() -> None:
    """It said "trace path is a device, not a file: -", as if "-" were a file's name."""
    with open(os.devnull, "rb") as null:
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "replay", "-"],
            stdin=null, capture_output=True, text=True, timeout=120, env=environment(),
        )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        "kvscope: error: - reads standard input, which is a terminal or a device (/dev/null), "
        "not a file or pipe: pipe a trace into it\n"
    )


def test_a_file_name_is_shown_on_one_line_with_its_control_characters_escaped(
    tmp_path: Path,
) -> None:
    name = tmp_path / "t\x1b[2J\nkvscope: forged.jsonl"
    result = kvscope("replay", str(name))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "\x1b" not in result.stderr
    assert "t\\x1b[2J\\nkvscope: forged.jsonl" in result.stderr


def test_a_line_or_a_trace_past_its_bound_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"hash_ids": [1, 2]}\n{"hash_ids": [' + "7, " * 40 + "7]}\n")
    monkeypatch.setattr(mooncake, "MAX_LINE_BYTES", 100)
    with pytest.raises(TraceError, match=r"trace.jsonl:2: a line longer than 100 bytes"):
        load_trace(trace)
    marked = tmp_path / "marked.jsonl"  # a byte-order mark counts toward its line's bound
    marked.write_bytes(b"\xef\xbb\xbf" + b'{"hash_ids": [1], "pad": "' + b"p" * 71 + b'"}\n')
    with pytest.raises(TraceError, match=r"marked.jsonl:1: a line longer than 100 bytes"):
        load_trace(marked)
    monkeypatch.setattr(mooncake, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(mooncake, "MAX_BLOCK_REFS", 10)
    with pytest.raises(TraceError, match=r"trace.jsonl:2: the trace passes 10 block references"):
        load_trace(trace)
    empty = tmp_path / "empty.jsonl"  # a request naming no block is held all the same
    empty.write_text('{"hash_ids": [1]}\n' + '{"hash_ids": []}\n' * 3)
    monkeypatch.setattr(mooncake, "MAX_REQUESTS", 3)
    with pytest.raises(TraceError, match=r"empty.jsonl:4: the trace passes 3 requests"):
        load_trace(empty)


def test_output_to_a_reader_that_went_away_ends_quietly() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "replay", "--json", "--policy", "lru",
         "--capacity", ",".join(map(str, range(100, 4000, 100)))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(1) == b"{"
    process.stdout.close()  # as `| head -c 1` does
    assert process.wait(timeout=120) == 141
    assert process.stderr.read() == b""


def test_a_plot_of_a_trace_whose_name_is_not_utf8_is_written_whole(tmp_path: Path) -> None:
    trace = tmp_path / os.fsdecode(b"bad\xffname.jsonl")
    trace.write_text('{"hash_ids": [1, 2]}\n{"hash_ids": [1, 2, 3]}\n')
    plot = tmp_path / "curves.html"
    result = kvscope("replay", str(trace), "--capacity", "1,2", "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    assert "kvscope replay: bad\\udcffname.jsonl" in plot.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["curves.html", trace.name])


def test_a_tier_larger_than_memory_allows_is_one_clear_line(trace_slice: Path) -> None:
    """A capacity within bounds that the process cannot hold (its address space capped at
    4 GiB here) fails with the policy and capacity named, not a traceback."""

    def cap_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", str(trace_slice), "--capacity", str(2**30)],
        capture_output=True, text=True, timeout=120, preexec_fn=cap_address_space,
    )  # fmt: skip
    assert result.returncode == 2
    assert "not enough memory for lru at 1073741824 blocks" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_demo_tier_larger_than_memory_allows_is_one_clear_line() -> None:
    """As for replay: `kvscope demo --capacity` within its bound but past what the process
    can hold (its address space capped at 8 GiB here: the demo loads torch) was a
    MemoryError traceback, exit 1."""

    def cap_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", "--port", "0", "--capacity", str(2**31),
         "--duration", "1"],
        capture_output=True, text=True, timeout=120, env=environment(),
        preexec_fn=cap_address_space,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "kvscope: error: not enough memory for lru at 2147483648 blocks: its bookkeeping "
        "grows with its capacity"
    )
    assert "Traceback" not in result.stderr


def test_a_trace_line_ends_at_a_newline_only(tmp_path: Path) -> None:
    """JSON strings may hold U+2028 and U+0085, which str.splitlines takes for line ends."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"note": "a\u2028b\x85c", "hash_ids": [1, 2]}\r\n{"hash_ids": [1]}\n')
    assert load_trace(trace) == [[1, 2], [1]]


def test_otel_variables_export_the_cores_spans(trace_slice: Path) -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "kvscope-test"}
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", str(trace_slice), "--capacity", "50"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requests"] == 300  # spans never reach stdout
    assert '"name": "kvscope.manager.prepare_store"' in result.stderr
    assert '"service.name": "kvscope-test"' in result.stderr
    assert '"kvscope.blocks.evicted"' in result.stderr


def test_an_unknown_otel_exporter_is_a_clear_error(trace_slice: Path) -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "zipkin-ish"}
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", str(trace_slice)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown exporter 'zipkin-ish'; kvscope knows: console, otlp, none" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "abc"},
         "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT must be a non-negative integer but got abc"),
        ({"OTEL_SPAN_EVENT_COUNT_LIMIT": "-1"},
         "OTEL_SPAN_EVENT_COUNT_LIMIT must be a non-negative integer but got -1"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE must be a positive integer"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "-5"}, "OTEL_BSP_SCHEDULE_DELAY must be positive"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "soon"},
         "OTEL_BSP_SCHEDULE_DELAY must be an integer, got 'soon'"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "16", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"},
         "OTEL_BSP_MAX_EXPORT_BATCH_SIZE must be less than or equal to OTEL_BSP_MAX_QUEUE_SIZE"),
        # The SDK took these: a traceback (OverflowError setting up its queue), and an
        # export thread that stopped at its first wait, dropping every span.
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "9223372036854775808"},
         "OTEL_BSP_MAX_QUEUE_SIZE must be at most 2147483647, got 9223372036854775808"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "1" + "0" * 30},
         "OTEL_BSP_SCHEDULE_DELAY must be at most 2147483647, got <an integer of more than "
         "19 digits>"),
    ],
)  # fmt: skip
def test_an_otel_value_the_sdk_refuses_is_one_line_naming_it(
    trace_slice: Path, variables: dict[str, str], message: str
) -> None:
    """The SDK raised (a traceback, exit 1), or logged a traceback and went on (``soon``)."""
    env = {"OTEL_TRACES_EXPORTER": "console", **variables}
    result = kvscope("replay", str(trace_slice), env=env)
    assert result.returncode == 2
    assert result.stderr == f"kvscope: error: {message}\n"


@pytest.mark.parametrize(
    "variables",
    [
        {"OTEL_BSP_SCHEDULE_DELAY": "soon" * 25_000},
        {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "abc" * 30_000},
        {"OTEL_TRACES_EXPORTER": "zipkin" * 15_000},
    ],
    ids=["not an integer", "refused by the SDK", "unknown exporter"],
)
def test_a_long_otel_value_is_named_in_one_short_line(
    trace_slice: Path, variables: dict[str, str]
) -> None:
    """The error printed the value whole: 100 kB of the variable on stderr."""
    result = kvscope(
        "replay", str(trace_slice), env={"OTEL_TRACES_EXPORTER": "console", **variables}
    )
    assert result.returncode == 2
    assert result.stderr.startswith("kvscope: error: OTEL_")
    assert len(result.stderr) < 600
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [["--help"], ["replay", "--capacity", "10"]])
def test_a_bad_otel_value_breaks_no_command_while_tracing_is_off(args: list[str]) -> None:
    """The SDK read the span limits as it was imported, and app.otel imported it first thing."""
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "abc"}
    result = kvscope(*args, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_serve_starts_without_loading_torch() -> None:
    """`kvscope serve` is the sidecar image's command, and the image has no torch."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "app.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--connect" in result.stdout
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "app.server" in imported or "app.cli" in imported
    assert not any(name == "torch" or name.startswith("torch.") for name in imported)


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`kvscope serve` with no KVSCOPE_* setting but those given."""
    return kvscope("serve", *args, env=env)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--listen", "5557"], {},
         "--listen / KVSCOPE_LISTEN: '5557' is not a ZMQ endpoint to bind: the transport must "
         "be tcp:// or ipc:// (expected tcp://HOST:PORT, e.g. tcp://*:5557"),
        ([], {"KVSCOPE_LISTEN": "tcp://*:70000"},
         "--listen / KVSCOPE_LISTEN: 'tcp://*:70000' is not a ZMQ endpoint to bind: the port "
         "'70000' is not a number from 0 to 65535"),
        ([], {"KVSCOPE_CONNECT": "tcp://engine-0..svc:5557"},
         "--connect / KVSCOPE_CONNECT: 'tcp://engine-0..svc:5557' is not a ZMQ endpoint to "
         "connect to: 'engine-0..svc' is not a host name or IP address"),
        (["--connect", "tcp://e:1", "--replay", "ipc:///" + "r" * 107], {},
         "--replay / KVSCOPE_REPLAY: 'ipc:///" + "r" * 107 + "' is not a ZMQ endpoint to "
         "connect to: the ipc path is 108 bytes, more than the 107 a unix socket address "
         "holds"),
        (["--listen", "tcp://*:5557"], {"KVSCOPE_LISTEN_ALLOW": "10.0.0.0/8,engine"},
         "KVSCOPE_LISTEN_ALLOW: 'engine' is not an IP network "
         "(expected an address or ADDRESS/PREFIX"),
        (["--listen", "tcp://*:5557", "--listen-replay", "vllm-gpu=tcp://engine:5558"], {},
         "--listen-replay / KVSCOPE_LISTEN_REPLAY: 'vllm-gpu' is not a stream name"),
        ([], {}, "settings: no publisher to read: give connect (--connect"),
        (["--connect", "tcp://127.0.0.1:1", "--connect", "tcp://127.0.0.1:1"], {},
         "--connect / KVSCOPE_CONNECT: 'tcp://127.0.0.1:1' is listed twice"),
        (["--connect", "foo://engine:5557"], {},
         "--connect / KVSCOPE_CONNECT: 'foo://engine:5557' is not a ZMQ endpoint"),
        ([], {"KVSCOPE_CONNECT": "[" * 100_000},
         "--connect / KVSCOPE_CONNECT: a JSON list nested too deeply"),
        ([], {"KVSCOPE_CONNECT": '["tcp://127.0.0.1:1", 2]'},
         "--connect / KVSCOPE_CONNECT: item 2: Input should be a valid string"),
        ([], {"KVSCOPE_CONNECT": '["tcp://127.0.0.1:1", tcp://127.0.0.1:2]'},
         "--connect / KVSCOPE_CONNECT: starts with '[' but is not a JSON list "
         "(Expecting value at character 23); give a JSON list of strings or comma-separated "
         "values"),
        (["--connect", "tcp://127.0.0.1:59002", "--listen", "tcp://127.0.0.1:59002"], {},
         "settings: tcp://127.0.0.1:59002 (KVSCOPE_CONNECT) reaches tcp://127.0.0.1:59002 "
         "(KVSCOPE_LISTEN): the sidecar would read its own socket"),
        (["--connect", "tcp://127.0.0.1:1"], {"KVSCOPE_MAX_MESSAGE_BYTES": str(2**40)},
         "KVSCOPE_MAX_MESSAGE_BYTES: Input should be less than or equal"),
        (["--connect", "tcp://127.0.0.1:1"], {"KVSCOPE_RECEIVE_BUFFER_BYTES": str(2**50)},
         "KVSCOPE_RECEIVE_BUFFER_BYTES: Input should be less than"),
        (["--connect", "tcp://127.0.0.1:1"], {"KVSCOPE_PEER_TIMEOUT_S": "0.5"},
         "KVSCOPE_PEER_TIMEOUT_S: Input should be greater than or equal to 1"),
    ],
)  # fmt: skip
def test_serve_refuses_a_bad_listen_setting_in_one_line_naming_it(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = serve(*args, env=env)
    assert result.returncode == 2
    assert f"kvscope: error: {message}" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("command", "env", "message"),
    [
        (["serve", "--connect", "tcp://127.0.0.1:1"], {"KVSCOPE_MAX_BLOCKS": "0"},
         "KVSCOPE_MAX_BLOCKS: Input should be greater than or equal to 1"),
        (["serve", "--connect", "tcp://127.0.0.1:1"], {"KVSCOPE_TOKEN": " "},
         "--token / KVSCOPE_TOKEN: token must not be blank (unset it to disable "
         "authentication)"),
        (["demo", "--duration", "1"], {"KVSCOPE_TOKEN": " "},
         "KVSCOPE_TOKEN: token must not be blank (unset it to disable "
         "authentication)"),
    ],
    ids=["serve-variable-only", "serve-flag", "demo-variable-only"],
)  # fmt: skip
def test_a_bad_setting_names_a_flag_only_where_the_command_has_one(
    command: list[str], env: dict[str, str], message: str
) -> None:
    """`--max-blocks / KVSCOPE_MAX_BLOCKS` named a flag neither command has (argparse refuses
    it), and `demo` was told of a `--token` it does not take."""
    result = kvscope(*command, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == f"kvscope: error: {message}"


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("s3cret-token\n",
         "token starts or ends with whitespace, which HTTP strips from a header: no "
         "Authorization header can carry it (a trailing newline from a secret file?)"),
        (" s3cret-token",
         "token starts or ends with whitespace, which HTTP strips from a header: no "
         "Authorization header can carry it (a trailing newline from a secret file?)"),
        ("s3cret\x1b-token",
         "token has a character no Authorization header carries as it is (character 7, "
         "U+001B): use printable ASCII only"),
        ("s3crét-token",
         "token has a character no Authorization header carries as it is (character 5, "
         "U+00E9): use printable ASCII only"),
    ],
    ids=["trailing-newline", "leading-space", "escape", "not-ascii"],
)  # fmt: skip
def test_a_token_no_header_can_carry_is_refused_at_start_without_showing_it(
    token: str, problem: str
) -> None:
    """A token from a secret file with its trailing newline started a sidecar that answered
    every client 401: HTTP strips the newline from `Authorization: Bearer ...`, so no header
    matched. Refused at start-up, saying where, never what the token is."""
    result = serve("--connect", "tcp://127.0.0.1:1", env={"KVSCOPE_TOKEN": token})
    assert result.returncode == 2
    assert result.stderr.strip() == f"kvscope: error: --token / KVSCOPE_TOKEN: {problem}"
    assert "s3cr" not in result.stderr


@pytest.mark.parametrize("command", [["serve", "--connect", "tcp://127.0.0.1:1"], ["demo"]])
def test_a_kvscope_variable_that_names_no_setting_is_warned_of(command: list[str]) -> None:
    """A misspelt variable was ignored in silence: ``KVSCOPE_TOKN=secret`` served the API to
    anyone, with nothing said. Each one is named on a line of its own, with the setting it is
    nearest to, or none where none is near. (The bad ``KVSCOPE_MAX_BLOCKS`` ends the command
    before it serves.)"""
    env = {
        "KVSCOPE_TOKN": "secret", "KVSCOPE_FROBNICATE": "1", "KVSCOPE_ARTEFACTS": "/tmp",
        "KVSCOPE_MAX_BLOCKS": "0",
    }  # fmt: skip
    result = kvscope(*command, env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "kvscope: warning: KVSCOPE_ARTEFACTS is not a setting; ignored",
        "kvscope: warning: KVSCOPE_FROBNICATE is not a setting; ignored",
        "kvscope: warning: KVSCOPE_TOKN is not a setting; ignored (did you mean KVSCOPE_TOKEN?)",
        "kvscope: error: KVSCOPE_MAX_BLOCKS: Input should be greater than or equal to 1",
    ]


def test_unrecognized_arguments_are_named_on_one_escaped_line() -> None:
    """They were echoed as given: a newline in one wrote a line of its own, an escape
    sequence reached the terminal, and a long one was printed whole."""
    result = kvscope("replay", "a.jsonl", "b\n\x1b[31mkvscope: error: forged", "c" * 300)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "kvscope: error: unrecognized arguments: b\\n\\x1b[31mkvscope: error: forged "
        + "c" * 170
        + "…"
    )


def test_an_unknown_flag_before_the_command_is_named() -> None:
    """``kvscope --bogus`` said only that a COMMAND is required, never naming the flag."""
    result = kvscope("--bogus")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "kvscope: error: unrecognized arguments: --bogus"
    no_command = kvscope()
    assert no_command.returncode == 2
    assert no_command.stderr.splitlines()[-1] == (
        "kvscope: error: the following arguments are required: COMMAND"
    )


def test_demo_help_names_every_default() -> None:
    """``demo --help`` named the defaults of --port and --sample-rate but not of --policy,
    --capacity, --rate or --duration, which the README's usage line gives."""
    result = kvscope("demo", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    defaults = (
        "eviction policy (default lru)", "in blocks (default 2000)",
        "per second (default 200)", "(default: run until Ctrl-C or SIGTERM)",
    )  # fmt: skip
    for default in defaults:
        assert default in text, default


def test_version_prints_the_installed_version() -> None:
    """``kvscope --version`` was refused as a missing COMMAND."""
    result = kvscope("--version")
    assert result.returncode == 0
    assert result.stdout == f"kvscope {importlib.metadata.version('kvscope')}\n"


def test_serve_names_a_listen_endpoint_it_cannot_bind() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        result = serve("--listen", endpoint, "--port", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"kvscope: error: --listen / KVSCOPE_LISTEN: cannot bind '{endpoint}': "
        "Address already in use"
    )


def test_serve_refuses_a_listen_name_zmq_binds_nothing_for_as_it_starts() -> None:
    endpoint = "tcp://no-such-host.invalid:5557"
    result = serve("--listen", endpoint, "--port", "0")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"kvscope: error: --listen / KVSCOPE_LISTEN: '{endpoint}' cannot be bound on this host: "
        "ZMQ binds no address for its host ("
    )


NOT_A_NUMBER = "must be a decimal number such as 2, 0.5 or 1e-05"


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ("0", "rate must be above 0 and finite"),
        ("1e400", "rate must be above 0 and finite"),
        ("-5", "rate must be above 0 and finite"),
        ("+5", f"rate {NOT_A_NUMBER} (ASCII digits; no plus sign, space, underscore, inf or "
         "nan): it has a plus sign"),
        ("nan", f"rate {NOT_A_NUMBER}"),
        ("inf", f"rate {NOT_A_NUMBER}"),
        ("1_0", f"rate {NOT_A_NUMBER}"),
        ("\u0663", f"rate {NOT_A_NUMBER}"),
    ],
)  # fmt: skip
def test_demo_refuses_a_rate_that_paces_nothing(rate: str, message: str) -> None:
    """0 divided by zero in the worker thread, and the demo still exited 0; the others ran
    unpaced (or, ``1_0`` and Arabic-Indic digits, were taken for numbers)."""
    result = kvscope("demo", "--rate", rate, "--duration", "1")
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_at_a_rate_whose_pause_passes_the_clocks_range_runs_and_stops_quietly() -> None:
    """At 1e-300 requests a second the worker's pause after its first request (1e300 s) is
    more than a thread can wait: its thread died in a traceback, and the demo served on
    without a worker."""
    result = kvscope("demo", "--port", "0", "--rate", "1e-300", "--duration", "1")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


FAILING_DEMO = """
import sys
from app.cli import main
from offload.sim.demo_worker import DemoWorker
def fail(self, block_hashes):
    raise RuntimeError("the stand-in GPU failed")
DemoWorker.step = fail  # the one fault put in: the worker's request step
sys.exit(main(["demo", "--port", "0", "--duration", "60"]))
"""


def test_demo_whose_worker_fails_stops_with_its_error_on_one_line() -> None:
    """Its worker thread died in a traceback and the demo served the last figures on, then
    exited 0."""
    result = subprocess.run(
        [sys.executable, "-c", FAILING_DEMO],
        capture_output=True, text=True, timeout=120, env=environment(),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "kvscope: error: the demo worker stopped: RuntimeError: the stand-in GPU failed"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ("1.5", "sample rate must be 0 or in [1e-06, 1], got 1.5"),
        ("6e-10", "sample rate must be 0 or in [1e-06, 1], got 6e-10"),
    ],
)
def test_demo_refuses_a_sample_rate_its_test_cannot_keep(rate: str, message: str) -> None:
    """Below 1e-06 the sampling test keeps a share of the blocks far from the rate (none
    below 4.7e-10), while the curve corrects by the rate as given."""
    result = kvscope("demo", "--sample-rate", rate, "--duration", "1")
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("duration", "message"),
    [
        ("0", "duration must be above 0 and at most 31536000 seconds"),
        ("1e300", "duration must be above 0 and at most 31536000 seconds"),
        ("-5", "duration must be above 0 and at most 31536000 seconds"),
        ("nan", f"duration {NOT_A_NUMBER}"),
        ("inf", f"duration {NOT_A_NUMBER}"),
    ],
)
def test_demo_refuses_a_duration_it_cannot_wait(duration: str, message: str) -> None:
    """inf and 1e300 overflowed the wait (a traceback); nan, 0 and -5 stopped at once, exit 0."""
    result = kvscope("demo", "--duration", duration)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_refuses_a_gpu_capacity_below_one_block() -> None:
    result = kvscope("demo", "--gpu-capacity", "0", "--duration", "1")
    assert result.returncode == 2
    assert "capacity must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr


SIDECAR_COMMANDS = {"serve": ["serve", "--connect", "tcp://127.0.0.1:5557"], "demo": ["demo"]}


@pytest.mark.parametrize("command", SIDECAR_COMMANDS.values(), ids=SIDECAR_COMMANDS)
def test_a_taken_http_port_is_one_line_naming_the_port(command: list[str]) -> None:
    """uvicorn bound it when serving began: `serve` ended with its log and status 3, `demo`
    with a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = kvscope(*command, env={"KVSCOPE_PORT": str(port)})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"kvscope: error: --port / KVSCOPE_PORT: cannot bind 127.0.0.1:{port}: "
        "Address already in use"
    )


@pytest.mark.parametrize("command", SIDECAR_COMMANDS.values(), ids=SIDECAR_COMMANDS)
@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("no-such-host.invalid", "cannot resolve 'no-such-host.invalid': "),
        ("192.0.2.1", "cannot bind 192.0.2.1:0: Cannot assign requested address"),
        ("h" * 64, f"cannot resolve '{'h' * 64}': encoding with 'idna' codec failed"),
        ("a." * 50_000, "cannot resolve 'a.a.a."),
    ],
    ids=["unresolvable", "not-this-machines", "label-too-long", "100-kB"],
)
def test_a_host_the_sidecar_cannot_bind_is_one_line_naming_the_host(
    command: list[str], host: str, problem: str
) -> None:
    result = kvscope(*command, "--host", host, "--port", "0")
    assert result.returncode == 2
    assert result.stderr.startswith(f"kvscope: error: --host / KVSCOPE_HOST: {problem}")
    assert result.stderr.count("\n") == 1 and len(result.stderr) < 500, result.stderr[:500]


def serving(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``kvscope serve`` on a free port, its stderr piped for the caller to read."""
    command = ["serve", "--connect", "tcp://127.0.0.1:5557", "--port", "0"]
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment(env),
    )  # fmt: skip


def test_ctrl_c_stops_serve_quietly_with_status_130() -> None:
    """uvicorn shut down cleanly, then the interrupt it passed on ended in a traceback."""
    with serving() as process:
        assert process.stderr is not None
        for line in process.stderr:
            if "Uvicorn running on" in line:
                break
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "Finished server process" in stderr


def test_sigterm_stops_serve_with_status_0_once_its_spans_are_exported() -> None:
    """uvicorn raises SIGTERM again once it has drained, and its default action killed the
    process there (status -15, 143 in a shell) before the ingestor was closed and before the
    OpenTelemetry SDK exported the spans it held: FastAPI's, one per request."""
    # Nothing exported before the stop: the request's spans are still held as the signal comes.
    otel = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": str(MAX_BSP_VALUE)}
    with serving(otel) as process:
        assert process.stderr is not None
        for line in process.stderr:
            if "Uvicorn running on" in line:
                url = line.split("running on ", 1)[1].split()[0]
                break
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as answer:
            assert answer.status == 200
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert '"name": "GET /healthz"' in stderr, stderr
    assert "Traceback" not in stderr


def test_a_second_ctrl_c_during_the_drain_stops_serve_quietly_with_status_130() -> None:
    """uvicorn invites it ("CTRL+C to force quit") and then skipped the app's shutdown: its
    lifespan task, left waiting, was cancelled as the event loop closed, and uvicorn logged
    a traceback for it, every time."""
    with serving() as process:
        assert process.stderr is not None
        for line in process.stderr:
            if "Uvicorn running on" in line:
                process.send_signal(signal.SIGINT)
            if "Shutting down" in line:  # the drain then sleeps 0.1 s before it goes on
                process.send_signal(signal.SIGINT)
                break
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert "Finished server process" in stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_demo_on_every_address_prints_a_url_this_machine_can_open(host: str) -> None:
    """It printed ``http://0.0.0.0:PORT/``, which Chrome refuses to open, and
    ``http://[::]:PORT/``, which every browser refuses."""
    if host == "::" and not socket.has_ipv6:
        pytest.skip("this machine has no IPv6")
    command = ["demo", "--host", host, "--port", "0"]
    with subprocess.Popen(
        [sys.executable, "-m", "app.cli", *command],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment(),
    ) as process:  # fmt: skip
        assert process.stdout is not None
        line = process.stdout.readline()
        try:
            url = line.split("open ", 1)[1].split("/ (", 1)[0]
            with urllib.request.urlopen(f"{url}/healthz", timeout=30) as answer:
                status = answer.status
        finally:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
    loopback = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
    assert url.startswith(f"http://{loopback}:"), line
    assert status == 200
    assert process.returncode == 0


def test_a_trace_piped_to_dash_replays_as_the_file_does(trace_slice: Path) -> None:
    """``zcat trace.gz | kvscope replay -`` was "trace file not found: -"."""

    def replay(trace: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "app.cli", "replay", trace, "--capacity", "200", "--json"],
            input=stdin, capture_output=True, timeout=120, env=environment(),
        )  # fmt: skip

    piped = replay("-", trace_slice.read_bytes())
    assert piped.returncode == 0, piped.stderr
    read = json.loads(replay(str(trace_slice), b"").stdout)
    totals = json.loads(piped.stdout)
    assert totals["trace"] == "-"
    assert {k: totals[k] for k in ("requests", "block_refs", "hits")} == {
        k: read[k] for k in ("requests", "block_refs", "hits")
    }
    malformed = replay("-", b'{"hash_ids": [1]}\n{"hash_ids": [1, 2\n')
    assert malformed.returncode == 2
    assert malformed.stderr.decode().startswith("kvscope: error: -:2: not valid JSON")


def closing(fd: int) -> subprocess.Popen[str]:
    """`kvscope serve` started with descriptor ``fd`` closed (``>&-``), its other output on
    a pipe."""
    command = ["serve", "--connect", "tcp://127.0.0.1:5557", "--port", "0"]
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
        preexec_fn=lambda: os.close(fd),
    )  # fmt: skip


def test_serve_started_with_standard_output_closed_serves() -> None:
    """Python then has no ``sys.stdout``, and uvicorn's log set-up failed on it: a
    traceback and status 1, before serving."""
    with closing(1) as process:
        assert process.stderr is not None
        for line in process.stderr:
            if "Uvicorn running on" in line:
                process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("fd", [1, 2], ids=["stdout", "stderr"])
def test_replay_started_with_an_output_closed_writes_the_other(fd: int) -> None:
    """As Python's own print does, the closed one's lines go nowhere; it ended in a traceback
    and status 1 instead."""
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", "--capacity", "200,400"],
        capture_output=True, text=True, timeout=120, env=environment(),
        preexec_fn=lambda: os.close(fd),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.count("\n") == (2 if fd == 2 else 0), result.stdout


def test_replay_of_dash_with_standard_input_closed_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", "-"],
        capture_output=True, text=True, timeout=120, env=environment(),
        preexec_fn=lambda: os.close(0),
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == "kvscope: error: cannot read trace -: standard input is closed\n"


def test_sigterm_stops_replay_with_status_143_once_its_spans_are_exported() -> None:
    """It died by the signal (status -15) where it was, the spans the OpenTelemetry SDK held
    never exported. Two come, microseconds apart, as `timeout` sends them."""
    # Nothing exported before the stop: one span in a hundred is kept, fewer than the batch
    # that would be exported at once, and the timer that would export them never fires.
    otel = {
        "OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": str(MAX_BSP_VALUE),
        "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01",
    }  # fmt: skip
    command = ["replay", "--capacity", "100,200,400,800,1600,3200,6400,12800", "--json"]
    with subprocess.Popen(
        [sys.executable, "-m", "app.cli", *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(otel),
    ) as process:  # fmt: skip
        assert process.stdout is not None
        first = process.stdout.readline()  # one capacity replayed, seven to go
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        rest, stderr = process.communicate(timeout=60)
    assert json.loads(first)["capacity"] == 100
    assert process.returncode == 143, stderr[-2000:]
    assert '"name": "kvscope.manager.prepare_store"' in stderr
    assert "Traceback" not in stderr
    assert rest.count("\n") < 7


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_removes_its_url_file_as_it_stops(tmp_path: Path, stop: signal.Signals) -> None:
    """It was left naming a port no longer served, and a reader waiting for the next
    sidecar's file took that one at once."""
    url_file = tmp_path / "url"
    command = ["serve", "--connect", "tcp://127.0.0.1:5557", "--port", "0"]
    with subprocess.Popen(
        [sys.executable, "-m", "app.cli", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=environment({"KVSCOPE_URL_FILE": str(url_file)}),
    ) as process:  # fmt: skip
        assert process.stderr is not None
        for line in process.stderr:
            if "Uvicorn running on" in line:  # the file is written next, stopping or not
                process.send_signal(stop)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == (0 if stop == signal.SIGTERM else 130), stderr
    assert "URL file" not in stderr
    assert list(tmp_path.iterdir()) == []
