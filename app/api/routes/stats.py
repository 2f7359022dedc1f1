"""GET /api/v1/stats: blocks and bytes per medium, worker totals and rates, publisher health."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TypeVar

from fastapi import APIRouter, Depends

from app.api.deps import UNAUTHORIZED, State, require_token
from app.api.schemas import ListenerInfo, PublisherInfo, StatsResponse

Number = TypeVar("Number", int, float)

router = APIRouter(tags=["api"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED)


@router.get("/stats")
async def stats(state: State) -> StatsResponse:
    """Blocks and bytes per medium, hit ratio, evictions, rates and publisher health.

    A coroutine, as the dependencies are (app/api/deps.py): a short read under the
    state's lock, with no I/O, that the page polls every second."""
    now = time.time()
    publishers = list(state.publishers.values())
    workers = [p.worker for p in publishers if p.worker is not None]
    # A rate is a publisher's now only while it sends: a dead worker's last one stood forever.
    live = [p.worker for p in publishers if p.worker is not None and p.connected(now)]
    index = state.index
    with state.lock:
        blocks, size = index.blocks_by_medium(), index.bytes_by_medium()
        tracked, overflow = len(index), index.overflow
    hits = sum(w.lookup_hit_blocks for w in workers)
    asked = sum(w.lookup_blocks for w in workers)
    return StatsResponse(
        ts=now,
        blocks_by_medium=blocks,
        bytes_by_medium=size,
        tracked_blocks=tracked,
        max_blocks=index.max_blocks,
        overflow=overflow,
        hit_ratio=hits / asked if asked else None,
        lookup_hit_blocks=hits,
        lookup_blocks=asked,
        evictions=_add_up(w.evictions for w in workers),
        stores_completed=sum(w.stores_completed for w in workers),
        loads=sum(w.loads for w in workers),
        stores_per_s=_sum_known(w.stores_per_s for w in live),
        loads_per_s=_sum_known(w.loads_per_s for w in live),
        evictions_per_s=_sum_known(w.evictions_per_s for w in live),
        transfer_bytes_per_s=_add_up(w.transfer_bytes_per_s for w in live),
        events_per_s=state.event_log.events_per_s(),
        publishers=[PublisherInfo.of(p, now) for p in publishers],
        listener=None if state.listener is None else ListenerInfo.of(state.listener, publishers),
    )


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _add_up(parts: Iterable[dict[str, Number]]) -> dict[str, Number]:
    totals: dict[str, Number] = {}
    for part in parts:
        for key, value in part.items():
            totals[key] = totals.get(key, 0) + value
    return totals
