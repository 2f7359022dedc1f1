"""A peer replay that fails is a row left out with its reason, never a traceback; an
interpreter that cannot run at all is refused before the first replay.

The benchmarks run vLLM's manager in a separate environment; what that process
does is out of their hands, so each way it can end without a result (an error
exit, an exit that printed nothing, a last line that is no JSON) is tried here
with a real process in the peer interpreter's place.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bench.tooling.common import run_peer

ROOT = Path(__file__).resolve().parents[2]


def interpreter(tmp_path: Path, body: str) -> Path:
    """An executable that stands where the peer's python would, running ``body`` (sh)."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("echo 'no module named vllm' >&2; exit 1", "no module named vllm"),
        ("exit 0", "exit 0, nothing printed"),
        ("echo 'Killed'", "printed 'Killed'"),
    ],
)
def test_a_peer_without_a_result_is_left_out_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, reason: str
) -> None:
    peer = interpreter(tmp_path, body)
    assert run_peer(peer, tmp_path / "trace.jsonl", "lru", 100, 1) is None
    assert f"peer failed (lru, 100): {reason}" in capsys.readouterr().err


def test_a_peers_last_json_line_is_its_result(tmp_path: Path) -> None:
    peer = interpreter(tmp_path, """echo 'warming up'; echo '{"hit_ratio": 0.5}'""")
    assert run_peer(peer, tmp_path / "trace.jsonl", "lru", 100, 1) == {"hit_ratio": 0.5}


@pytest.mark.parametrize("benchmark", ["bench.policy_hit_ratio", "bench.hot_path"])
@pytest.mark.parametrize(
    ("peer", "reason"),
    [("missing/python", "no such file: "), ("trace.jsonl", "not executable: ")],
)
def test_a_peer_interpreter_that_cannot_run_is_refused_before_any_replay(
    tmp_path: Path, benchmark: str, peer: str, reason: str
) -> None:
    (tmp_path / "trace.jsonl").write_text('{"hash_ids": [1]}\n')
    given = tmp_path / peer
    done = subprocess.run(
        [sys.executable, "-m", benchmark, "--peer-python", str(given)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"argument --peer-python: {reason}{given}" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
