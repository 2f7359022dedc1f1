"""The ``kvscope`` command line: the one place that composes core and sidecar.

Every failure a user can cause (a missing file, a bad number) ends in one
line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # `python -m app.cli` runs as the kvscope script does (app/entry_point.py): the command
    # is this module imported by its name, with Ctrl-C a quiet stop from the start.
    import importlib

    from app.stop_signals import quiet_start

    name = __spec__.name if __spec__ is not None else "app.cli"  # None: run as a file path
    sys.exit(quiet_start(lambda: importlib.import_module(name).main()))

import argparse
import difflib
import importlib.metadata
import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, TextIO

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from app.otel import OtelConfigError, configure_otel
from app.server import Sidecar, run_server
from app.settings import SettingError, SidecarSettings
from app.stop_signals import StopSignals, Terminated, stop_once
from offload.cpu.manager import MAX_NUM_BLOCKS
from offload.cpu.policies.registry import policy_names
from offload.decimal_text import fractional_number, whole_number
from offload.insight.plot import PlotError, check_plot_path, write_plot
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.insight.sweep import OPT, SweepPoint, replay_point, sweep_curve, sweep_policies
from offload.shown import shown
from offload.sim.mooncake import (
    BUNDLED_TRACE_BLOCK_SIZE,
    TraceError,
    bundled_trace_path,
    load_trace,
)
from offload.sim.optimum import prefix_conflict
from offload.wire.publisher import EventPublisher
from offload.wire.sample_frame import MIN_SAMPLE_RATE, is_worker_rate

DEFAULT_CAPACITY = 2000
DEMO_RATE = 200.0
"""`demo --rate`'s default, requests per second (written here: the demo worker's module
loads torch, which `serve` must not)."""
MAX_DURATION_S = 365 * 24 * 3600
PROGRESS_MIN_REQUESTS = 20_000
"""Replays shorter than this (requests, summed over every point) draw no progress bar."""


def _capacity(text: str) -> int:
    try:
        value = whole_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"capacity must be {exc}, got {shown(repr(text), 60)}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"capacity must be at least 1 block, got {value}")
    if value > MAX_NUM_BLOCKS:
        raise argparse.ArgumentTypeError(
            f"capacity must be at most {MAX_NUM_BLOCKS} blocks, got {value}"
        )
    return value


def _items(text: str) -> list[str]:
    """A comma-separated list's items, spaces around them dropped; an empty one is refused
    naming the list (``1,,2`` was "it is empty, got ''", and ``lru,`` "invalid choice: ''")."""
    items = [part.strip() for part in text.split(",")]
    if items == [""]:
        raise argparse.ArgumentTypeError("it is empty: give one value or more, comma-separated")
    if "" in items:
        raise argparse.ArgumentTypeError(
            f"{shown(repr(text), 60)} has an empty item: one comma between each two values"
        )
    return items


def _capacities(text: str) -> list[int]:
    """A comma-separated list of capacities, each checked, in the order given, no repeats."""
    return list(dict.fromkeys(map(_capacity, _items(text))))


def _policies(text: str) -> list[str]:
    known = sweep_policies()
    names = _items(text)
    for name in names:
        if name not in known:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {shown(repr(name), 60)} (choose from {', '.join(known)})"
            )
    return list(dict.fromkeys(names))


def _number(text: str, what: str) -> float:
    try:
        return fractional_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{what} must be {exc}, got {shown(repr(text), 60)}"
        ) from None


def _request_rate(text: str) -> float:
    """Requests per second: a finite number above 0."""
    value = _number(text, "rate")
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"rate must be above 0 and finite, got {value}")
    return value


def _duration(text: str) -> float:
    """Seconds to run: above 0 and at most a year (a wait far longer overflows the clock)."""
    value = _number(text, "duration")
    if not 0 < value <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(
            f"duration must be above 0 and at most {MAX_DURATION_S} seconds, got {value}"
        )
    return value


def _sample_rate(text: str) -> float:
    """A rate in [MIN_SAMPLE_RATE, 1], or 0, which turns the sampled stream (and the live
    curve) off."""
    value = _number(text, "sample rate")
    if not is_worker_rate(value):
        raise argparse.ArgumentTypeError(
            f"sample rate must be 0 or in [{MIN_SAMPLE_RATE:g}, 1], got {value}"
        )
    return value


def _plot_path(text: str) -> Path:
    try:
        return check_plot_path(text)
    except PlotError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope", description="Observability-first KV-cache offloading."
    )
    parser.add_argument("--version", action="version", version=f"kvscope {_version()}")
    # Not required here: argparse checks a required COMMAND before the flags it does not know,
    # so `kvscope --bogus` said a COMMAND was missing and never named --bogus. `main` asks.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    replay_cmd = commands.add_parser(
        "replay",
        help="replay a Mooncake-format trace through the CPU offloading manager",
        description="Run the canonical replay for each policy and capacity: a table on a "
        "terminal, one JSON line of totals per (policy, capacity) when piped or with --json.",
    )
    replay_cmd.add_argument(
        "trace",
        nargs="?",
        metavar="TRACE",
        help="Mooncake JSONL trace, - for standard input (default: the bundled conversation trace)",
    )
    replay_cmd.add_argument(
        "--capacity", type=_capacities, default=[DEFAULT_CAPACITY], metavar="BLOCKS[,BLOCKS...]",
        help=f"CPU tier sizes in blocks, comma-separated (default {DEFAULT_CAPACITY})",
    )  # fmt: skip
    replay_cmd.add_argument(
        "--policy", type=_policies, default=["lru"], metavar="POLICY[,POLICY...]",
        help=f"eviction policies, comma-separated: {', '.join(sweep_policies())} "
        f"({OPT}: the offline optimum; default lru)",
    )  # fmt: skip
    replay_cmd.add_argument(
        "--json", action="store_true", help="JSON lines even on a terminal (the default when piped)"
    )
    replay_cmd.add_argument(
        "--plot", type=_plot_path, metavar="FILE.png|FILE.html",
        help="draw hit ratio against capacity per policy (.html needs nothing; "
        ".png needs the plot extra: pip install 'kvscope[plot]')",
    )  # fmt: skip
    replay_cmd.set_defaults(run=_run_replay)

    serve_cmd = commands.add_parser(
        "serve",
        help="run the sidecar: subscribe to workers' KV events, serve stats, metrics and a page",
        description="Flags override the KVSCOPE_* environment variables of the same name.",
    )
    serve_cmd.add_argument(
        "--connect", action="append", metavar="ENDPOINT",
        help="a worker's ZMQ PUB endpoint (kvscope or vLLM); repeat for several",
    )  # fmt: skip
    serve_cmd.add_argument(
        "--replay", action="append", metavar="ENDPOINT",
        help="the replay (ROUTER) endpoint of the --connect at the same position",
    )  # fmt: skip
    serve_cmd.add_argument(
        "--listen", action="append", metavar="ENDPOINT",
        help="an endpoint to bind for publishers that connect, e.g. tcp://*:5557 (vLLM's "
        "connects when its endpoint names a host: tcp://THIS-HOST:5557); repeat for several",
    )  # fmt: skip
    serve_cmd.add_argument(
        "--listen-replay", action="append", metavar="STREAM=ENDPOINT",
        help="the replay (ROUTER) endpoint of the listen-mode stream TOPIC@RANK "
        "(e.g. vllm-gpu@0=tcp://engine:5558); repeat for several",
    )  # fmt: skip
    _listen_flags(serve_cmd)
    serve_cmd.add_argument("--token", help="require `Authorization: Bearer TOKEN`")
    serve_cmd.set_defaults(run=_run_serve)

    demo_cmd = commands.add_parser(
        "demo",
        help="replay the bundled trace through a live worker and serve the sidecar beside it",
        description="A worker (real manager, real CPU transfers, real publisher) replays the "
        "bundled trace in a loop while the sidecar serves its live view; Ctrl-C or SIGTERM "
        "stops both.",
    )
    _listen_flags(demo_cmd)
    demo_cmd.add_argument(
        "--policy", choices=policy_names(), default="lru", help="eviction policy (default lru)"
    )
    demo_cmd.add_argument(
        "--capacity", type=_capacity, default=DEFAULT_CAPACITY,
        help=f"CPU tier size in blocks (default {DEFAULT_CAPACITY})",
    )  # fmt: skip
    demo_cmd.add_argument(
        "--gpu-capacity", type=_capacity, default=None,
        help="simulated GPU prefix cache size in blocks (default: a quarter of --capacity)",
    )  # fmt: skip
    demo_cmd.add_argument(
        "--rate", type=_request_rate, default=DEMO_RATE,
        help=f"requests replayed per second (default {DEMO_RATE:g})",
    )  # fmt: skip
    demo_cmd.add_argument(
        "--sample-rate", type=_sample_rate, default=DEFAULT_RATE, metavar="RATE",
        help=f"share of blocks (by hash) whose references feed the live hit-ratio curve "
        f"(default {DEFAULT_RATE}; 0 turns it off)",
    )  # fmt: skip
    demo_cmd.add_argument(
        "--duration", type=_duration, default=None,
        help="stop after this many seconds (default: run until Ctrl-C or SIGTERM)",
    )  # fmt: skip
    demo_cmd.set_defaults(run=_run_demo)
    return parser


def _listen_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument("--host", help="address to bind (default 127.0.0.1)")
    # Text: the settings read it by their one rule for numbers, and name --port when it breaks.
    command.add_argument("--port", help="HTTP port (default 8000; 0 picks a free one)")


SETTING_FLAGS: Final = ("connect", "replay", "listen", "listen_replay", "host", "port", "token")
"""The settings a command line may give as flags (each command has some of them); every other
setting is its ``KVSCOPE_*`` variable only."""


def _warn_of_unknown_variables(environ: Mapping[str, str]) -> None:
    """One line on stderr per ``KVSCOPE_*`` variable that names no setting, with the one it
    is nearest to: the settings ignore such a variable, so a misspelt ``KVSCOPE_TOKN`` served
    the API without a token and said nothing. A warning, not an error: a variable of another
    tool's may share the prefix. Names are matched as the settings read them, in any case."""
    settings = sorted(f"KVSCOPE_{name.upper()}" for name in SidecarSettings.model_fields)
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("KVSCOPE_") or upper in settings:
            continue
        prefix = len("KVSCOPE_")  # compared without it, which every name shares
        nearest = difflib.get_close_matches(upper[prefix:], [s[prefix:] for s in settings], n=1)
        hint = f" (did you mean KVSCOPE_{nearest[0]}?)" if nearest else ""
        print(f"kvscope: warning: {shown(name)} is not a setting; ignored{hint}", file=sys.stderr)


