"""Manager hot path: blocks per second of the canonical replay, events on.

Run from the repository root:
    .venv/bin/python -m bench.hot_path [--repeat R] [--no-peer] [--peer-python P]
One JSON line per (policy, capacity): kvscope's blocks/s and, in the same
run, vLLM 0.33.0's manager's for the same policy, and their ratio (best of R
runs each, so a noisy neighbour hurts neither side's figure).
"""

from __future__ import annotations

import argparse

from bench.tooling.common import (
    CAPACITIES,
    add_peer_flags,
    best_replay,
    chosen_peer,
    count,
    emit,
    run_peer,
    trace,
)

POLICIES = ("lru", "arc", "gated")
PEER_POLICY = {"lru": "lru", "arc": "arc", "gated": "lru"}
"""vLLM's policy each row is timed against: its LRU where it has no equivalent."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=count, default=3, help="runs per side; best is kept")
    add_peer_flags(parser)
    args = parser.parse_args()
    trace_path, requests = trace()
    python = chosen_peer(args)
    for policy in POLICIES:
        for capacity in CAPACITIES:
            ours = best_replay(requests, policy, capacity, args.repeat)
            record = {
                "bench": "hot_path",
                "policy": policy,
                "capacity": capacity,
                "events": True,
                "blocks_per_s": round(ours.blocks_per_s),
            }
            if python is not None:
                peer = run_peer(python, trace_path, PEER_POLICY[policy], capacity, args.repeat)
                if peer is not None:
                    record["peer"] = f"{peer['impl']} {PEER_POLICY[policy]}"
                    record["peer_blocks_per_s"] = round(peer["blocks_per_s"])
                    record["ratio"] = round(ours.blocks_per_s / peer["blocks_per_s"], 2)
            emit(record)


if __name__ == "__main__":
    main()
