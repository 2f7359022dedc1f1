"""Hit ratio of every policy beside vLLM's strongest configurations and the offline bound.

Run from the repository root:
    .venv/bin/python -m bench.policy_hit_ratio [TRACE ...] [--halves] [--no-peer] [--peer-python P]

The bundled conversation trace always runs; every Mooncake trace named on the
command line runs too, and ``--halves`` adds each trace's first and second
half (a policy designed on one half is checked on the other). One JSON line
per (trace, capacity, row). Rows: the offline optimum, and the best schedule
that never stores a block at its first offer (``optimum-second-offer``: the
most that vLLM's reuse filter or any gate refusing first offers could hit);
vLLM 0.33.0's LRU, its LRU with the reuse filter (store_threshold=2) and its
ARC, each in the same run; every kvscope policy, with its ratio to the
strongest peer row, its fraction of the optimum, and the issue's target for
that cell: 1.25x the strongest peer row, or 90% of the optimum where that row
is already within 90% of it; ``target_reachable`` is false where 1.25x the peer lies above the
optimum itself (no policy can meet it there).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.tooling.common import (
    CAPACITIES,
    TRACES_HELP,
    add_peer_flags,
    best_replay,
    chosen_peer,
    emit,
    named_traces,
    run_peer,
    trace,
)
from offload.cpu.policies.registry import policy_names
from offload.shown import shown
from offload.sim.optimum import offline_hits

PEER_ROWS = (("lru", 1), ("lru", 2), ("arc", 1))
"""vLLM's (policy, store_threshold) configurations: threshold 2 is its reuse filter."""
OVER_PEER = 1.25
NEAR_OPTIMUM = 0.9


def _target(optimum: float, peer: float) -> tuple[str, float]:
    """The cell's target: 1.25x the strongest peer, or 90% of the optimum where the peer
    already reaches that."""
    if peer >= NEAR_OPTIMUM * optimum:
        return "90% of optimum", NEAR_OPTIMUM * optimum
    return "1.25x strongest peer", OVER_PEER * peer


def _peer_file(scratch: Path, label: str, requests: list[list[int]]) -> Path:
    """``requests`` as plain JSON lines in ``scratch``, for the peer, which reads a file.

    The peer gets these, never the file named: its reader is its own (a byte-order mark
    or a lone CR, which kvscope's accepts, failed it), and a pipe (``<(zcat t.gz)``) is
    drained and a file may have changed or gone since kvscope read it.
    """
    path = scratch / f"{label}.jsonl"
    with path.open("w", encoding="utf-8") as file:
        file.writelines(json.dumps({"hash_ids": r}) + "\n" for r in requests)
    return path


def _workloads(
    traces: list[tuple[Path, list[list[int]]]], halves: bool, scratch: Path
) -> list[tuple[str, Path, list[list[int]]]]:
    """(name, file for the peer, requests) per trace and, with ``halves``, per half; a
    named trace's file and every half's are written to ``scratch`` (``_peer_file``)."""
    named = [("bundled", *trace())]
    for index, (path, requests) in enumerate(traces):
        named.append((str(path), _peer_file(scratch, f"trace-{index}", requests), requests))
    if not halves:
        return named
    out: list[tuple[str, Path, list[list[int]]]] = []
    for name, path, requests in named:
        out.append((name, path, requests))
        middle = len(requests) // 2
        for label, part in (("first-half", requests[:middle]), ("second-half", requests[middle:])):
            if not any(part):  # a trace of one request, say: no hit ratio to measure
                print(f"{shown(name)}: its {label} holds no block references; skipped",
                      file=sys.stderr)  # fmt: skip
                continue
            half = _peer_file(scratch, f"{len(out)}-{label}", part)
            out.append((f"{name}:{label}", half, part))
    return out


def _peer_rows(python: Path | None, path: Path, capacity: int) -> dict[str, float]:
    """The peer's hit ratio per configuration name, for those that ran."""
    rows: dict[str, float] = {}
    if python is None:
        return rows
    for policy, threshold in PEER_ROWS:
        peer = run_peer(python, path, policy, capacity, repeat=1, store_threshold=threshold)
        if peer is not None:
            name = f"vllm-{policy}" + (f"-threshold{threshold}" if threshold > 1 else "")
            rows[name] = peer["hit_ratio"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, help=TRACES_HELP)
    parser.add_argument("--halves", action="store_true", help="also run each trace's halves")
    add_peer_flags(parser)
    args = parser.parse_args()
    traces = named_traces(parser, args.traces)
    python = chosen_peer(args)
    with tempfile.TemporaryDirectory() as scratch:
        for name, path, requests in _workloads(traces, args.halves, Path(scratch)):
            block_refs = sum(len(r) for r in requests)
            for capacity in CAPACITIES:
                bound = offline_hits(requests, capacity) / block_refs
                base: dict[str, Any] = {"bench": "policy_hit_ratio", "trace": name}
                base["capacity"] = capacity
                emit({**base, "row": "optimum", "hit_ratio": round(bound, 5)})
                gates_bound = offline_hits(requests, capacity, stored_from=2) / block_refs
                emit({**base, "row": "optimum-second-offer", "hit_ratio": round(gates_bound, 5)})
                peers = _peer_rows(python, path, capacity)
                for row, ratio in peers.items():
                    emit({**base, "row": row, "hit_ratio": round(ratio, 5)})
                strongest = max(peers.items(), key=lambda item: item[1], default=None)
                for policy in policy_names():
                    ours = best_replay(requests, policy, capacity, repeat=1).hit_ratio
                    record = {**base, "row": f"kvscope-{policy}", "hit_ratio": round(ours, 5)}
                    record["fraction_of_optimum"] = round(ours / bound, 3) if bound else None
                    if strongest is not None and strongest[1] > 0:
                        record["strongest_peer"] = strongest[0]
                        record["ratio_to_strongest_peer"] = round(ours / strongest[1], 3)
                        target, needed = _target(bound, strongest[1])
                        record["target"] = target
                        record["target_hit_ratio"] = round(needed, 5)
                        record["target_reachable"] = needed <= bound
                        record["meets_target"] = ours >= needed
                    emit(record)


if __name__ == "__main__":
    main()