def _settings(args: argparse.Namespace, **given: object) -> SidecarSettings:
    """Settings from the environment, overridden by the flags that were given."""
    _warn_of_unknown_variables(os.environ)
    flags = {key: getattr(args, key, None) for key in SETTING_FLAGS}
    return SidecarSettings(**{k: v for k, v in {**flags, **given}.items() if v is not None})


def _run_serve(args: argparse.Namespace) -> int:
    run_server(_settings(args))
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    # Imported here: the demo worker's stand-in GPU cache needs torch, which
    # `serve` (and the sidecar image) must not load.
    from offload.sim.demo_worker import DemoConfig, DemoWorker

    requests = load_trace(bundled_trace_path())
    config = DemoConfig(
        policy=args.policy,
        capacity_blocks=args.capacity,
        gpu_cache_blocks=args.gpu_capacity,
        requests_per_s=args.rate,
    )
    signals = StopSignals()
    stop = threading.Event()
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        sampler = SpatialSampler(args.sample_rate) if args.sample_rate > 0 else None
        try:
            engine = DemoWorker(requests, publisher, config, sampler)
        except MemoryError:  # a --capacity within bounds this machine cannot hold
            return _no_memory(args.policy, args.capacity, "its capacity")
        failed: list[Exception] = []

        def work() -> None:
            """The worker's loop; a failure ends the demo, exit 1 (it served stale figures on,
            then exited 0)."""
            try:
                engine.run(stop)
            except Exception as exc:
                failed.append(exc)
            finally:
                signals.wake()

        worker = threading.Thread(target=work, name="kvscope-demo-worker")
        settings = _settings(args, connect=[publisher.endpoint], replay=[publisher.replay_endpoint])
        with Sidecar(settings) as sidecar:
            worker.start()
            print(f"kvscope demo: open {sidecar.url}/ (metrics at {sidecar.url}/metrics)",
                  flush=True)  # fmt: skip
            try:
                signals.wait(args.duration)
            finally:
                stop.set()
                worker.join()
    if failed:
        print(f"kvscope: error: the demo worker stopped: {type(failed[0]).__name__}: "
              f"{shown(str(failed[0]))}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _no_memory(policy: str, capacity: int, grows: str) -> int:
    """Say that a tier of ``capacity`` blocks under ``policy`` did not fit in memory, whose
    bookkeeping ``grows`` with something the user chose; the exit status."""
    print(f"kvscope: error: not enough memory for {policy} at {capacity} blocks: its "
          f"bookkeeping grows with {grows}", file=sys.stderr)  # fmt: skip
    return 2


def _run_replay(args: argparse.Namespace) -> int:
    stop_once()  # the replay runs on this thread: Ctrl-C and SIGTERM end it by an exception
    trace = args.trace if args.trace is not None else bundled_trace_path()
    requests = load_trace(trace)
    if OPT in args.policy and (conflict := prefix_conflict(requests)) is not None:
        print(f"kvscope: note: {shown(trace)} is not prefix-closed (request "
              f"{conflict[0] + 1}: block {conflict[1]!r} follows another block than before), "
              f"so {OPT} is a feasible schedule there, not the optimum",
              file=sys.stderr)  # fmt: skip
    capacities = sorted(args.capacity)
    total = len(requests) * len(capacities) * len(args.policy)
    bar = (
        _ProgressBar(total, sys.stderr)
        if sys.stderr.isatty() and total >= PROGRESS_MIN_REQUESTS
        else None
    )
    table = sys.stdout.isatty() and not args.json
    points: list[SweepPoint] = []
    try:
        for policy in args.policy:
            for capacity in capacities:
                if bar is not None:
                    bar.label = f"{policy} @ {capacity}"
                try:
                    result = replay_point(
                        requests, policy, capacity, BUNDLED_TRACE_BLOCK_SIZE,
                        bar.advance if bar is not None else None,
                    )  # fmt: skip
                except MemoryError:
                    grows = "the trace's length" if policy == OPT else "its capacity"
                    return _no_memory(policy, capacity, grows)
                points.append(SweepPoint(policy, capacity, result))
                if not table:
                    line = {"trace": str(trace), "policy": policy, "capacity": capacity}
                    print(json.dumps({**line, **result.as_dict()}), flush=True)
    finally:
        if bar is not None:
            bar.close()
    if table:
        print(_table(points))
    if args.plot is not None:
        write_plot(sweep_curve(points), args.plot, f"kvscope replay: {shown(Path(trace).name)}")
        print(f"kvscope: plot written to {shown(args.plot)}", file=sys.stderr)
    return 0


def _table(points: Sequence[SweepPoint]) -> str:
    """One row per (policy, capacity); beside ``opt``, each row's share of the optimum."""
    optimum = {p.capacity: p.result.hits for p in points if p.policy == OPT}
    header = ["policy", "capacity", "hit ratio", "hits", "block refs", "blocks/s"]
    if optimum:
        header.append("of opt")
    rows = [header]
    for point in points:
        result = point.result
        row = [
            point.policy, f"{point.capacity:,}", f"{100 * result.hit_ratio:.2f}%",
            f"{result.hits:,}", f"{result.block_refs:,}", f"{result.blocks_per_s:,.0f}",
        ]  # fmt: skip
        if optimum:
            best = optimum.get(point.capacity)
            row.append(f"{100 * result.hits / best:.1f}%" if best else "-")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                  enumerate(zip(row, widths, strict=True)))
        for row in rows
    )  # fmt: skip


