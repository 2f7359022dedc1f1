"""A benchmark's help says what its TRACE arguments add to: "more traces" named no base."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("benchmark", ["bench.policy_hit_ratio", "bench.vllm_connector_hits"])
def test_the_help_says_the_bundled_trace_always_runs(benchmark: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", benchmark, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    assert "after the bundled one, which always runs" in " ".join(done.stdout.split())
