"""kvscope's worker on vLLM 0.33's canonical caches, and its metrics through vLLM's hook."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import prometheus_client
import pytest
import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from bench.tooling.vllm_config import SPEC, kvscope_manager, offloading_config
from offload.transfer import CPUTransferBackend, KVLayout
from offload.vllm import KVScopeOffloadingSpec
from offload.vllm import worker as worker_module
from offload.vllm.worker import KVScopeWorker
from offload.wire.log_limit import LogLimiter

PAGE = 256
GPU_BLOCKS = 16


def _caches() -> CanonicalKVCaches:
    tensors = [torch.randint(-128, 127, (GPU_BLOCKS, PAGE), dtype=torch.int8) for _ in range(2)]
    return CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor, PAGE) for tensor in tensors],
        group_data_refs=[[CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE)]],
    )


def _finished(worker, job_ids: set[int]) -> dict[int, bool]:
    worker.wait(job_ids)
    done: dict[int, bool] = {}
    deadline = time.monotonic() + 10
    while set(done) != job_ids and time.monotonic() < deadline:
        done.update((result.job_id, result.success) for result in worker.get_finished())
    return done


def test_the_worker_moves_canonical_pages_byte_exactly() -> None:
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 8}))
    caches = _caches()
    original = [t.tensor.clone() for t in caches.tensors]
    worker = spec.get_worker(caches)
    try:
        assert worker.submit_store(
            7, GPULoadStoreSpec([3, 5, 9], [3], [0]), CPULoadStoreSpec([0, 6, 2])
        )
        assert _finished(worker, {7}) == {7: True}
        for cache in caches.tensors:
            cache.tensor.zero_()
        assert worker.submit_load(
            8, CPULoadStoreSpec([6, 2, 0]), GPULoadStoreSpec([1, 2, 4], [3], [0])
        )
        assert _finished(worker, {8}) == {8: True}
        for before, cache in zip(original, caches.tensors, strict=True):
            assert torch.equal(cache.tensor[1], before[5])
            assert torch.equal(cache.tensor[2], before[9])
            assert torch.equal(cache.tensor[4], before[3])
        # A job naming a slot outside the tier is refused; vLLM is told so.
        assert not worker.submit_store(9, GPULoadStoreSpec([1], [1], [0]), CPULoadStoreSpec([8]))
        assert worker.rejected_jobs == 1
    finally:
        worker.shutdown()


def test_jobs_that_start_or_end_inside_a_chunk_move_the_right_pages() -> None:
    """With chunks of two GPU blocks, vLLM loads from a chunk's second half after a GPU
    prefix-cache hit and stores a prompt's last, half-filled chunk, naming where each KV
    cache group's blocks start in ``block_indices``; its connector asserts that every
    submit succeeds."""
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 8}, blocks_per_chunk=2))
    caches = _caches()
    original = [t.tensor.clone() for t in caches.tensors]
    worker = spec.get_worker(caches)
    try:
        # the request's blocks 0..4 (GPU 3, 5, 9, 10, 11) into chunks 6, 2, 0; 0 half full
        assert worker.submit_store(
            1, GPULoadStoreSpec([3, 5, 9, 10, 11], [5], [0]), CPULoadStoreSpec([6, 2, 0])
        )
        assert _finished(worker, {1}) == {1: True}
        # block 0 is a GPU prefix-cache hit: load the request's blocks 1..4 into GPU 12..15
        assert worker.submit_load(
            2, CPULoadStoreSpec([6, 2, 0]), GPULoadStoreSpec([12, 13, 14, 15], [4], [1])
        )
        assert _finished(worker, {2}) == {2: True}
        # two KV cache groups in one job: the request's block 1 of the first (chunk 6's
        # second half) into GPU 0, blocks 2 and 3 of the second (chunk 2) into GPU 1 and 2
        assert worker.submit_load(
            3, CPULoadStoreSpec([6, 2]), GPULoadStoreSpec([0, 1, 2], [1, 2], [1, 2])
        )
        assert _finished(worker, {3}) == {3: True}
        for before, cache in zip(original, caches.tensors, strict=True):
            for gpu, source in zip(
                [12, 13, 14, 15, 0, 1, 2], [5, 9, 10, 11, 5, 9, 10], strict=True
            ):
                assert torch.equal(cache.tensor[gpu], before[source])
        assert worker.rejected_jobs == 0
    finally:
        worker.shutdown()


def test_the_worker_refuses_what_it_could_not_report_once_and_tells_vllm_with_false() -> None:
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 8}))
    worker = spec.get_worker(_caches())
    try:
        assert worker.submit_store(5, GPULoadStoreSpec([1], [1], [0]), CPULoadStoreSpec([1]))
        # The same id again before the first is reported: vLLM would hear of id 5 twice.
        assert not worker.submit_store(5, GPULoadStoreSpec([2], [1], [0]), CPULoadStoreSpec([2]))
        assert worker.rejected_jobs == 1
        assert _finished(worker, {5}) == {5: True}
        # Reported, the id is free again.
        assert worker.submit_load(
            5, CPULoadStoreSpec([1]), GPULoadStoreSpec([3], [1], [0]), expedited=True
        )
        assert _finished(worker, {5}) == {5: True}
    finally:
        worker.shutdown()


def test_a_failed_transfer_is_logged_with_its_cause_before_vllm_hears_of_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's connector asserts each result's success with no message: the engine stops,
    and the copy's own error must already be in the log, or the cause is lost."""
    # The worker's limiter is the module's: a failure another test logged within its
    # interval would hold this test's line back. A fresh one starts this test clean.
    monkeypatch.setattr(
        worker_module, "_log", LogLimiter(logging.getLogger(worker_module.__name__))
    )

    def fail_job_0(job_id: int) -> None:
        if job_id == 0:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    worker = KVScopeWorker(
        CPUTransferBackend(KVLayout.from_canonical(_caches()), 8, on_job_start=fail_job_0)
    )
    try:
        with caplog.at_level(logging.ERROR, logger="offload.vllm.worker"):
            assert worker.submit_store(41, GPULoadStoreSpec([1], [1], [0]), CPULoadStoreSpec([1]))
            assert worker.submit_store(42, GPULoadStoreSpec([2], [1], [0]), CPULoadStoreSpec([2]))
            assert _finished(worker, {41, 42}) == {41: False, 42: True}
        failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
        assert failures == [
            "kvscope gpu_to_cpu job 41 (1 chunk(s)) failed: "
            "RuntimeError: CUDA error: an illegal memory access was encountered"
        ]
    finally:
        worker.shutdown()


