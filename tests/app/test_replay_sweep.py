"""`kvscope replay` over several policies and capacities, as a user runs it: real processes.

Piped, it prints one JSON line per (policy, capacity) with the fields scripts
read; on a terminal (a pseudo-terminal here) a table, and a progress bar on
stderr for long replays.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from offload import CPUOffloadingManager
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE, load_trace
from offload.sim.optimum import offline_hits
from offload.sim.workload import run_workload

FIELDS = {"trace", "policy", "capacity", "requests", "block_refs", "hits", "seconds",
          "hit_ratio", "blocks_per_s"}  # fmt: skip


def kvscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
    )


def on_a_terminal(*args: str, stderr_tty: bool = False) -> tuple[int, str, str]:
    """Run with stdout (and stderr, if asked) on a pseudo-terminal; returns (status, out, err)."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", *args], stdout=secondary,
        stderr=secondary if stderr_tty else subprocess.PIPE,
    )  # fmt: skip
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: the process is done with it
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    err = process.stderr.read().decode() if process.stderr else ""
    return process.wait(timeout=120), b"".join(chunks).decode(), err


def test_piped_it_prints_one_json_line_per_policy_and_capacity(trace_slice: Path) -> None:
    result = kvscope("replay", str(trace_slice), "--capacity", "400,100", "--policy", "lru,opt")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["policy"], line["capacity"]) for line in lines] == [
        ("lru", 100), ("lru", 400), ("opt", 100), ("opt", 400)
    ]  # fmt: skip
    assert all(set(line) == FIELDS for line in lines)
    requests = load_trace(trace_slice)
    lru = run_workload(CPUOffloadingManager(BUNDLED_TRACE_BLOCK_SIZE, 100, "lru"), requests)
    assert lines[0]["hits"] == lru.hits
    assert lines[2]["hits"] == offline_hits(requests, 100) >= lru.hits


def test_on_a_terminal_it_prints_a_table_with_each_rows_share_of_opt(trace_slice: Path) -> None:
    status, out, err = on_a_terminal(
        "replay", str(trace_slice), "--capacity", "100,200", "--policy", "lru,arc,opt"
    )
    assert status == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert rows[0][:2] == ["policy", "capacity"] and rows[0][-2:] == ["of", "opt"]
    assert [row[:2] for row in rows[1:]] == [
        ["lru", "100"], ["lru", "200"], ["arc", "100"], ["arc", "200"],
        ["opt", "100"], ["opt", "200"],
    ]  # fmt: skip
    assert rows[-1][-1] == "100.0%"
    assert not out.lstrip().startswith("{")


def test_json_on_a_terminal_when_asked(trace_slice: Path) -> None:
    status, out, _ = on_a_terminal("replay", str(trace_slice), "--capacity", "50", "--json")
    assert status == 0
    assert set(json.loads(out.strip())) == FIELDS


def test_a_long_replay_draws_a_progress_bar_on_a_terminal_and_erases_it() -> None:
    status, out, _ = on_a_terminal(
        "replay", "--capacity", "500,1000", "--policy", "opt", stderr_tty=True
    )
    assert status == 0
    assert "\r[" in out and "opt @ 500" in out and "%" in out
    assert out.count("\r\x1b[K") >= 1  # erased before the table


def test_no_progress_bar_when_stderr_is_not_a_terminal() -> None:
    status, out, err = on_a_terminal("replay", "--capacity", "500,1000", "--policy", "opt")
    assert status == 0 and err == ""
    assert "opt" in out


def test_plot_writes_a_self_contained_html_page(trace_slice: Path, tmp_path: Path) -> None:
    plot = tmp_path / "curves.html"
    result = kvscope("replay", str(trace_slice), "--capacity", "50,100,200",
                     "--policy", "lru,opt", "--plot", str(plot))  # fmt: skip
    assert result.returncode == 0, result.stderr
    page = plot.read_text()
    assert page.count("<polyline") == 2 and "slice.jsonl" in page
    assert len(result.stdout.splitlines()) == 6
    assert f"plot written to {plot}" in result.stderr


def test_opt_on_a_trace_that_is_not_prefix_closed_says_what_it_is(tmp_path: Path) -> None:
    trace = tmp_path / "loose.jsonl"
    trace.write_text('{"hash_ids": [1, 2]}\n{"hash_ids": [3, 2]}\n')
    result = kvscope("replay", str(trace), "--capacity", "1", "--policy", "opt")
    assert result.returncode == 0
    assert "not prefix-closed (request 2: block 2" in result.stderr
    assert "feasible schedule there, not the optimum" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capacity", "500,0"], "capacity must be at least 1 block, got 0"),
        (["--capacity", "500,,1000"], "'500,,1000' has an empty item"),
        (["--policy", "lru,mru"], "invalid choice: 'mru' (choose from lru, arc"),
        (["--plot", "curves.svg"], "unsupported file type '.svg'; use .html or .png"),
        (["--plot", "/nonexistent-dir/curves.html"], "no directory /nonexistent-dir"),
    ],
)
def test_bad_arguments_are_one_clear_line_naming_the_problem(
    trace_slice: Path, args: list[str], message: str
) -> None:
    result = kvscope("replay", str(trace_slice), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_plot_path_that_is_a_directory_is_refused_before_any_replay(
    trace_slice: Path, tmp_path: Path
) -> None:
    """It was found only when the plot was written, after the whole replay had run."""
    taken = tmp_path / "curves.html"
    taken.mkdir()
    result = kvscope("replay", str(trace_slice), "--plot", str(taken))
    assert result.returncode == 2
    assert f"cannot plot to {taken}: it is a directory" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_plot_in_a_directory_it_cannot_write_in_is_refused_before_any_replay(
    trace_slice: Path,
) -> None:
    """/proc takes no new file, root's or anyone's: the replay ran whole, then the plot
    failed."""
    result = kvscope("replay", str(trace_slice), "--plot", "/proc/curves.html")
    assert result.returncode == 2
    assert "cannot plot to /proc/curves.html: " in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_png_plot_without_matplotlib_names_the_extra(trace_slice: Path) -> None:
    """Run with matplotlib made unimportable, as on an install without the plot extra."""
    code = (
        "import sys; sys.modules['matplotlib'] = None; from app.cli import main; sys.exit(main())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "replay", str(trace_slice), "--plot", "curves.png"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "a .png plot needs matplotlib: pip install 'kvscope[plot]'" in result.stderr


def test_a_trace_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    result = kvscope("replay", str(tmp_path), "--policy", "lru,opt")
    assert result.returncode == 2
    assert "trace path is a directory, not a file" in result.stderr


def test_an_empty_trace_path_is_called_empty_not_the_working_directory() -> None:
    result = kvscope("replay", "", "--policy", "lru")
    assert result.returncode == 2
    assert "error: trace path is empty" in result.stderr
