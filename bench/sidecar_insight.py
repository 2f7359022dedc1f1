"""Sidecar ingest with the live hit-ratio curve on, against 1,000,000 block events/s.

Run from the repository root: .venv/bin/python -m bench.sidecar_insight [--quick]
One JSON line per sampling rate. The process is pinned to one core, as the
sidecar's ingest thread would have it, and the shadow thread runs beside it
on that core under its CPU share (``KVSCOPE_INSIGHT_CPU_SHARE``), as in the
sidecar. The ingest loop, in wall time on that core:

- KV frames of bench.sidecar_ingest (map era, int hashes, no token ids:
  about 1,000 block events each), decoded and applied to a block index;
- beside each, a sample frame of as many block references of the bundled
  trace (looped), sampled at the rate, as the worker sends them: decoded,
  the LRU stack fed, the shadow tiers' share queued.

Figures: ``events_per_s`` (KV block events over the loop's wall time; the
sample's references ride along, one per event), ``ratio`` against the
1,000,000 budget, the same loop with no sample frames
(``events_per_s_without``), what the shadow queue shed, and the estimated
memory of the simulations (``insight_bytes``) against its bound, and
tracemalloc's count of it. Never asserts on time.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc
from itertools import cycle

from app.decode import decode_kv_payload
from app.ingest.shadow_thread import ShadowThread
from app.settings import InsightConfig
from app.state.block_index import BlockIndex
from app.state.insight import InsightState
from bench.sidecar_ingest import build_frames
from bench.tooling.common import emit, trace
from offload.insight.sampling import SpatialSampler
from offload.wire.sample_buffer import SampleBuffer
from offload.wire.sample_frame import decode_sample_frame, encode_sample_frame
from offload.wire.stats_frame import WorkerConfig

TARGET = 1_000_000
CAPACITY = 2000
FRAMES, QUICK_FRAMES = 600, 150


def sample_payloads(rate: float, per_frame: int, frames: int) -> list[bytes]:
    """``frames`` sample frames of about ``per_frame`` block references of the trace each."""
    _, requests = trace()
    source = cycle(requests)
    buffer = SampleBuffer(SpatialSampler(rate), max_bytes=1 << 30)
    config = WorkerConfig(policy="lru", capacity_blocks=CAPACITY, block_size=16)
    payloads = []
    for _ in range(frames):
        refs = 0
        while refs < per_frame:
            request = next(source)
            buffer.add(request)
            refs += len(request)
        frame = buffer.take("bench", 0, config)
        assert frame is not None
        payloads.append(encode_sample_frame(frame))
    return payloads


def run(kv: list[bytes], samples: list[bytes] | None) -> tuple[float, InsightState]:
    insight = InsightState(InsightConfig())
    shadows = ShadowThread(insight.queue, insight.config.cpu_share)
    publisher = insight.new_publisher()
    index = BlockIndex(max_blocks=1 << 22)
    shadows.start()
    try:
        start = time.perf_counter()
        for seq, payload in enumerate(kv):
            index.apply("worker-0", decode_kv_payload(payload), 0.0)
            if samples is not None:
                publisher.receive(seq, decode_sample_frame(samples[seq]))
        seconds = time.perf_counter() - start
    finally:
        shadows.close()
    insight.publisher = publisher  # type: ignore[attr-defined]
    return seconds, insight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames")
    args = parser.parse_args()
    frames = QUICK_FRAMES if args.quick else FRAMES
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    kv = build_frames("map", "int", 0, frames)
    events = sum(len(e.block_hashes) for p in kv for e in decode_kv_payload(p).events)
    without, _ = run(kv, None)
    for rate in (0.01, 0.05):
        samples = sample_payloads(rate, events // frames, frames)
        seconds, insight = run(kv, samples)
        publisher = insight.publisher  # type: ignore[attr-defined]
        held, size = publisher.memory()
        tracemalloc.start()
        _, measured = run(kv[: frames // 3], samples[: frames // 3])
        traced, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        emit({
            "bench": "sidecar_insight", "rate": rate, "frames": frames, "block_events": events,
            "block_refs": publisher.block_refs, "sampled_refs": publisher.sampled_refs,
            "events_per_s": round(events / seconds),
            "events_per_s_without": round(events / without),
            "ratio": round(events / seconds / TARGET, 3), "target_met": events / seconds >= TARGET,
            "shadow_shed_refs_share": round(
                publisher.shadow_shed_block_refs / max(1, publisher.block_refs), 3
            ),
            "simulated_refs": publisher.reading().simulated_refs,
            "insight_held_blocks": held, "insight_bytes": size,
            "insight_max_bytes": publisher.config.max_bytes,
            "traced_bytes_third_of_run": traced,
        })  # fmt: skip
        del measured


if __name__ == "__main__":
    main()
