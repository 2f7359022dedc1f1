"""What every benchmark shares: the trace, our replay, and the vLLM peer's.

Figures are only comparable side by side, so each benchmark runs kvscope and
the peer in the same process run, on the same trace, with the same replay.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from offload import CPUOffloadingManager
from offload.decimal_text import fractional_number, whole_number
from offload.shown import shown
from offload.sim.mooncake import (
    BUNDLED_TRACE_BLOCK_SIZE,
    TraceError,
    bundled_trace_path,
    load_trace,
)
from offload.sim.workload import WorkloadResult, run_workload

CAPACITIES = (1000, 2000, 4000)
PEER_SCRIPT = Path(__file__).with_name("peer_workload.py")


def trace() -> tuple[Path, list[list[int]]]:
    """The bundled conversation trace and its requests."""
    path = bundled_trace_path()
    return path, load_trace(path)


TRACES_HELP: Final = "Mooncake JSONL traces to run after the bundled one, which always runs"
"""The help of a benchmark's TRACE arguments: "more traces" left unsaid more than what."""


def named_traces(
    parser: argparse.ArgumentParser, paths: Sequence[Path]
) -> list[tuple[Path, list[list[int]]]]:
    """Every trace named on the command line, with its requests, all read before any run.

    A file that cannot be read ends the benchmark at once with the parser's
    usage error (exit 2) naming its file and line, not with a traceback after
    minutes spent on the traces before it.
    """
    loaded = []
    for path in paths:
        try:
            loaded.append((path, load_trace(path)))
        except TraceError as exc:
            parser.error(str(exc))
    return loaded


def best_replay(
    requests: list[list[int]], policy: str, capacity: int, repeat: int
) -> WorkloadResult:
    """kvscope's canonical replay, events on, best of ``repeat`` fresh managers."""
    results = [
        run_workload(
            CPUOffloadingManager(BUNDLED_TRACE_BLOCK_SIZE, capacity, policy, enable_events=True),
            requests,
        )
        for _ in range(repeat)
    ]
    return min(results, key=lambda result: result.seconds)


def peer_python() -> Path | None:
    """The peer environment's interpreter, built on first use; None when it cannot be."""
    from bench.tooling.peer_env import ensure_peer_python

    return ensure_peer_python()


def count(text: str) -> int:
    """A count flag (runs, rounds, requests, readers, a rate of events): a whole number of at
    least 1, written as kvscope writes numbers. ``int`` took 0, which ended a benchmark in a
    traceback (the best of no runs), and ``--requests -5``, which replayed all but the last
    five requests in silence."""
    try:
        value = whole_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, got {shown(repr(text), 60)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def sampling_rate(text: str) -> float:
    """A sampling rate flag: a decimal number above 0 and at most 1, as the sampler takes
    one. ``float`` took 0, 5 and nan, which ended the benchmark in the sampler's traceback."""
    try:
        value = fractional_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"a sampling rate must be {exc}, got {shown(repr(text), 60)}"
        ) from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"a sampling rate must be above 0 and at most 1, got {value}"
        )
    return value


def add_peer_flags(parser: argparse.ArgumentParser) -> None:
    """``--no-peer`` and ``--peer-python``, for the benchmarks that run vLLM's manager."""
    parser.add_argument("--no-peer", action="store_true", help="skip vLLM's manager")
    parser.add_argument(
        "--peer-python",
        type=_interpreter,
        help="an interpreter with vllm 0.33.0 (default: the peer venv)",
    )


def chosen_peer(args: argparse.Namespace) -> Path | None:
    """The peer's interpreter the flags of ``add_peer_flags`` ask for; None: no peer."""
    if args.no_peer:
        return None
    return args.peer_python or peer_python()


def _interpreter(text: str) -> Path:
    """A ``--peer-python`` that can run, checked before the first replay: a missing path
    ended the benchmark in a traceback from subprocess, after kvscope's own rows."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {shown(text)}")
    if not os.access(path, os.X_OK):
        raise argparse.ArgumentTypeError(f"not executable: {shown(text)}")
    return path


PEER_TIMEOUT_S: Final = 1800
"""How long one peer replay may take: the largest trace a replay holds, at vLLM's pace."""


def run_peer(
    python: Path,
    trace_path: Path,
    policy: str,
    capacity: int,
    repeat: int,
    store_threshold: int = 1,
) -> dict[str, Any] | None:
    """vLLM 0.33.0's manager on the same replay, or None (with the reason on stderr).

    ``store_threshold`` >= 2 runs it with its reuse filter on.
    """
    command = [
        str(python),
        str(PEER_SCRIPT),
        str(trace_path),
        "--policy",
        policy,
        "--capacity",
        str(capacity),
        "--repeat",
        str(repeat),
        "--store-threshold",
        str(store_threshold),
    ]
    answer = _peer_answer(command)
    if isinstance(answer, str):
        print(f"peer failed ({policy}, {capacity}): {answer}", file=sys.stderr)
        return None
    return answer


def _peer_answer(command: list[str]) -> dict[str, Any] | str:
    """The peer's result (its last line, JSON), or why there is none."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer in {PEER_TIMEOUT_S} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return done.stderr.strip()[-500:] or f"exit {done.returncode}, nothing printed"
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return f"printed {lines[-1][:200]!r}"


def emit(record: dict[str, Any]) -> None:
    """One JSON line per configuration, flushed so partial runs still report."""
    try:
        print(json.dumps(record), flush=True)
    except BrokenPipeError:
        output_closed()


def output_closed() -> NoReturn:
    """End quietly, as a pipeline's writer does when its reader has gone (``| head``)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
    sys.exit(141)