class _PolledAtOnce(CPUTransferBackend):
    """A real backend after whose every submit another thread calls ``get_finished``, once
    the job is done: a poller landing between the backend taking a job and the worker
    mapping it to vLLM's id."""

    worker: KVScopeWorker | None = None
    pollers: list[threading.Thread]
    reported: list

    def submit(self, *args, **kwargs) -> int:
        own = super().submit(*args, **kwargs)
        self.wait(own)
        assert self.worker is not None
        poller = threading.Thread(target=lambda: self.reported.extend(self.worker.get_finished()))
        poller.start()
        poller.join(0.5)  # it finishes now unless the worker keeps it out until it is mapped
        self.pollers.append(poller)
        return own


def test_a_job_finished_before_another_thread_polls_is_reported_exactly_once() -> None:
    layout = KVLayout.from_canonical(_caches())
    backend = _PolledAtOnce(layout, 8)
    backend.pollers, backend.reported = [], []
    worker = backend.worker = KVScopeWorker(backend)
    try:
        assert worker.submit_store(7, GPULoadStoreSpec([1], [1], [0]), CPULoadStoreSpec([1]))
        for poller in backend.pollers:
            poller.join()
        reported = [r.job_id for r in backend.reported + worker.get_finished()]
        assert reported == [7]  # not dropped as another caller's job
        worker.wait({7})  # done and reported: nothing to wait for
        # Reported, the id is free again.
        assert worker.submit_store(7, GPULoadStoreSpec([2], [1], [0]), CPULoadStoreSpec([2]))
        assert worker.rejected_jobs == 0
    finally:
        worker.shutdown()


def test_the_time_vllm_is_told_is_the_copy_not_its_wait_in_the_queue() -> None:
    """vLLM adds each result's transfer_time to its offload time metric, as its own handler
    measures it on the copy: submit-to-finish counted every queued job's wait too."""
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 8}))
    worker = spec.get_worker(_caches())
    held = threading.Event()
    worker.backend._on_job_start = lambda job_id: held.wait() if job_id == 0 else None
    try:
        assert worker.submit_store(1, GPULoadStoreSpec([1], [1], [0]), CPULoadStoreSpec([1]))
        assert worker.submit_store(2, GPULoadStoreSpec([2], [1], [0]), CPULoadStoreSpec([2]))
        queued_since = time.perf_counter()
        while time.perf_counter() - queued_since < 0.05:
            pass  # job 2 waits in the queue behind the held job 1 all this while
        released = time.perf_counter()
        held.set()
        worker.wait({2})
        reported = {r.job_id: r.transfer_time for r in worker.get_finished()}
        # Job 2's worker took it up after the release: its copy began no earlier.
        assert reported[2] <= time.perf_counter() - released
    finally:
        held.set()
        worker.shutdown()


