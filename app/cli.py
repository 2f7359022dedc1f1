"""The ``kvscope`` command line: the one place that composes core and sidecar.

Every failure a user can cause (a missing file, a bad number) ends in one
line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence

from pydantic import ValidationError

from app.ingest import ListenError
from app.otel import OtelConfigError, configure_otel
from app.server import Sidecar, run_server
from app.settings import SidecarSettings
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import policy_names
from offload.sim.mooncake import (
    BUNDLED_TRACE_BLOCK_SIZE,
    TraceError,
    bundled_trace_path,
    load_trace,
)
from offload.sim.workload import run_workload
from offload.wire.publisher import EventPublisher

DEFAULT_CAPACITY = 2000


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
        "bundled trace in a loop while the sidecar serves its live view; Ctrl-C stops both.",
    )
    _listen_flags(demo_cmd)
    demo_cmd.add_argument("--policy", choices=policy_names(), default="lru", help="eviction policy")
    demo_cmd.add_argument(
        "--capacity", type=_capacity, default=DEFAULT_CAPACITY, help="CPU tier size in blocks"
    )
    demo_cmd.add_argument(
        "--gpu-capacity", type=_capacity, default=None,
        help="simulated GPU prefix cache size in blocks (default: a quarter of --capacity)",
    )  # fmt: skip
    demo_cmd.add_argument("--rate", type=float, default=200.0, help="requests replayed per second")
    demo_cmd.add_argument(
        "--duration", type=float, default=None, help="stop after this many seconds"
    )
    demo_cmd.set_defaults(run=_run_demo)
    return parser


def _listen_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument("--host", help="address to bind (default 127.0.0.1)")
    command.add_argument("--port", type=int, help="HTTP port (default 8000; 0 picks a free one)")


def _settings(args: argparse.Namespace, **given: object) -> SidecarSettings:
    """Settings from the environment, overridden by the flags that were given."""
    names = ("connect", "replay", "listen", "listen_replay", "host", "port")
    flags = {key: getattr(args, key, None) for key in names}
    flags["token"] = getattr(args, "token", None)
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
    stop = threading.Event()
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        engine = DemoWorker(requests, publisher, config)
        worker = threading.Thread(target=engine.run, args=(stop,), name="kvscope-demo-worker")
        settings = _settings(args, connect=[publisher.endpoint], replay=[publisher.replay_endpoint])
        with Sidecar(settings) as sidecar:
            worker.start()
            print(f"kvscope demo: open {sidecar.url}/ (metrics at {sidecar.url}/metrics)",
                  flush=True)  # fmt: skip
            try:
                stop.wait(args.duration)
            except KeyboardInterrupt:
                pass
            finally:
                stop.set()
                worker.join()
    return 0


def _run_replay(args: argparse.Namespace) -> int:
    trace = args.trace if args.trace is not None else bundled_trace_path()
    requests = load_trace(trace)
    manager = CPUOffloadingManager(
        BUNDLED_TRACE_BLOCK_SIZE, args.capacity, args.policy, enable_events=True
    )
    result = run_workload(manager, requests)
    line = {"trace": str(trace), "policy": args.policy, "capacity": args.capacity}
    print(json.dumps({**line, **result.as_dict()}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    provider = None
    try:
        provider = configure_otel()
        return args.run(args)
    except (TraceError, OtelConfigError) as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"kvscope: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ListenError as exc:
        print(f"kvscope: error: {_setting_name(('listen',))}: {exc}", file=sys.stderr)
        return 2
    finally:
        if provider is not None:
            provider.shutdown()


def _one_line(exc: ValidationError) -> str:
    """Every bad setting, by name, on one line."""
    return "; ".join(f"{_setting_name(error['loc'])}: {error['msg']}" for error in exc.errors())


def _setting_name(location: tuple[int | str, ...]) -> str:
    """A setting as the user can give it: the flag (where there is one) and the variable."""
    if not location:
        return "settings"
    name = str(location[0])
    return f"--{name.replace('_', '-')} / KVSCOPE_{name.upper()}"


if __name__ == "__main__":
    sys.exit(main())
