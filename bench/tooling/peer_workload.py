"""The canonical workload, driven through vLLM 0.33.0's own CPUOffloadingManager.

This script runs INSIDE the peer venv (see ``bench/tooling/peer_env.py``), never in
kvscope's environment: it imports only the standard library and vLLM, so the
peer's figures cannot be influenced by kvscope's code. It prints one JSON line
that kvscope's benchmarks put next to their own figures.

The workload is kvscope's canonical one (``offload/sim/workload.py``), expressed in
vLLM 0.33.0's API. Per request, in trace order:

1. ``lookup`` key by key until the first non-HIT: n = the leading run of
   stored, ready blocks (0.33.0 looks up one ``OffloadKey`` at a time).
2. if n > 0: ``prepare_load(keys[:n])``, ``touch(keys)``, ``complete_load(keys[:n])``.
3. ``prepare_store(keys[n:])``; if it chose blocks, ``complete_store`` them.
4. drain ``take_events()`` (events enabled).

The one addition (documented deviation): each request is bracketed by
``on_new_request`` / ``on_request_finished`` on its own ``ReqContext``, as
vLLM's scheduler does. In 0.33.0 the policies apply a request's recency (LRU
rank order) and frequency (ARC's T1 -> T2 promotion of reused blocks) in
``on_request_finished``; without it the policies see only part of each access
and the hit ratios drift (LRU 5.37%/8.62% instead of 5.43%/8.65% at 2k/4k;
ARC 5.42%/6.80% instead of 5.49%/7.11%). The finish hook runs after the store and
before the event drain; it emits no events. Token positions are not recorded
(``set_offload_key_position``): the trace has none, keys are observed in
prefix order anyway, and the hit ratios are identical with or without them.

Block keys: each int hash id as 8 bytes big-endian, group 0
(``make_offload_key(h.to_bytes(8, "big"), 0)``). Keys are built while
parsing, outside the timed loop, just as kvscope's replay times only the loop.
hit_ratio = hits / block_refs; blocks_per_s = block_refs / loop seconds; with
``--repeat R`` the fastest of R runs is reported, each on a fresh manager.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

EXPECTED_VLLM = "0.33.0"


def load_keys(path: Path, make_key: Any) -> list[list[bytes]]:
    """Each request's OffloadKeys, in trace order; malformed lines are errors.

    Strict like kvscope's trace reader: skipping a request would change every
    hit ratio and break the side-by-side comparison.
    """
    requests: list[list[bytes]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                hash_ids = json.loads(line)["hash_ids"]
            except (ValueError, KeyError, TypeError) as exc:
                raise SystemExit(f"{path}:{number}: no 'hash_ids' list ({exc})") from None
            if not isinstance(hash_ids, list) or not all(
                type(h) is int and 0 <= h < 1 << 64 for h in hash_ids
            ):
                raise SystemExit(f"{path}:{number}: 'hash_ids' must be unsigned 64-bit ints")
            requests.append([make_key(h.to_bytes(8, "big"), 0) for h in hash_ids])
    if not requests:
        raise SystemExit(f"{path}: holds no requests")
    return requests


def replay(
    manager: Any,
    requests: Sequence[Sequence[bytes]],
    drain: Callable[[], None],
    step_end: Callable[[], None] | None = None,
) -> tuple[int, int, float]:
    """The canonical workload through any vLLM 0.33 manager: (hits, block_refs, seconds).

    ``drain`` takes the manager's events after each request (step 4);
    ``step_end``, when given, runs last, as the scheduler's end of a step.
    """
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    hit = LookupResult.HIT
    hits = 0
    block_refs = 0
    start = time.perf_counter()
    for index, keys in enumerate(requests):
        ctx = ReqContext(req_id=str(index))
        manager.on_new_request(ctx)
        n = 0
        for key in keys:
            if manager.lookup(key, ctx) is not hit:
                break
            n += 1
        if n:
            loaded = keys[:n]
            manager.prepare_load(loaded, ctx)
            manager.touch(keys, ctx)
            manager.complete_load(loaded, ctx)
        out = manager.prepare_store(keys[n:], ctx)
        if out is not None and out.keys_to_store:
            manager.complete_store(out.keys_to_store, ctx)
        manager.on_request_finished(ctx)
        drain()
        if step_end is not None:
            step_end()
        hits += n
        block_refs += len(keys)
    seconds = time.perf_counter() - start
    return hits, block_refs, seconds


def replay_once(
    requests: Sequence[Sequence[bytes]], policy: str, capacity: int, store_threshold: int = 1
) -> tuple[int, int, float]:
    """One canonical replay on a fresh vLLM manager: (hits, block_refs, seconds).

    ``store_threshold`` >= 2 turns on vLLM's reuse filter: a block is stored
    only once it has been offered that many times.
    """
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    manager = CPUOffloadingManager(
        capacity, cache_policy=policy, enable_events=True, store_threshold=store_threshold
    )
    return replay(manager, requests, lambda: deque(manager.take_events(), maxlen=0))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, replay R times, print one JSON line on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="Mooncake JSONL trace (one request a line)")
    parser.add_argument("--policy", choices=("lru", "arc"), required=True)
    parser.add_argument("--capacity", type=int, required=True, help="CPU blocks (chunks)")
    parser.add_argument("--repeat", type=int, default=1, help="best-of-R timing")
    parser.add_argument(
        "--store-threshold", type=int, default=1, help="vLLM's reuse filter (offers before a store)"
    )
    args = parser.parse_args(argv)
    if args.capacity < 1 or args.repeat < 1:
        parser.error("--capacity and --repeat must be positive")

    real_stdout = sys.stdout
    # vLLM's logger writes to stdout; keep stdout for the one JSON line callers parse.
    with contextlib.redirect_stdout(sys.stderr):
        from vllm.v1.kv_offload.base import make_offload_key

        requests = load_keys(args.trace, make_offload_key)
        runs = [
            replay_once(requests, args.policy, args.capacity, args.store_threshold)
            for _ in range(args.repeat)
        ]
    hits, block_refs, seconds = min(runs, key=lambda run: run[2])
    installed = version("vllm")
    if installed != EXPECTED_VLLM:
        print(
            f"peer_replay: warning: vllm {installed} installed, expected {EXPECTED_VLLM}",
            file=sys.stderr,
        )
    record = {
        "impl": f"vllm-{installed}",
        "policy": args.policy,
        "store_threshold": args.store_threshold,
        "capacity": args.capacity,
        "requests": len(requests),
        "block_refs": block_refs,
        "hits": hits,
        "hit_ratio": hits / block_refs if block_refs else 0.0,
        "seconds": seconds,
        "blocks_per_s": block_refs / seconds if seconds > 0 else 0.0,
    }
    print(json.dumps(record), file=real_stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
