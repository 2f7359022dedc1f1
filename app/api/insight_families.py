"""The hit-ratio curve's families on /metrics: each publisher's curve, its sampled stream's
counts, the optimum over its window, and what the curves hold in memory.

Read at scrape time from each publisher's ``PublisherInsight`` (app/state/insight.py), one
reading per publisher, so a curve and its optimum's figures are of the same moment;
``SidecarCollector`` (app/api/metrics.py) yields them among the sidecar's own families.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.state.insight import InsightReading, PublisherInsight
from app.state.insight_verdicts import window_efficiency
from app.state.publisher import PublisherState
from app.state.sidecar import SidecarState

_SAMPLE_COUNTERS = (
    ("kvscope_sidecar_sample_frames_total", "Sample frames applied to the hit-ratio curve.",
     "frames"),
    ("kvscope_sidecar_sample_missed_frames_total", "Sample frames lost in sequence gaps.",
     "missed_frames"),
    ("kvscope_sidecar_sample_block_refs_total",
     "Block references the sample frames stand for (sampled or not).", "block_refs"),
    ("kvscope_sidecar_sampled_refs_total", "Sampled block references received.", "sampled_refs"),
    ("kvscope_sidecar_insight_resets_total",
     "Times a publisher's hit-ratio curve started over (new stream or restart).", "resets"),
)  # fmt: skip
"""A publisher's sampled-stream counts (app/state/insight.py), by attribute."""


def insight_families(publishers: list[PublisherState], state: SidecarState) -> Iterator[Metric]:
    """The hit-ratio curves as gauges, the sampled streams' counts, the curves' memory."""
    sampling = [(p.name, p.insight) for p in publishers if p.insight is not None]
    curve = GaugeMetricFamily(
        "kvscope_sidecar_hit_ratio_curve",
        "Estimated hit ratio of a publisher's tier at a multiple of its capacity, per policy.",
        labels=["publisher", "policy", "multiple"],
    )
    memory = 0
    read = [(name, insight, insight.reading()) for name, insight in sampling]
    for name, insight, reading in read:
        memory += insight.memory()[1]
        found = reading.curve
        if found is None:
            continue
        for policy, ratios in found.hit_ratios.items():
            for multiple, ratio in zip(found.multiples() or (), ratios, strict=True):
                curve.add_metric([name, policy, f"{multiple:g}"], ratio)
    yield curve
    for metric, help_text, attribute in _SAMPLE_COUNTERS:
        family = CounterMetricFamily(metric, help_text, labels=["publisher"])
        for name, insight in sampling:
            family.add_metric([name], getattr(insight, attribute))
        yield family
    shed = CounterMetricFamily(
        "kvscope_sidecar_sample_shed_block_refs_total",
        "Block references left out of a curve: by the worker's full buffer (where=worker), "
        "or by the shadow tiers' full queue (where=shadows: out of every policy but lru).",
        labels=["publisher", "where"],
    )
    for name, insight in sampling:
        shed.add_metric([name, "worker"], insight.worker_shed_block_refs)
        shed.add_metric([name, "shadows"], insight.shadow_shed_block_refs)
    yield shed
    yield from _optimum_families(read)
    yield GaugeMetricFamily(
        "kvscope_sidecar_insight_bytes",
        "Estimated memory of the hit-ratio curves' simulations and the optimum's windows, "
        "every publisher (at most insight_max_bytes each).",
        memory,
    )
    queue = state.insight.queue
    yield GaugeMetricFamily(
        "kvscope_sidecar_insight_queue_bytes",
        f"Estimated bytes waiting for the shadow tiers (at most {queue.max_bytes}).",
        queue.bytes,
    )


def _optimum_families(
    read: list[tuple[str, PublisherInsight, InsightReading]],
) -> Iterator[Metric]:
    """The optimum over each publisher's window: its hits and the tier's policy's, and the
    block references they are out of (efficiency = tier hits / optimum hits), each from
    the same reading as its curve."""
    block_refs = GaugeMetricFamily(
        "kvscope_sidecar_window_block_refs",
        "Block references the optimum's window stood for at its latest computation.",
        labels=["publisher"],
    )
    optimum = GaugeMetricFamily(
        "kvscope_sidecar_window_optimum_hits",
        "Estimated hits of a clairvoyant cache of the tier's size over the window "
        "(its hit ratio times window_block_refs).",
        labels=["publisher"],
    )
    tier = GaugeMetricFamily(
        "kvscope_sidecar_window_tier_hits",
        "Estimated hits of the tier's policy over the same window, from empty at the same "
        "size; over window_optimum_hits: the efficiency against the optimum (absent where "
        "the API's efficiency is null: the curve does not simulate the tier's policy, the "
        "optimum hit nothing, the tier is too few sampled blocks, or the stream's blocks do "
        "not form prefix chains).",
        labels=["publisher"],
    )
    runs = CounterMetricFamily(
        "kvscope_sidecar_window_optimum_runs_total",
        "Computations of the optimum over the window.",
        labels=["publisher"],
    )
    for name, insight, reading in read:
        runs.add_metric([name], insight.optimum_runs)
        computed = reading.optimum
        if computed is None:
            continue
        result = computed.result
        block_refs.add_metric([name], result.block_refs)
        optimum.add_metric([name], result.optimum_ratio * result.block_refs)
        stream = reading.stream
        efficiency = (
            None
            if stream is None
            else window_efficiency(result, stream.policy, stream.capacity, reading.basis)
        )
        if efficiency is not None:
            tier.add_metric([name], result.tier_ratio * result.block_refs)
    yield from (block_refs, optimum, tier, runs)
