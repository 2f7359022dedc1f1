"""Hit ratio of every policy on the shared trace, beside vLLM's and the offline bound.

Run from the repository root: .venv/bin/python -m bench.policy_hit_ratio [--no-peer]
One JSON line per (policy, capacity): our hit ratio, the peer's for the same
policy in the same run (when its environment can be built), the difference in
points, and our fraction of the offline bound.
"""

from __future__ import annotations

import argparse

from bench.tooling.common import CAPACITIES, best_replay, emit, peer_python, run_peer, trace
from offload.cpu.policies.registry import policy_names
from offload.sim.optimum import offline_hits

PEER_POLICIES = ("lru", "arc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-peer", action="store_true", help="skip vLLM's manager")
    args = parser.parse_args()
    trace_path, requests = trace()
    block_refs = sum(len(r) for r in requests)
    python = None if args.no_peer else peer_python()
    for capacity in CAPACITIES:
        bound = offline_hits(requests, capacity) / block_refs
        for policy in policy_names():
            ours = best_replay(requests, policy, capacity, repeat=1).hit_ratio
            record = {
                "bench": "policy_hit_ratio",
                "policy": policy,
                "capacity": capacity,
                "hit_ratio": round(ours, 5),
                "bound_hit_ratio": round(bound, 5),
                "fraction_of_bound": round(ours / bound, 3),
            }
            if python is not None and policy in PEER_POLICIES:
                peer = run_peer(python, trace_path, policy, capacity, repeat=1)
                if peer is not None:
                    record["peer"] = peer["impl"]
                    record["peer_hit_ratio"] = round(peer["hit_ratio"], 5)
                    record["delta_points"] = round(100 * (ours - peer["hit_ratio"]), 2)
            emit(record)


if __name__ == "__main__":
    main()
