"""The ``kvscope`` command line: the one place that composes core and sidecar.

Every failure a user can cause (a missing file, a bad number) ends in one
line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from app.tracing import TracingConfigError, configure_tracing
from offload.cpu_manager import CPUOffloadingManager
from offload.policies.registry import policy_names
from offload.replay import replay
from offload.trace import TraceError, bundled_trace_path, load_trace

DEFAULT_CAPACITY = 2000
BLOCK_SIZE_TOKENS = 512
"""Tokens per block of the bundled trace (one hash id per 512-token block)."""


def _capacity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"capacity must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"capacity must be at least 1 block, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope", description="Observability-first KV-cache offloading."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay_cmd = commands.add_parser(
        "replay",
        help="replay a Mooncake-format trace through the CPU offloading manager",
        description="Run the canonical replay and print one JSON line of totals.",
    )
    replay_cmd.add_argument(
        "trace",
        nargs="?",
        metavar="TRACE",
        help="Mooncake JSONL trace (default: the bundled conversation trace)",
    )
    replay_cmd.add_argument(
        "--capacity", type=_capacity, default=DEFAULT_CAPACITY, help="CPU tier size in blocks"
    )
    replay_cmd.add_argument(
        "--policy", choices=policy_names(), default="lru", help="eviction policy"
    )
    replay_cmd.set_defaults(run=_run_replay)
    return parser


def _run_replay(args: argparse.Namespace) -> int:
    trace = args.trace if args.trace is not None else bundled_trace_path()
    requests = load_trace(trace)
    manager = CPUOffloadingManager(
        BLOCK_SIZE_TOKENS, args.capacity, args.policy, enable_events=True
    )
    result = replay(manager, requests)
    line = {"trace": str(trace), "policy": args.policy, "capacity": args.capacity}
    print(json.dumps({**line, **result.as_dict()}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    provider = None
    try:
        provider = configure_tracing()
        return args.run(args)
    except (TraceError, TracingConfigError) as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if provider is not None:
            provider.shutdown()


if __name__ == "__main__":
    sys.exit(main())
