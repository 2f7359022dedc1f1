"""Every kvscope metric, defined once: name, type, help and labels.

The same definitions serve the worker's own Prometheus collector and the
stats frames it publishes, so the sidecar re-exports exactly the series a
worker would, under the same names. Names follow Prometheus conventions:
the ``kvscope_`` prefix, base units in the name, ``_total`` on counters,
low-cardinality labels only (never a block hash).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from offload.telemetry.histogram import Histogram
from offload.wire.stats_frame import HistogramSnapshot, Sample

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]


def _spec(name: str, kind: Kind, help_text: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, kind, help_text, labels)


LOOKUPS_TOTAL = _spec(
    "kvscope_lookups_total",
    "counter",
    "Lookup calls (inside vLLM: chunks asked, by the lookup that scheduled a request).",
    "medium",
)
LOOKUP_BLOCKS_TOTAL = _spec(
    "kvscope_lookup_blocks_total",
    "counter",
    "Blocks asked about by lookups (inside vLLM: once per scheduling of a request, not per "
    "step it waited).",
    "medium",
)
LOOKUP_HIT_BLOCKS_TOTAL = _spec(
    "kvscope_lookup_hit_blocks_total",
    "counter",
    "Blocks found: the leading run of stored, ready blocks.",
    "medium",
)
LOOKUP_TOKENS_TOTAL = _spec(
    "kvscope_lookup_tokens_total", "counter", "Tokens asked about by lookups.", "medium"
)
LOOKUP_HIT_TOKENS_TOTAL = _spec(
    "kvscope_lookup_hit_tokens_total", "counter", "Tokens found by lookups.", "medium"
)
LOOKUP_MISSES_TOTAL = _spec(
    "kvscope_lookup_misses_total",
    "counter",
    "Lookups that stopped short, by the reason of their first missing block "
    "(cold, evicted, not_admitted, no_room, in_flight).",
    "medium",
    "reason",
)
LOOKUP_MISS_BLOCKS_TOTAL = _spec(
    "kvscope_lookup_miss_blocks_total",
    "counter",
    "Blocks lookups lost, by reason: prefix_lost for blocks held behind the break, the first "
    "missing block's reason for the others.",
    "medium",
    "reason",
)
LOOKUP_MISS_TOKENS_TOTAL = _spec(
    "kvscope_lookup_miss_tokens_total",
    "counter",
    "Tokens of the blocks lookups lost, by reason, each block counted with its own size "
    "(inside vLLM, a hybrid model's KV cache group copy with its group's chunk tokens).",
    "medium",
    "reason",
)
MISS_MEMORY_BLOCKS = _spec(
    "kvscope_miss_memory_blocks",
    "gauge",
    "Hashes of recently evicted and refused blocks kept to tell them from cold misses.",
    "medium",
)
STORE_REQUESTED_BLOCKS_TOTAL = _spec(
    "kvscope_store_requested_blocks_total", "counter", "Blocks offered to prepare_store.", "medium"
)
STORE_ADMITTED_BLOCKS_TOTAL = _spec(
    "kvscope_store_admitted_blocks_total",
    "counter",
    "Blocks given a slot (stores submitted).",
    "medium",
)
STORE_SKIPPED_BLOCKS_TOTAL = _spec(
    "kvscope_store_skipped_blocks_total",
    "counter",
    "Blocks offered but already stored (or repeated in the call).",
    "medium",
)
STORE_REFUSED_BLOCKS_TOTAL = _spec(
    "kvscope_store_refused_blocks_total",
    "counter",
    "Blocks refused because no room could be made.",
    "medium",
)
STORE_NOT_ADMITTED_BLOCKS_TOTAL = _spec(
    "kvscope_store_not_admitted_blocks_total",
    "counter",
    "Blocks the cache policy judged not worth a slot; never stored, they evicted nothing.",
    "medium",
)
STORE_REFUSALS_TOTAL = _spec(
    "kvscope_store_refusals_total", "counter", "prepare_store calls that returned None.", "medium"
)
STORE_COMPLETED_BLOCKS_TOTAL = _spec(
    "kvscope_store_completed_blocks_total",
    "counter",
    "Blocks whose store completed (stores finished).",
    "medium",
)
STORE_FAILED_BLOCKS_TOTAL = _spec(
    "kvscope_store_failed_blocks_total",
    "counter",
    "Blocks whose store failed and was rolled back.",
    "medium",
)
EVICTED_BLOCKS_TOTAL = _spec(
    "kvscope_evicted_blocks_total",
    "counter",
    "Blocks that left the tier, by reason: capacity (to make room for a store), "
    "failed_store (rolled back), clear (a cache reset).",
    "medium",
    "policy",
    "reason",
)
DEAD_WRITE_BLOCKS_TOTAL = _spec(
    "kvscope_dead_write_blocks_total",
    "counter",
    "Stored blocks evicted without ever being loaded.",
    "medium",
    "policy",
)
LOAD_BLOCKS_TOTAL = _spec(
    "kvscope_load_blocks_total",
    "counter",
    "Blocks pinned by prepare_load (loads submitted).",
    "medium",
)
LOAD_COMPLETED_BLOCKS_TOTAL = _spec(
    "kvscope_load_completed_blocks_total",
    "counter",
    "Blocks unpinned by complete_load (loads finished).",
    "medium",
)
BLOCKS_RESIDENT = _spec(
    "kvscope_blocks_resident", "gauge", "Blocks held by the tier, ready or being written.", "medium"
)
BLOCKS_CAPACITY = _spec("kvscope_blocks_capacity", "gauge", "Blocks the tier can hold.", "medium")
BLOCKS_PINNED = _spec(
    "kvscope_blocks_pinned",
    "gauge",
    "Blocks pinned by in-flight loads or stores.",
    "medium",
    "reason",
)
INVARIANT_VIOLATIONS = _spec(
    "kvscope_invariant_violations",
    "gauge",
    "Broken bookkeeping invariants (free + used = capacity on every scrape; one "
    "owner per slot and no negative reference count, a window of slots per "
    "check in turn); 0 when healthy.",
    "medium",
)
ADMISSION_CANDIDATE_HIT_RATIO = _spec(
    "kvscope_admission_candidate_hit_ratio",
    "gauge",
    "The gated policy's miniature model of each admission candidate: its recent hit ratio "
    "over a hash sample of the traffic (what the tier would hit running as that candidate).",
    "medium",
    "candidate",
)
ADMISSION_CANDIDATE_FOLLOWED = _spec(
    "kvscope_admission_candidate_followed",
    "gauge",
    "1 for the admission candidate the gated policy runs as, 0 for the others.",
    "medium",
    "candidate",
)
ADMISSION_CANDIDATE_SWITCHES_TOTAL = _spec(
    "kvscope_admission_candidate_switches_total",
    "counter",
    "Times the gated policy changed the admission candidate it runs as.",
    "medium",
)
MANAGER_OPERATION_DURATION_SECONDS = _spec(
    "kvscope_manager_operation_duration_seconds",
    "histogram",
    "Latency of manager calls that evict and allocate.",
    "medium",
    "operation",
)
TRANSFER_JOBS_SUBMITTED_TOTAL = _spec(
    "kvscope_transfer_jobs_submitted_total", "counter", "Transfer jobs submitted.", "direction"
)
TRANSFER_JOBS_TOTAL = _spec(
    "kvscope_transfer_jobs_total",
    "counter",
    "Transfer jobs finished, by outcome (ok, failed).",
    "direction",
    "outcome",
)
TRANSFER_JOBS_REFUSED_TOTAL = _spec(
    "kvscope_transfer_jobs_refused_total",
    "counter",
    "Transfer jobs refused at submit: as many jobs as the backend holds were in flight or "
    "finished but not yet polled.",
    "direction",
)
TRANSFER_BLOCKS_TOTAL = _spec(
    "kvscope_transfer_blocks_total",
    "counter",
    "Offloaded blocks in finished transfer jobs.",
    "direction",
    "outcome",
)
TRANSFER_BYTES_TOTAL = _spec(
    "kvscope_transfer_bytes_total",
    "counter",
    "Bytes moved by successful transfer jobs.",
    "direction",
)
TRANSFER_DURATION_SECONDS = _spec(
    "kvscope_transfer_duration_seconds",
    "histogram",
    "Transfer job time from submit to finish.",
    "direction",
)
TRANSFER_SIZE_BYTES = _spec(
    "kvscope_transfer_size_bytes", "histogram", "Bytes per transfer job.", "direction"
)
PUBLISHER_FRAMES_TOTAL = _spec(
    "kvscope_publisher_frames_total",
    "counter",
    "Frames handed to the PUB socket, by kind (kv_events, stats).",
    "kind",
)
PUBLISHER_DROPPED_FRAMES_TOTAL = _spec(
    "kvscope_publisher_dropped_frames_total",
    "counter",
    "Frames dropped because the consumer was slow or absent.",
)
PUBLISHER_UNSENDABLE_EVENTS_TOTAL = _spec(
    "kvscope_publisher_unsendable_events_total",
    "counter",
    "Events left out of their batch: msgpack cannot carry one of their hashes.",
)
PUBLISHER_REPLAY_REQUESTS_TOTAL = _spec(
    "kvscope_publisher_replay_requests_total",
    "counter",
    "Replay requests answered, by outcome (ok, malformed, refused).",
    "outcome",
)
PUBLISHER_TRUNCATED_REPLAYS_TOTAL = _spec(
    "kvscope_publisher_truncated_replays_total",
    "counter",
    "Replay answers cut short (replay_max_bytes or replay_budget_bytes reached); the asker "
    "counts the rest as missed.",
)

SPECS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        LOOKUPS_TOTAL,
        LOOKUP_BLOCKS_TOTAL,
        LOOKUP_HIT_BLOCKS_TOTAL,
        LOOKUP_TOKENS_TOTAL,
        LOOKUP_HIT_TOKENS_TOTAL,
        LOOKUP_MISSES_TOTAL,
        LOOKUP_MISS_BLOCKS_TOTAL,
        LOOKUP_MISS_TOKENS_TOTAL,
        MISS_MEMORY_BLOCKS,
        STORE_REQUESTED_BLOCKS_TOTAL,
        STORE_ADMITTED_BLOCKS_TOTAL,
        STORE_SKIPPED_BLOCKS_TOTAL,
        STORE_REFUSED_BLOCKS_TOTAL,
        STORE_NOT_ADMITTED_BLOCKS_TOTAL,
        STORE_REFUSALS_TOTAL,
        STORE_COMPLETED_BLOCKS_TOTAL,
        STORE_FAILED_BLOCKS_TOTAL,
        EVICTED_BLOCKS_TOTAL,
        DEAD_WRITE_BLOCKS_TOTAL,
        LOAD_BLOCKS_TOTAL,
        LOAD_COMPLETED_BLOCKS_TOTAL,
        BLOCKS_RESIDENT,
        BLOCKS_CAPACITY,
        BLOCKS_PINNED,
        INVARIANT_VIOLATIONS,
        ADMISSION_CANDIDATE_HIT_RATIO,
        ADMISSION_CANDIDATE_FOLLOWED,
        ADMISSION_CANDIDATE_SWITCHES_TOTAL,
        MANAGER_OPERATION_DURATION_SECONDS,
        TRANSFER_JOBS_SUBMITTED_TOTAL,
        TRANSFER_JOBS_TOTAL,
        TRANSFER_JOBS_REFUSED_TOTAL,
        TRANSFER_BLOCKS_TOTAL,
        TRANSFER_BYTES_TOTAL,
        TRANSFER_DURATION_SECONDS,
        TRANSFER_SIZE_BYTES,
        PUBLISHER_FRAMES_TOTAL,
        PUBLISHER_DROPPED_FRAMES_TOTAL,
        PUBLISHER_UNSENDABLE_EVENTS_TOTAL,
        PUBLISHER_REPLAY_REQUESTS_TOTAL,
        PUBLISHER_TRUNCATED_REPLAYS_TOTAL,
    )
}
"""Every worker metric by name, for the collector and for checks."""


@dataclass(slots=True)
class Snapshot:
    """Metric values at one instant, in the stats frame's generic shapes."""

    counters: list[Sample] = field(default_factory=list)
    gauges: list[Sample] = field(default_factory=list)
    histograms: list[HistogramSnapshot] = field(default_factory=list)

    def add(self, spec: MetricSpec, value: float, **labels: str) -> None:
        """Record a counter or gauge value under its definition and labels."""
        _check_labels(spec, labels)
        target = self.counters if spec.kind == "counter" else self.gauges
        target.append(Sample(name=spec.name, labels=labels, value=float(value)))

    def add_histogram(self, spec: MetricSpec, histogram: Histogram, **labels: str) -> None:
        _check_labels(spec, labels)
        counts = histogram.cumulative()
        self.histograms.append(
            HistogramSnapshot(
                name=spec.name,
                labels=labels,
                buckets=[*histogram.bounds, float("inf")],
                counts=counts,
                sum=histogram.sum,  # read apart from the buckets: may hold one observation more
                count=counts[-1],
            )
        )

    def extend(self, other: Snapshot) -> None:
        self.counters += other.counters
        self.gauges += other.gauges
        self.histograms += other.histograms


def _check_labels(spec: MetricSpec, labels: dict[str, str]) -> None:
    """A label set other than the definition's fails loudly in tests."""
    if tuple(sorted(labels)) != tuple(sorted(spec.labels)):
        raise ValueError(f"{spec.name} takes labels {spec.labels}, got {tuple(labels)}")
