"""The canonical workload: a trace's requests driven through one manager, as vLLM drives it.

Every policy benchmark, the peer comparison and the ``kvscope replay`` command
run this same loop, so their hit ratios and throughputs are comparable figure
for figure.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from offload.base import BlockHash, OffloadingEvent, OffloadingManager


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    """Totals of one run; hit_ratio = hits / block_refs."""

    requests: int
    block_refs: int
    hits: int
    seconds: float

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.block_refs if self.block_refs else 0.0

    @property
    def blocks_per_s(self) -> float:
        return self.block_refs / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "hit_ratio": self.hit_ratio, "blocks_per_s": self.blocks_per_s}


EventSink = Callable[[list[OffloadingEvent]], None]
"""Where each request's events go (a publisher); None drops them."""


def run_request(
    manager: OffloadingManager, block_hashes: Sequence[BlockHash], sink: EventSink | None = None
) -> int:
    """One request's lookup, load, touch and store; returns the blocks hit."""
    hits = manager.lookup(block_hashes)
    if hits:
        hit_hashes = block_hashes[:hits]
        manager.prepare_load(hit_hashes)
        manager.touch(block_hashes)
        manager.complete_load(hit_hashes)
    out = manager.prepare_store(
        block_hashes[hits:], parent=block_hashes[hits - 1] if hits else None
    )
    if out is not None and out.block_hashes_to_store:
        manager.complete_store(out.block_hashes_to_store)
    # Drain every step, as the connector does, so events never pile up.
    events = manager.take_events()
    if sink is None:
        deque(events, maxlen=0)
    else:
        sink(events if isinstance(events, list) else list(events))
    return hits


def run_workload(
    manager: OffloadingManager,
    requests: Sequence[Sequence[BlockHash]],
    sink: EventSink | None = None,
) -> WorkloadResult:
    """Run every request in order and time the whole loop."""
    hits = 0
    block_refs = 0
    start = time.perf_counter()
    for block_hashes in requests:
        hits += run_request(manager, block_hashes, sink)
        block_refs += len(block_hashes)
    seconds = time.perf_counter() - start
    return WorkloadResult(len(requests), block_refs, hits, seconds)
