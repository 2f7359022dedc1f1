"""A benchmark run with a bad flag: refused by argparse's status, naming the flag, before
any run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def assert_refused_before_any_run(command: list[str], message: str) -> None:
    """``python -m *command`` exits 2 with ``message`` on stderr, no traceback and no output."""
    done = subprocess.run(
        [sys.executable, "-m", *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
