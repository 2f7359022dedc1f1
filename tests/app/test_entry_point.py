"""The ``kvscope`` console script as pip writes it (the entry point pyproject.toml names,
imported and called) and ``python -m app.cli``, in a real process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def script() -> str:
    """What pip's ``kvscope`` script runs: pyproject.toml's entry point, imported, then called."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kvscope"]
    module, function = entry.split(":")
    return f"import sys; from {module} import {function}; sys.exit({function}())"


FORMS = {
    "script": ["-c", script()],
    "python -m app.cli": ["-m", "app.cli"],
    "python app/cli.py": ["app/cli.py"],
}
"""The ways the command is started, as interpreter arguments (a file path has no module
spec: its name is app.cli all the same)."""


def importing(form: list[str], *args: str) -> subprocess.Popen[str]:
    """The command, started with -X importtime, which writes a line to stderr as each module's
    import ends: the lines tell the caller how far the process has come."""
    return subprocess.Popen(
        [sys.executable, "-X", "importtime", *form, *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def messages(stderr: str) -> list[str]:
    """What the process wrote to stderr besides -X importtime's lines."""
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS)
def test_ctrl_c_while_the_command_still_imports_exits_130_quietly(form: list[str]) -> None:
    """The script imported ``app.cli`` (about half a second: pydantic, FastAPI, uvicorn)
    before any of kvscope's code ran, and Ctrl-C then printed Python's KeyboardInterrupt
    traceback; ``python -m app.cli`` did so until it started under the script's ``quiet_start``.
    Two come, microseconds apart, as ``timeout -s INT`` sends them."""
    # The signals come once pydantic is imported, at the start of app.cli's imports, far
    # from their end.
    with importing(form, "replay", "--capacity", "200") as process:
        assert process.stderr is not None
        for line in process.stderr:
            if line.rsplit("|", 1)[-1].strip() == "pydantic":
                process.send_signal(signal.SIGINT)
                process.send_signal(signal.SIGINT)
                break
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-2000:]
    assert messages(stderr) == []


DELAYS_S = [i * 0.0005 for i in range(8)]
"""When Ctrl-C comes after app.cli is imported: 0 to 3.5 ms, while the arguments are parsed
(a few milliseconds) before ``replay`` takes the signal over."""


def spin(seconds: float) -> None:
    """Busy-wait ``seconds``: a sleep this short would last far longer."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_ctrl_c_as_the_arguments_are_parsed_exits_130_quietly() -> None:
    """The entry point put Python's own handler back once ``app.cli`` was imported, and the
    command parsed its arguments under it: Ctrl-C there printed a traceback (in 5 tries of
    these 8 here). ``python -m app.cli`` starts under the same ``quiet_start`` (the test
    above)."""
    for delay in DELAYS_S:
        with importing(FORMS["script"], "replay", "--capacity", "200") as process:
            assert process.stderr is not None
            for line in process.stderr:
                if line.rsplit("|", 1)[-1].strip() == "app.cli":
                    spin(delay)
                    process.send_signal(signal.SIGINT)
                    break
            _, stderr = process.communicate(timeout=60)
        assert (process.returncode, messages(stderr)) == (130, []), delay