class _ProgressBar:
    """A one-line bar on a terminal, redrawn at most ten times a second, erased at the end."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.done, self.stream, self.label = max(1, total), 0, stream, ""
        self._drawn = 0.0

    def advance(self, requests: int) -> None:
        self.done += requests
        now = time.monotonic()
        if now - self._drawn >= 0.1:
            self._drawn = now
            filled = self.WIDTH * min(self.done, self.total) // self.total
            bar = "#" * filled + "." * (self.WIDTH - filled)
            share = 100 * self.done / self.total
            self.stream.write(f"\r[{bar}] {share:5.1f}% {self.label}\x1b[K")
            self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


def _version() -> str:
    """The installed distribution's version (a checkout run without installing has none)."""
    try:
        return importlib.metadata.version("kvscope")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _stand_in_for_closed_output() -> None:
    """Give Python an output stream to /dev/null for stdout or stderr where the process was
    started with it closed (``>&-``, some supervisors). Python leaves ``sys.stdout`` None
    then, and its own ``print`` writes nowhere, but uvicorn's log set-up (``serve``,
    ``demo``) and ``replay`` called methods on it: a traceback and status 1."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 (kept until exit)


def main(argv: Sequence[str] | None = None) -> int:
    _stand_in_for_closed_output()
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {shown(' '.join(unknown))}")
    if args.command is None:
        parser.error("the following arguments are required: COMMAND")
    provider = None
    try:
        provider = configure_otel()
        return args.run(args)
    except (TraceError, OtelConfigError, PlotError) as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"kvscope: error: {_one_line(exc, _flags(args))}", file=sys.stderr)
        return 2
    except SettingError as exc:
        name = _setting_name((exc.setting,), _flags(args))
        print(f"kvscope: error: {name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down cleanly, and said so
        return 130
    except Terminated:  # SIGTERM cut a replay short: the status a shell gives its death
        return 143
    except BrokenPipeError:  # the reader of our output went away (| head): stop, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # the output's disk is full, say
        where = "" if exc.filename is None else f"{shown(exc.filename)}: "
        print(f"kvscope: error: {where}{shown(exc.strerror or exc)}", file=sys.stderr)
        return 1
    finally:
        if provider is not None:
            provider.shutdown()


def _flags(args: argparse.Namespace) -> frozenset[str]:
    """The settings this command takes as flags (``demo``: only --host and --port)."""
    return frozenset(name for name in SETTING_FLAGS if hasattr(args, name))


def _one_line(exc: ValidationError, flags: frozenset[str]) -> str:
    """Every bad setting, by name, on one line."""
    return "; ".join(
        f"{_setting_name(error['loc'], flags)}: {_problem(error)}" for error in exc.errors()
    )


def _problem(error: ErrorDetails) -> str:
    """What is wrong, in the settings' own words (pydantic puts "Value error, " before every
    message a validator raises, which tells a user nothing), and in a list, which item."""
    problem = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
    item = error["loc"][1:2]  # a list's element: KVSCOPE_CONNECT='["tcp://a:1", 5]'
    if item and isinstance(item[0], int):
        return f"item {item[0] + 1}: {problem}"
    return problem


def _setting_name(location: tuple[int | str, ...], flags: frozenset[str]) -> str:
    """A setting as the user can give it: the flag (where the command has one) and the
    variable."""
    if not location:
        return "settings"
    name = str(location[0])
    variable = f"KVSCOPE_{name.upper()}"
    return f"--{name.replace('_', '-')} / {variable}" if name in flags else variable
