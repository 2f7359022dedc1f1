"""kvscope's counters through vLLM's own metrics hook, so ``vllm serve``'s /metrics has them.

vLLM asks the spec for metric definitions once (``build_metric_definitions``)
and the manager for a stats payload every step (``get_stats``): counters as
increases, gauges as values. vLLM's own CPU-tier gauges and allocation
histogram keep their vLLM names, so dashboards built for vLLM's CPU tier
read kvscope the same way.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingMetricMetadata,
)
from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics

from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.manager_metrics import manager_snapshot
from offload.telemetry import metrics as m

MANAGER_SPECS = (
    m.LOOKUP_BLOCKS_TOTAL,
    m.LOOKUP_HIT_BLOCKS_TOTAL,
    m.LOOKUP_MISSES_TOTAL,
    m.LOOKUP_MISS_BLOCKS_TOTAL,
    m.STORE_REQUESTED_BLOCKS_TOTAL,
    m.STORE_ADMITTED_BLOCKS_TOTAL,
    m.STORE_SKIPPED_BLOCKS_TOTAL,
    m.STORE_REFUSED_BLOCKS_TOTAL,
    m.STORE_NOT_ADMITTED_BLOCKS_TOTAL,
    m.STORE_COMPLETED_BLOCKS_TOTAL,
    m.STORE_FAILED_BLOCKS_TOTAL,
    m.EVICTED_BLOCKS_TOTAL,
    m.DEAD_WRITE_BLOCKS_TOTAL,
    m.LOAD_BLOCKS_TOTAL,
    m.LOAD_COMPLETED_BLOCKS_TOTAL,
    m.BLOCKS_RESIDENT,
    m.BLOCKS_CAPACITY,
    m.BLOCKS_PINNED,
    m.INVARIANT_VIOLATIONS,
)
"""The manager's metrics vLLM's /metrics carries (transfers are counted by vLLM itself)."""

_BY_NAME = {spec.name: spec for spec in MANAGER_SPECS}

ALLOCATION_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)


def metric_definitions(store_threshold: int) -> dict[str, OffloadingMetricMetadata]:
    """Every metric a kvscope manager reports through vLLM, by name."""
    definitions: dict[str, OffloadingMetricMetadata] = {
        CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC: OffloadingGaugeMetadata(
            "Fraction of the CPU tier pinned by loads or stores in flight (1.0 = none free)."
        ),
        CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC: OffloadingGaugeMetadata(
            "Fraction of the CPU tier pinned by stores in flight."
        ),
        CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC: OffloadingGaugeMetadata(
            "Fraction of the CPU tier pinned by loads in flight."
        ),
        CPUOffloadingMetrics.CPU_ALLOCATION_SIZE: OffloadingHistogramMetadata(
            "Chunks each prepare_store asked the CPU tier for.", buckets=ALLOCATION_BUCKETS
        ),
    }
    if store_threshold >= 2:
        definitions[CPUOffloadingMetrics.STORES_SKIPPED] = OffloadingCounterMetadata(
            "Stores skipped because the chunk was not offered store_threshold times yet."
        )
    for spec in MANAGER_SPECS:
        kind = OffloadingCounterMetadata if spec.kind == "counter" else OffloadingGaugeMetadata
        definitions[spec.name] = kind(spec.help, labelnames=spec.labels)
    return definitions


def fill_stats(
    stats: OffloadingConnectorStats,
    core: CPUOffloadingManager,
    allocation_sizes: list[int],
    stores_skipped: int | None,
    reported: dict[tuple[str, tuple[str, ...]], float],
) -> None:
    """One step's payload: usage gauges, allocations, skips, and the manager's metrics.

    ``stores_skipped`` is None when no store threshold is set (vLLM then
    defines no such counter); ``reported`` holds the counter values already
    handed over, so that only increases go out, and is updated.
    """
    capacity = core.num_blocks
    writing = core.stats.stores_in_flight
    reading = core.stats.blocks_pinned_by_loads
    stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, (writing + reading) / capacity)
    stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, writing / capacity)
    stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, reading / capacity)
    for size in allocation_sizes:
        stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
    if stores_skipped is not None:
        stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, stores_skipped)
    snapshot = manager_snapshot(core)
    for sample in snapshot.counters:
        spec = _BY_NAME.get(sample.name)
        if spec is None:
            continue
        labels = tuple(sample.labels[name] for name in spec.labels)
        increase = sample.value - reported.get((sample.name, labels), 0.0)
        reported[(sample.name, labels)] = sample.value
        if increase:
            stats.increase_counter(sample.name, increase, labels)
    for sample in snapshot.gauges:
        spec = _BY_NAME.get(sample.name)
        if spec is not None:
            labels = tuple(sample.labels[name] for name in spec.labels)
            stats.set_gauge(sample.name, sample.value, labels)
