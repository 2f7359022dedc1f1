"""GET /api/v1/insight: per publisher, the hit-ratio curve, the stream behind it, verdicts."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from app.api.deps import UNAUTHORIZED, State, require_token
from app.api.insight_schemas import InsightResponse, PublisherInsightInfo, ShadowQueueInfo

router = APIRouter(tags=["api"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED)


@router.get("/insight")
def insight(state: State) -> InsightResponse:
    """What each tier would hit at 1/8x to 8x its capacity, per simulated policy (from the
    worker's sampled access stream), how its policy compares with a clairvoyant cache of
    the same size over the latest sampled references (``optimum``, ``efficiency``), its
    stranded blocks and dead writes, and what they say in words (``verdicts``)."""
    with state.lock:
        usage = state.index.usage()
    max_bytes = state.insight.config.max_bytes
    now = time.time()
    publishers = []
    for publisher in state.publishers.values():
        stranded = {row.medium: row.stranded for row in usage if row.publisher == publisher.name}
        publishers.append(PublisherInsightInfo.of(publisher, stranded, max_bytes, now))
    return InsightResponse(
        ts=now,
        publishers=publishers,
        memory_bytes=sum(p.memory.bytes for p in publishers if p.memory is not None),
        queue=ShadowQueueInfo.of(state.insight.queue),
    )