def test_manager_metrics_reach_vllms_prometheus_hook() -> None:
    extra = {**SPEC, "num_cpu_blocks": 4}
    vllm_config = SimpleNamespace(
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=extra
        )
    )
    registry = prometheus_client.CollectorRegistry()

    def bound(cls):
        return lambda *args, **kwargs: cls(*args, registry=registry, **kwargs)

    prom = OffloadPromMetrics(
        vllm_config,
        {
            prometheus_client.Gauge: bound(prometheus_client.Gauge),
            prometheus_client.Counter: bound(prometheus_client.Counter),
            prometheus_client.Histogram: bound(prometheus_client.Histogram),
        },
        ["engine"],
        {0: ["0"]},
    )
    manager = KVScopeOffloadingSpec(offloading_config(extra)).get_manager()
    ctx = ReqContext(req_id="r")
    keys = [make_offload_key(bytes([n]) * 8, 0) for n in range(6)]
    manager.prepare_store(keys[:4], ctx)
    manager.complete_store(keys[:4], ctx)
    manager.lookup(keys[0], ctx)
    manager.prepare_store(keys[4:], ctx)
    prom.observe(manager.get_stats().data, 0)
    text = prometheus_client.generate_latest(registry).decode()
    assert 'kvscope_lookup_hit_blocks_total{engine="0",medium="CPU"} 1.0' in text
    assert (
        'kvscope_evicted_blocks_total{engine="0",medium="CPU",policy="lru",reason="capacity"} 2.0'
        in text
    )
    assert 'vllm:kv_offload_cpu_cache_write_usage_perc{engine="0"} 0.5' in text
    # Counters go over as increases: a second step with nothing new adds nothing.
    prom.observe(manager.get_stats().data, 0)
    text = prometheus_client.generate_latest(registry).decode()
    assert 'kvscope_lookup_hit_blocks_total{engine="0",medium="CPU"} 1.0' in text


def test_usage_gauges_count_a_chunk_read_by_several_requests_once_as_vllm_does() -> None:
    """Three requests share a prefix and load it in one step: the tier is full, not 3x full."""
    gauges = (
        CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC,
        CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC,
        CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC,
    )
    readings = []
    for manager in (kvscope_manager(4), CPUOffloadingManager(4, "lru")):
        keys = [make_offload_key(bytes([n]) * 8, 0) for n in range(3)]
        writer = ReqContext("writer")
        manager.on_new_request(writer)
        output = manager.prepare_store(keys[:2], writer)
        manager.complete_store(output.keys_to_store, writer)
        manager.prepare_store(keys[2:], writer)  # one chunk being written
        readers = [ReqContext(f"reader{n}") for n in range(3)]
        steps = []
        for reader in readers:
            manager.on_new_request(reader)
            manager.prepare_load(keys[:2], reader)
        steps.append(manager.get_stats().data["data"])
        for reader in readers:
            manager.complete_load(keys[:2], reader)
            steps.append(manager.get_stats().data["data"])
        readings.append([[data[name][()] for name in gauges] for data in steps])
    kvscope, vllm = readings
    assert kvscope == vllm
    assert kvscope[0] == [0.75, 0.5, 0.25]  # two chunks read, one written, of four
    assert kvscope[-1] == [0.25, 0.0, 0.25]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_worker_moves_cuda_pages_byte_exactly() -> None:
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 8}))
    caches = _caches()
    for cache in caches.tensors:
        cache.tensor = cache.tensor.cuda()
    original = [t.tensor.clone() for t in caches.tensors]
    worker = spec.get_worker(caches)
    try:
        assert worker.submit_store(1, GPULoadStoreSpec([3, 5], [2], [0]), CPULoadStoreSpec([0, 6]))
        assert _finished(worker, {1}) == {1: True}
        for cache in caches.tensors:
            cache.tensor.zero_()
        assert worker.submit_load(2, CPULoadStoreSpec([6, 0]), GPULoadStoreSpec([1, 2], [2], [0]))
        assert _finished(worker, {2}) == {2: True}
        torch.cuda.synchronize()
        for before, cache in zip(original, caches.tensors, strict=True):
            assert torch.equal(cache.tensor[1], before[5])
            assert torch.equal(cache.tensor[2], before[3])
    finally:
        worker.shutdown()
