"""The ``kvscope`` console script as pip writes it: the entry point pyproject.toml names,
imported and called, in a real process."""

from __future__ import annotations

import signal
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def script() -> str:
    """What pip's ``kvscope`` script runs: pyproject.toml's entry point, imported, then called."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kvscope"]
    module, function = entry.split(":")
    return f"import sys; from {module} import {function}; sys.exit({function}())"


def test_ctrl_c_while_the_command_still_imports_exits_130_quietly() -> None:
    """The script imported ``app.cli`` (about half a second: pydantic, FastAPI, uvicorn)
    before any of kvscope's code ran, and Ctrl-C then printed Python's KeyboardInterrupt
    traceback. Two come, microseconds apart, as ``timeout -s INT`` sends them."""
    # -X importtime writes a line as each module is imported: the signals come once
    # pydantic is, at the start of app.cli's imports, far from their end.
    with subprocess.Popen(
        [sys.executable, "-X", "importtime", "-c", script(), "replay", "--capacity", "200"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    ) as process:  # fmt: skip
        assert process.stderr is not None
        for line in process.stderr:
            if line.rsplit("|", 1)[-1].strip() == "pydantic":
                process.send_signal(signal.SIGINT)
                process.send_signal(signal.SIGINT)
                break
        _, stderr = process.communicate(timeout=60)
    messages = [line for line in stderr.splitlines() if not line.startswith("import time:")]
    assert process.returncode == 130, stderr[-2000:]
    assert messages == []
