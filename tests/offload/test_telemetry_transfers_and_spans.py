"""Transfer metrics move exactly as jobs run; spans carry their attributes.

Spans are recorded through the real OpenTelemetry SDK with its in-memory
exporter, installed once for this module as the global tracer provider.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from offload import CPUOffloadingManager
from offload.telemetry.collector import SnapshotCollector, SnapshotSource
from offload.transfer import CPUTransferBackend, Direction, KVLayout
from offload.transfer.cpu_backend import JobHook
from offload.transfer.job import TransferResult
from offload.transfer.transfer_stats import TransferStats
from tests.support.interleaving import readings_while

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def sdk_installed() -> None:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER


def backend(on_job_start: JobHook | None = None) -> CPUTransferBackend:
    """Two layers, K/V first, 8 GPU blocks of 4 tokens x 2 heads x 8 dims in float16."""
    gpu = [torch.arange(2 * 8 * 4 * 2 * 8, dtype=torch.float16).reshape(2, 8, 4, 2, 8)] * 2
    return CPUTransferBackend(KVLayout(gpu, block_size_factor=2), 4, on_job_start=on_job_start)


def series(collector_source: SnapshotSource) -> dict[tuple, float]:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(collector_source))
    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out[(sample.name, *sorted(sample.labels.items()))] = sample.value
    return out


def test_transfer_counters_and_histograms_move_per_job(spans: InMemorySpanExporter) -> None:
    def fail_job_two(job_id: int) -> None:
        if job_id == 2:
            raise RuntimeError("injected copy failure")

    with backend(on_job_start=fail_job_two) as transfers:
        bytes_per_cpu_block = transfers.layout.bytes_per_cpu_block
        transfers.submit(Direction.GPU_TO_CPU, [0, 1, 2, 3], [0, 1])
        transfers.submit(Direction.CPU_TO_GPU, [0], [6, 7])
        transfers.submit(Direction.GPU_TO_CPU, [4, 5], [3])
        for job_id in range(3):
            transfers.wait(job_id, timeout=30)
        s = series(lambda: [(transfers.stats.snapshot(), {})])

    store, load = (("direction", "gpu_to_cpu"),), (("direction", "cpu_to_gpu"),)
    assert s[("kvscope_transfer_jobs_submitted_total", *store)] == 2
    assert s[("kvscope_transfer_jobs_submitted_total", *load)] == 1
    assert s[("kvscope_transfer_jobs_total", *store, ("outcome", "ok"))] == 1
    assert s[("kvscope_transfer_jobs_total", *store, ("outcome", "failed"))] == 1
    assert s[("kvscope_transfer_jobs_total", *load, ("outcome", "ok"))] == 1
    assert s[("kvscope_transfer_blocks_total", *store, ("outcome", "ok"))] == 2
    assert s[("kvscope_transfer_blocks_total", *store, ("outcome", "failed"))] == 1
    assert s[("kvscope_transfer_bytes_total", *store)] == 2 * bytes_per_cpu_block
    assert s[("kvscope_transfer_bytes_total", *load)] == bytes_per_cpu_block
    assert s[("kvscope_transfer_duration_seconds_count", *store)] == 2
    assert s[("kvscope_transfer_size_bytes_count", *store)] == 1  # failed jobs moved nothing
    assert s[("kvscope_transfer_size_bytes_sum", *load)] == bytes_per_cpu_block

    finished = {span.attributes["kvscope.job_id"]: span for span in spans.get_finished_spans()}
    assert set(finished) == {0, 1, 2}
    assert finished[0].name == "kvscope.transfer"
    assert dict(finished[0].attributes) == {
        "kvscope.direction": "gpu_to_cpu",
        "kvscope.job_id": 0,
        "kvscope.blocks": 2,
        "kvscope.bytes": 2 * bytes_per_cpu_block,
        "kvscope.success": True,
    }
    assert finished[2].attributes["kvscope.success"] is False
    assert finished[1].end_time >= finished[1].start_time


def test_a_manager_call_that_evicts_records_a_span(spans: InMemorySpanExporter) -> None:
    manager = CPUOffloadingManager(16, 2, "lru")
    for hashes in ([1, 2], [3]):
        out = manager.prepare_store(hashes)
        assert out is not None
        manager.complete_store(out.block_hashes_to_store)
    recorded = [s for s in spans.get_finished_spans() if s.name.startswith("kvscope.manager")]
    assert len(recorded) == 1  # the first store evicted nothing
    assert dict(recorded[0].attributes) == {
        "kvscope.policy": "lru",
        "kvscope.blocks.requested": 1,
        "kvscope.blocks.admitted": 1,
        "kvscope.blocks.evicted": 1,
    }


def test_a_snapshot_on_another_thread_never_shows_more_jobs_finished_than_submitted() -> None:
    """Jobs are submitted and finished on one thread while another takes snapshots."""
    stats = TransferStats()
    job_ids = iter(range(10**9))

    def submit_and_finish_a_job() -> None:
        stats.on_submit(Direction.GPU_TO_CPU)
        result = TransferResult(next(job_ids), Direction.GPU_TO_CPU, True, 2, 1 << 16, 1e-4)
        stats.on_finish(result)

    def submitted_and_finished() -> tuple[float, float]:
        counts = {"submitted": 0.0, "finished": 0.0}
        for sample in stats.snapshot().counters:
            if sample.labels.get("direction") != Direction.GPU_TO_CPU.value:
                continue
            if sample.name == "kvscope_transfer_jobs_submitted_total":
                counts["submitted"] += sample.value
            elif sample.name == "kvscope_transfer_jobs_total":
                counts["finished"] += sample.value
        return counts["submitted"], counts["finished"]

    readings = readings_while(submit_and_finish_a_job, submitted_and_finished, 5000)
    assert readings[-1][1] > 0
    assert [(s, f) for s, f in readings if f > s] == []
