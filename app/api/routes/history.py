"""GET /api/v1/history: the aggregates of /api/v1/stats over time, per publisher and medium."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.exceptions import RequestValidationError

from app.api.deps import UNAUTHORIZED, State, require_token
from app.api.repeated_parameters import refuse_repeated_parameters
from app.api.schemas import HistoryResponse, HistorySeries
from app.api.validation_errors import MALFORMED_TEXT
from app.decimal_text import MAX_DECIMAL, DecimalFloat, decimal_int
from app.state.history import DEFAULT_TIERS, TierSpec

router = APIRouter(
    tags=["api"],
    dependencies=[Depends(require_token), Depends(refuse_repeated_parameters)],
    responses=UNAUTHORIZED,
)

_Resolution = decimal_int(0, MAX_DECIMAL)
"""Any number: one no tier keeps is a 422 that lists those kept."""


@router.get(
    "/history",
    responses={**MALFORMED_TEXT, 422: {"description": "A resolution no tier keeps."}},
)
async def history(
    state: State,
    since: Annotated[
        DecimalFloat,
        Query(
            description="Unix seconds; points from then on (default: all kept).",
            allow_inf_nan=False,
        ),
    ] = 0.0,
    resolution: Annotated[
        _Resolution | None,
        Query(
            description="Seconds per point, one of `resolutions_s`; default: the finest "
            "that still holds everything since `since`.",
            json_schema_extra={"enum": [spec.resolution_s for spec in DEFAULT_TIERS]},
        ),
    ] = None,
    publisher: Annotated[
        str | None, Query(description="Only this publisher's series (default: all).")
    ] = None,
) -> HistoryResponse:
    """Sampled every second by the ingest thread; a point is its interval's mean (gauges) or
    last value (counters), so a page opened at any time draws the past at once.

    A coroutine, as the dependencies are (app/api/deps.py): a bounded read with no I/O,
    that the page polls every second."""
    kept = state.history
    try:
        window = kept.window(since, resolution, publisher)
    except ValueError:  # a resolution no tier keeps: a 422 in the shape of every other
        raise RequestValidationError([_unkept(resolution, kept.tiers)]) from None
    return HistoryResponse(
        resolution_s=window.resolution_s,
        resolutions_s=[t.resolution_s for t in kept.tiers],
        retention_s=[t.retention_s for t in kept.tiers],
        times=window.times,
        series=[HistorySeries.of(key, kind, values) for key, kind, values in window.series],
        max_series=kept.max_series,
        refused=kept.refused,
    )


def _unkept(resolution: int | None, tiers: Sequence[TierSpec]) -> dict[str, object]:
    """The error of a ``resolution`` no tier keeps, naming those kept."""
    kept = ", ".join(str(tier.resolution_s) for tier in tiers)
    return {
        "type": "enum",
        "loc": ("query", "resolution"),
        "msg": f"Input should be one of the resolutions kept, in seconds: {kept}",
        "input": resolution,
        "ctx": {"expected": kept},
    }
