"""``bench.insight_accuracy``'s list flags refuse a value by name before any replay.

``--rates 0`` and ``--policies foo`` ran the exact sweep and then ended in a traceback,
and ``--rates abc`` was "invalid _floats value", the name of a function.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rates", "0"], "argument --rates: a sampling rate must be above 0 and at most 1, "
         "got 0"),
        (["--rates", "0.05,1.5"], "argument --rates: a sampling rate must be above 0 and at "
         "most 1, got 1.5"),
        (["--rates", "abc"], "argument --rates: a sampling rate must be a decimal number"),
        (["--shares", "0.25,0"], "argument --shares: a share must be above 0, got 0"),
        (["--policies", "lru,foo"], "argument --policies: unknown policy 'foo' (choose from "
         "lru, arc, gated, opt)"),
    ],
)  # fmt: skip
def test_a_bad_list_value_is_refused_by_name_before_any_replay(
    flags: list[str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.insight_accuracy", *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
