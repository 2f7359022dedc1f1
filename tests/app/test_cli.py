"""The replay command end to end, as a user runs it: a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload import CPUOffloadingManager
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE, load_trace
from offload.sim.workload import run_workload


def kvscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
    )


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
        ('{"hash_ids": [1, "x"]}\n', [], ":1: 'hash_ids' must hold integers only"),
        ("[1, 2]\n", [], ":1: expected a JSON object"),
        ('{"input_length": 3}\n', [], ":1: missing 'hash_ids' list"),
        ("\n\n", [], "holds no requests"),
        ('{"hash_ids": [1]}\n', ["--capacity", "0"], "capacity must be at least 1"),
        ('{"hash_ids": [1]}\n', ["--capacity", "many"], "capacity must be a whole number"),
        ('{"hash_ids": [1]}\n', ["--policy", "mru"], "invalid choice: 'mru'"),
    ],
)
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(
    tmp_path: Path, content: str | None, args: list[str], message: str
) -> None:
    trace = tmp_path / "trace.jsonl"
    if content is not None:
        trace.write_text(content)
    result = kvscope("replay", str(trace), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


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
