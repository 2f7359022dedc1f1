"""The benchmarks that take trace files read them all before running anything.

A bad trace named after good ones used to end the run with a traceback once
the ones before it (and the bundled trace, minutes of replays) had run; now it
is the parser's one-line error, exit 2, before any figure is printed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip


def modules() -> list[str]:
    names = ["policy_hit_ratio --no-peer"]
    try:
        import vllm  # noqa: F401
    except ImportError:
        return names
    return [*names, "vllm_connector_hits"]


@pytest.mark.parametrize("command", modules())
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "trace file not found"),
        ('{"hash_ids": [0, 1]}\n{"hash_ids": [0, 18446744073709551616]}\n', ":2: hash_ids[1] is"),
        ('{"hash_ids": "0 1"}\n', ":1: 'hash_ids' must be a list, got a string"),
    ],
)
def test_a_bad_trace_stops_the_benchmark_before_it_runs(
    tmp_path: Path, command: str, content: str | None, message: str
) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"hash_ids": [0, 1, 2]}\n')
    bad = tmp_path / "bad.jsonl"
    if content is not None:
        bad.write_text(content)
    module, *flags = command.split()
    result = bench(module, *flags, str(good), str(bad))
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert str(bad) in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_the_connector_benchmark_names_the_policies_it_knows() -> None:
    pytest.importorskip("vllm")
    result = bench("vllm_connector_hits", "--policy", "mru")
    assert result.returncode == 2
    assert "invalid choice: 'mru'" in result.stderr
    assert "gated" in result.stderr


def test_halves_without_block_references_are_skipped_not_divided_by(tmp_path: Path) -> None:
    """A trace of one request has an empty first half: --halves divided by its zero block
    references, a traceback after the bundled trace's minutes of replays."""
    from bench.policy_hit_ratio import _workloads

    one = tmp_path / "one.jsonl"
    names = [name for name, _, _ in _workloads([(one, [[1, 2]])], True, tmp_path)]
    assert str(one) in names and f"{one}:second-half" in names
    assert f"{one}:first-half" not in names


def test_traces_of_one_name_in_two_folders_keep_their_rows_apart(tmp_path: Path) -> None:
    """Rows carried a trace's file name only: a/t.jsonl and b/t.jsonl read as one trace."""
    from bench.policy_hit_ratio import _workloads

    traces = [(tmp_path / folder / "t.jsonl", [[1, 2]]) for folder in ("a", "b")]
    names = [name for name, _, _ in _workloads(traces, False, tmp_path)]
    assert names == ["bundled", str(traces[0][0]), str(traces[1][0])]


def test_the_peer_reads_the_very_requests_kvscope_replays(tmp_path: Path) -> None:
    """The peer (vLLM's manager, in its own interpreter) was handed the named file to read
    with a reader of its own: a byte-order mark failed it (every peer row missing), a lone
    CR split a line in two, and a pipe (``<(zcat t.gz)``) or a file since removed was gone."""
    from bench.policy_hit_ratio import _workloads
    from bench.tooling.peer_workload import load_keys
    from offload.sim.mooncake import load_trace

    windows = tmp_path / "windows.jsonl"
    windows.write_bytes(b'\xef\xbb\xbf{"hash_ids": [1, 2]}\r\n{"hash_ids": [1,\r2, 3]}\r\n')
    requests = load_trace(windows)
    windows.unlink()  # as a pipe's bytes are gone once read
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    workloads = _workloads([(windows, requests)], True, scratch)
    named = [w for w in workloads if not w[0].startswith("bundled")]
    assert [name for name, _, _ in named] == [
        str(windows), f"{windows}:first-half", f"{windows}:second-half"
    ]  # fmt: skip
    for _, path, part in named:
        keys = load_keys(path, lambda key, group: key)
        assert keys == [[h.to_bytes(8, "big") for h in r] for r in part]
