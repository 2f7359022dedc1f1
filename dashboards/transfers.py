"""kvscope Transfers: how big and how slow each direction's copy jobs are, and which fail.

Heatmaps show the whole distribution where the Overview shows percentiles:
a second mode in sizes or durations (a slow path, a fragmented store) shows
here first.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards import rules
from dashboards.kit import (
    BLOCKS_PER_S,
    WORKER,
    Panel,
    Query,
    build_dashboard,
    heatmap_panel,
    rate,
    series,
    timeseries_panel,
)

UID = "kvscope-transfers"
DIRECTIONS = ("gpu_to_cpu", "cpu_to_gpu")
"""offload.transfer.job.Direction's values (not imported: that pulls in torch)."""


def _buckets(histogram: str, direction: str) -> str:
    """Jobs per bucket per interval: what a Prometheus-histogram heatmap plots."""
    selected = series(f"{histogram}_bucket", WORKER, f'direction="{direction}"')
    return f"sum by (le) (increase({selected}[$__rate_interval]))"


def _sizes() -> list[Panel]:
    return [
        heatmap_panel(
            f"Job size, {direction}",
            f"Bytes per {direction} transfer job over time. Healthy: one tight band (blocks "
            "per job times block bytes); a spread to small jobs means fragmented transfers.",
            "bytes",
            _buckets("kvscope_transfer_size_bytes", direction),
        )
        for direction in DIRECTIONS
    ]


def _durations() -> list[Panel]:
    return [
        heatmap_panel(
            f"Job duration, {direction}",
            f"Time from submit to finish of {direction} jobs. Healthy: one band in the "
            "sub-millisecond to millisecond range; a second, slower band is a stalled path.",
            "s",
            _buckets("kvscope_transfer_duration_seconds", direction),
        )
        for direction in DIRECTIONS
    ]


def _failures() -> list[Panel]:
    by_direction = "sum by (direction, outcome) ({})"
    return [
        timeseries_panel(
            "Jobs finished by outcome",
            "Transfer jobs finished per second, ok or failed, per direction. Healthy: all ok.",
            "cps",
            Query(
                by_direction.format(rate("kvscope_transfer_jobs_total", WORKER)),
                "{{direction}} {{outcome}}",
            ),
            width=8,
        ),
        timeseries_panel(
            "Failure ratio",
            "Failed jobs over finished jobs, per direction (recording rule). Healthy: 0; a "
            "failed store is rolled back, a failed load recomputes the prefix.",
            "percentunit",
            Query(
                series(rules.TRANSFER_FAILURE_RATIO, WORKER), "{{engine}}/{{rank}} {{direction}}"
            ),
            width=8,
            percent=True,
        ),
        timeseries_panel(
            "Blocks moved by outcome",
            "Offloaded blocks in finished jobs, per direction and outcome. Healthy: failed 0; "
            "gpu_to_cpu follows stores completed, cpu_to_gpu loads completed.",
            BLOCKS_PER_S,
            Query(
                by_direction.format(rate("kvscope_transfer_blocks_total", WORKER)),
                "{{direction}} {{outcome}}",
            ),
            width=8,
        ),
    ]


def build() -> Dashboard:
    """The Transfers dashboard."""
    return build_dashboard(
        UID,
        "kvscope / Transfers",
        "kvscope's GPU<->CPU copy jobs: size and duration distributions per direction, "
        "and failures.",
        [("Job sizes", _sizes()), ("Job durations", _durations()), ("Failures", _failures())],
    )
