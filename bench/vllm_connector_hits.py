"""Hit ratio of a policy driven as vLLM 0.33's connector drives it, beside the canonical replay's.

Run from the repository root:
    .venv/bin/python -m bench.vllm_connector_hits [TRACE ...] [--policy P]

vLLM's connector asks key by key, loads the hits, offers the rest and ends
the request; it never calls ``touch``, so a policy hears of a request only
through its loads and offers (``observe``, ``admit``, ``finish``, each naming
the request). This drives kvscope's vLLM manager (built by vLLM's own
factory) that way over the bundled trace and every Mooncake trace named, and
prints, per capacity, its hit ratio beside the canonical replay's (which
touches each request whole): where a policy depends on seeing requests
whole, the two should agree. One JSON line per (trace, capacity).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

from bench.tooling.common import CAPACITIES, TRACES_HELP, emit, named_traces, trace
from bench.tooling.vllm_config import kvscope_manager
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies.registry import policy_names
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE
from offload.sim.workload import run_request


def connector_request(manager: Any, req_id: str, hashes: Sequence[int]) -> int:
    """One request as vLLM 0.33's scheduler and connector run it; returns the blocks hit."""
    keys = [make_offload_key(h.to_bytes(8, "big"), 0) for h in hashes]
    ctx = ReqContext(req_id=req_id)
    for place, key in enumerate(keys, 1):
        ctx.set_offload_key_position(key, place * BUNDLED_TRACE_BLOCK_SIZE)
    manager.on_new_request(ctx)
    hits = 0
    for key in keys:
        if manager.lookup(key, ctx) is not LookupResult.HIT:
            break
        hits += 1
    if hits:
        manager.prepare_load(keys[:hits], ctx)
    if hits < len(keys):
        out = manager.prepare_store(keys[hits:], ctx)
        if out is not None:
            manager.complete_store(out.keys_to_store, ctx)
    if hits:
        manager.complete_load(keys[:hits], ctx)
    manager.on_request_finished(ctx)
    return hits


def _ratios(requests: list[list[int]], policy: str, capacity: int) -> tuple[float, float]:
    """Percent of block references hit: through the connector's calls, and in the replay."""
    refs = sum(map(len, requests))
    manager = kvscope_manager(capacity, policy)
    connector = sum(
        connector_request(manager, f"r{number}", hashes) for number, hashes in enumerate(requests)
    )
    core = CPUOffloadingManager(BUNDLED_TRACE_BLOCK_SIZE, capacity, policy)
    replay = sum(run_request(core, hashes) for hashes in requests)
    return 100 * connector / refs, 100 * replay / refs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, help=TRACES_HELP)
    parser.add_argument("--policy", default="gated", choices=policy_names())
    args = parser.parse_args()
    workloads = [("bundled", trace()[1])]
    workloads += [(str(path), requests) for path, requests in named_traces(parser, args.traces)]
    for name, requests in workloads:
        for capacity in CAPACITIES:
            connector, replay = _ratios(requests, args.policy, capacity)
            emit(
                {
                    "bench": "vllm_connector_hits", "trace": name, "policy": args.policy,
                    "capacity": capacity, "connector_hit_pct": round(connector, 3),
                    "replay_hit_pct": round(replay, 3),
                    "connector_minus_replay": round(connector - replay, 3),
                }
            )  # fmt: skip


if __name__ == "__main__":
    main()
