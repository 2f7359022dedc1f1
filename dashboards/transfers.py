"""kvscope Transfers: how big and how slow each direction's copy jobs are, and which fail.

Heatmaps show the whole distribution where the Overview shows percentiles:
a second mode in sizes or durations (a slow path, a fragmented store) shows
here first.

Two sources count transfers. kvscope's own transfer backends export
kvscope_transfer_* where kvscope drives them (``kvscope demo``, an engine
calling them itself). Inside vLLM 0.33 the backends run in vLLM's worker
process, which counts the transfers itself (vllm:kv_offload_*), and a failed
transfer stops that worker (it asserts success), so there only vLLM's series
have data and nothing is ever counted as failed.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards import rules
from dashboards.kit import (
    BLOCKS_PER_S,
    ON,
    VLLM,
    VLLM_ON,
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
VLLM_DIRECTIONS = {"gpu_to_cpu": "store", "cpu_to_gpu": "load"}
"""vLLM's name for each direction, as in its vllm:kv_offload_<name>_* series."""
FILTERS = ("instance", "publisher", "engine", "rank", "model")
"""kvscope's transfer series carry their sidecar, publisher, engine and rank (no medium);
vLLM's carry model_name."""
KVSCOPE_ONLY = (
    "kvscope's own transfer backends (kvscope_transfer_*) where kvscope drives them: "
    "the demo, an engine calling them itself. Inside vLLM 0.33 vLLM counts transfers "
    "itself (the vLLM panels and series)."
)
CELLS = "A cell's colour: jobs per second in its bucket."
"""What a heatmap's colour reads (the rates of the histogram's buckets, see ``_buckets``)."""
NO_FAILURES_IN_VLLM = (
    "Inside vLLM 0.33 a failed transfer stops vLLM's worker (it asserts every transfer "
    "succeeds), so no failure is ever counted there: this applies outside vLLM only."
)


def _buckets(histogram: str, direction: str) -> str:
    """Jobs per second per bucket: what a Prometheus-histogram heatmap plots. A rate, not an
    increase over $__rate_interval: that window is longer than Grafana's step (by a scrape
    at least), so each cell would count its neighbours' jobs too, more the closer the zoom."""
    selected = rate(f"{histogram}_bucket", WORKER, f'direction="{direction}"')
    return f"sum by (le) ({selected})"


def _vllm_buckets(direction: str) -> str:
    """vLLM's transfer-size histogram of one direction, as ``_buckets`` reads kvscope's."""
    selected = rate(f"vllm:kv_offload_{VLLM_DIRECTIONS[direction]}_size_bucket", VLLM)
    return f"sum by (le) ({selected})"


def _sizes() -> list[Panel]:
    kvscope = [
        heatmap_panel(
            f"Job size, {direction}",
            f"Bytes per {direction} transfer job over time, from {KVSCOPE_ONLY} {CELLS} "
            "Healthy: one tight band (blocks per job times block bytes); a spread to small "
            "jobs means fragmented transfers.",
            "bytes",
            _buckets("kvscope_transfer_size_bytes", direction),
        )
        for direction in DIRECTIONS
    ]
    # A panel of its own, not a second query: vLLM's buckets (1 MB to 200 MB) are not
    # kvscope's (64 KiB to 4 GiB, powers of two), and one heatmap would interleave them.
    vllm = [
        heatmap_panel(
            f"Job size as vLLM counts it, {VLLM_DIRECTIONS[direction]} ({direction})",
            f"Bytes per {VLLM_DIRECTIONS[direction]} transfer as vLLM 0.33 counts it "
            f"(vllm:kv_offload_{VLLM_DIRECTIONS[direction]}_size): the transfers inside "
            "vLLM, where kvscope's panel beside it stays empty. vLLM's buckets stop at 200 "
            f"MB. {CELLS} Healthy: one tight band, as for kvscope's.",
            "bytes",
            _vllm_buckets(direction),
        )
        for direction in DIRECTIONS
    ]
    return [*kvscope, *vllm]


def _durations() -> list[Panel]:
    return [
        *(
            heatmap_panel(
                f"Job duration, {direction}",
                f"Time from submit to finish of {direction} jobs, from {KVSCOPE_ONLY} {CELLS} "
                "Healthy: one band in the sub-millisecond to millisecond range; a second, "
                "slower band is a stalled path.",
                "s",
                _buckets("kvscope_transfer_duration_seconds", direction),
            )
            for direction in DIRECTIONS
        ),
        timeseries_panel(
            "Mean job time as vLLM counts it",
            "Inside vLLM 0.33: the mean time of a transfer per direction over 5 minutes, vLLM's "
            "total transfer time over its transfer count (recording rule); vLLM keeps no "
            "per-transfer time histogram, so there is no heatmap of it. Healthy: steady, "
            "milliseconds.",
            "s",
            Query(
                series(rules.VLLM_OFFLOAD_MEAN_SECONDS, VLLM),
                f"vLLM mean {{{{direction}}}} {VLLM_ON}",
            ),
            width=24,
        ),
    ]


def _failures() -> list[Panel]:
    by_direction = "sum by (direction, outcome) ({})"
    return [
        timeseries_panel(
            "Jobs by outcome",
            "Transfer jobs finished per second, ok or failed, and those refused at submit "
            "(as many jobs as the backend holds were in flight or unpolled) per direction, "
            f"from {KVSCOPE_ONLY} vLLM counts finished transfers only (vLLM store = "
            "gpu_to_cpu, vLLM load = cpu_to_gpu), all ok: a failed one stops its worker. "
            "Healthy: all ok, none refused.",
            "cps",
            Query(
                by_direction.format(rate("kvscope_transfer_jobs_total", WORKER)),
                "{{direction}} {{outcome}}",
            ),
            Query(
                f"sum by (direction) ({rate('kvscope_transfer_jobs_refused_total', WORKER)})",
                "{{direction}} refused at submit",
            ),
            *(
                Query(
                    f"sum by (model_name) ({rate(f'vllm:kv_offload_{name}_size_count', VLLM)})",
                    f"vLLM {name} {{{{model_name}}}}",
                )
                for name in VLLM_DIRECTIONS.values()
            ),
            width=8,
        ),
        timeseries_panel(
            "Failure ratio",
            "Failed jobs over finished jobs, per direction (recording rule), from "
            f"{KVSCOPE_ONLY} {NO_FAILURES_IN_VLLM} Healthy: 0; a failed store is rolled back, "
            "a failed load recomputes the prefix.",
            "percentunit",
            Query(
                series(rules.TRANSFER_FAILURE_RATIO, WORKER),
                f"{{{{engine}}}}/{{{{rank}}}} {{{{direction}}}}, {ON}",
            ),
            width=8,
            percent=True,
        ),
        timeseries_panel(
            "Blocks moved by outcome",
            f"Offloaded blocks in finished jobs, per direction and outcome, from {KVSCOPE_ONLY} "
            "vLLM counts bytes, not blocks (see the Overview's transfer bandwidth). Healthy: "
            "failed 0; gpu_to_cpu follows stores completed, cpu_to_gpu loads completed.",
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
        "GPU<->CPU copy jobs: size and duration distributions per direction, and failures. "
        "kvscope_transfer_* come from kvscope's own transfer backends (the demo, an engine "
        "driving them itself); inside vLLM 0.33 vLLM counts the transfers (the vLLM panels "
        "and series), and a failed transfer stops vLLM's worker.",
        [("Job sizes", _sizes()), ("Job durations", _durations()), ("Failures", _failures())],
        filters=FILTERS,
    )
