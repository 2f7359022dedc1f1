"""Sidecar ingest throughput: KV-event frames decoded and applied to the block index.

Run from the repository root: .venv/bin/python -m bench.sidecar_ingest [--quick]
One JSON line per frame shape (era x hash type x token ids):

- ``ingest_events_per_s``: block events (one per block hash) decoded by
  ``app.decode`` AND applied to an ``app.state.block_index.BlockIndex``;
- ``decode_events_per_s``: decoding alone, for where the time goes;
- ``bound_events_per_s``: ``msgspec.msgpack.decode`` of the same frames with no
  schema, which builds every object once and checks nothing: the least any
  decoder that reads the frames must spend;
- ``ratio``: ingest / bound; ``target_met``: ingest >= 1,000,000 block events/s.

The process is pinned to one core, as the sidecar's ingest thread is. Frames
are what a busy publisher sends: about 1,000 block events each, half stores of
new blocks and half removals of blocks stored a few frames earlier (so the
index stays at a steady size), in events of 16 blocks. Hashes are random
63-bit ints (traces, older vLLM) or 32-byte sha256 digests (vLLM); with token
ids, a store carries 16 per block as vLLM's GPU events do. Each figure is the
best of several runs, in CPU time of the (single-threaded) process.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable, Iterator
from itertools import islice

import msgspec

from app.decode import decode_kv_payload
from app.state.block_index import BlockIndex
from bench.tooling.common import emit
from offload.wire.kv_events import BlockRemoved, BlockStored, KVEventBatch, encode_batch

BLOCKS_PER_EVENT = 16
EVENTS_PER_FRAME = 64  # half stored, half removed: 1,024 block events per frame
REMOVE_LAG = 4
"""A frame removes the blocks stored this many frames before it."""
TOKENS_PER_BLOCK = 16
FRAMES, QUICK_FRAMES = 300, 60
REPEAT, QUICK_REPEAT = 5, 2
TARGET = 1_000_000
MEDIUM = "CPU"


def hash_stream(kind: str, rng: random.Random) -> Iterator[int | bytes]:
    """Endless distinct block hashes of one type."""
    while True:
        yield rng.getrandbits(63) if kind == "int" else rng.randbytes(32)


def frame_events(era: str, stored: list, removed: list, tokens: int) -> list:
    """One frame's events in ``era``'s shape: stores of ``stored``, removals of ``removed``."""
    token_ids = list(range(tokens * BLOCKS_PER_EVENT))
    events: list = []
    for start in range(0, len(stored), BLOCKS_PER_EVENT):
        fields = (stored[start : start + BLOCKS_PER_EVENT], None, token_ids, TOKENS_PER_BLOCK)
        if era == "map":
            events.append(BlockStored(*fields, None, MEDIUM, None))
        else:
            events.append(["BlockStored", *fields, None, MEDIUM])
    for start in range(0, len(removed), BLOCKS_PER_EVENT):
        hashes = removed[start : start + BLOCKS_PER_EVENT]
        removal = BlockRemoved(hashes, MEDIUM) if era == "map" else ["BlockRemoved", hashes, MEDIUM]
        events.append(removal)
    return events


def encode_frame(era: str, ts: float, events: list) -> bytes:
    """Map era through kvscope's own schema (vLLM 0.33's); array era as plain lists."""
    if era == "map":
        return encode_batch(KVEventBatch(ts=ts, events=events, data_parallel_rank=0))
    return msgspec.msgpack.encode([ts, events, 0])


def build_frames(era: str, hash_kind: str, tokens: int, frames: int) -> list[bytes]:
    """``frames`` payloads of one shape, each storing new blocks and removing old ones."""
    hashes = hash_stream(hash_kind, random.Random(0))
    per_frame = EVENTS_PER_FRAME // 2 * BLOCKS_PER_EVENT
    history: list[list] = []
    payloads = []
    for number in range(frames):
        stored = list(islice(hashes, per_frame))
        removed = history[-REMOVE_LAG] if len(history) >= REMOVE_LAG else []
        history.append(stored)
        events = frame_events(era, stored, removed, tokens)
        payloads.append(encode_frame(era, float(number), events))
    return payloads


def block_events(payloads: list[bytes]) -> int:
    batches = [decode_kv_payload(payload) for payload in payloads]
    return sum(len(event.block_hashes) for batch in batches for event in batch.events)


def best_seconds(run: Callable[[], object], repeat: int) -> float:
    """Best CPU time of ``repeat`` runs: one core's work, whatever else shares the machine."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def ingest(payloads: list[bytes]) -> None:
    index = BlockIndex(max_blocks=1 << 22)
    for payload in payloads:
        index.apply("worker-0", decode_kv_payload(payload), 0.0)


def decode_only(payloads: list[bytes]) -> None:
    for payload in payloads:
        decode_kv_payload(payload)


def bound(payloads: list[bytes]) -> None:
    decode = msgspec.msgpack.decode
    for payload in payloads:
        decode(payload)


def measure(era: str, hash_kind: str, tokens: int, frames: int, repeat: int) -> dict:
    payloads = build_frames(era, hash_kind, tokens, frames)
    events = block_events(payloads)
    rates = {
        name: events / best_seconds(lambda run=run: run(payloads), repeat)
        for name, run in (("ingest", ingest), ("decode", decode_only), ("bound", bound))
    }
    return {
        "bench": "sidecar_ingest",
        "era": era,
        "hash": hash_kind,
        "token_ids_per_block": tokens,
        "frames": frames,
        "block_events": events,
        "frame_bytes": sum(map(len, payloads)) // frames,
        "ingest_events_per_s": round(rates["ingest"]),
        "decode_events_per_s": round(rates["decode"]),
        "bound_events_per_s": round(rates["bound"]),
        "ratio": round(rates["ingest"] / rates["bound"], 3),
        "target_met": rates["ingest"] >= TARGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames and runs")
    args = parser.parse_args()
    frames, repeat = (QUICK_FRAMES, QUICK_REPEAT) if args.quick else (FRAMES, REPEAT)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for era in ("map", "array"):
        for hash_kind in ("int", "bytes32"):
            for tokens in (0, TOKENS_PER_BLOCK):
                emit(measure(era, hash_kind, tokens, frames, repeat))


if __name__ == "__main__":
    main()
