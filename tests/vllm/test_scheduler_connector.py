"""vLLM 0.33's own scheduler-side connector on kvscope's spec, against vLLM's CPU spec.

The other tests here call kvscope's manager the way vLLM's connector does;
these run vLLM's ``OffloadingConnectorScheduler`` itself (lookups, load and
store jobs, preemption flushes, aborts, cache resets, events) over vLLM's
real ``KVCacheManager`` with a hybrid ``KVCacheConfig``: a full-attention
group beside a sliding-window one, of equal or different block sizes (so
the hash block is smaller than a group's block). The worker is played by
hand: it reports jobs done when told. The same script runs once with
kvscope's spec (``spec_name``/``spec_module_path`` as the README shows) and
once with vLLM's ``CPUOffloadingSpec``; tokens matched, GPU and CPU blocks of
every job and the KV events must be the same.

No model is loaded: the ``OffloadingConfig`` is built here the way vLLM's
``build_offloading_config`` builds it (with vLLM's own window and
hash-block-size helpers), since that function reads a model config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from vllm.config import CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    get_sliding_window_size_in_chunks,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

from bench.tooling.vllm_config import SPEC
from tests.vllm.kv_cache_configs import shared_pool_config
from tests.vllm.vllm_request import vllm_request

VLLM_SPEC = {"spec_name": "CPUOffloadingSpec"}
init_none_hash(sha256)  # once: each call draws a new seed, and the runs compare hashes
PAGE = 4096
"""A CPU chunk is rounded up to a page: every chunk here is one page."""


def _full(block_size: int) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16
    )


def _window(block_size: int, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=8,
        dtype=torch.float16,
        sliding_window=window,
    )


HYBRIDS = {
    "full16+swa16": (_full(16), _window(16, 32)),
    "full32+swa16": (_full(32), _window(16, 32)),  # hash block 16, full-attention block 32
    "swa16+full16": (_window(16, 32), _full(16)),
}


class Engine:
    """vLLM's scheduler connector and KV cache manager, stepped one request at a time."""

    def __init__(self, extra: dict[str, Any], specs: Iterable[KVCacheSpec]) -> None:
        specs = tuple(specs)
        num_gpu_blocks = 200
        kv_cache_config = shared_pool_config(specs, num_gpu_blocks)
        vllm_config = VllmConfig(
            cache_config=CacheConfig(block_size=16, enable_prefix_caching=True),
            device_config=DeviceConfig("cpu"),
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
            kv_transfer_config=KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_connector_extra_config=extra,
            ),
        )
        scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(
            kv_cache_config, vllm_config
        )
        blocks_per_chunk = extra.get("blocks_per_chunk", 1)
        config = OffloadingConfig(
            groups=tuple(
                OffloadingGroupConfig(
                    spec.block_size,
                    (f"layer.{i}",),
                    i,
                    sliding_window_size_in_chunks=get_sliding_window_size_in_chunks(
                        spec, spec.block_size * blocks_per_chunk
                    ),
                )
                for i, spec in enumerate(specs)
            ),
            worker_kv_bytes_per_block=sum(spec.page_size_bytes for spec in specs),
            enable_kv_cache_events=True,
            extra_config=extra,
            engine_id="engine-0",
            model=OffloadingModelConfig(name="test", dtype="float16", max_model_len=4096),
            cache=OffloadingCacheConfig(
                tokens_per_hash=hash_block_size, blocks_per_chunk=blocks_per_chunk
            ),
            parallel=OffloadingParallelConfig(
                rank=0,
                world_size=1,
                tp_size=1,
                pp_size=1,
                pcp_size=1,
                dcp_size=1,
                data_parallel_index=0,
                data_parallel_size=1,
                data_parallel_rank_local=None,
                is_parallelism_agnostic=False,
            ),
        )
        self.connector = OffloadingConnectorScheduler(
            OffloadingSpecFactory.create_spec(config), vllm_config, kv_cache_config
        )
        self.kv_cache = KVCacheManager(
            kv_cache_config,
            max_model_len=4096,
            scheduler_block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            enable_caching=True,
        )
        self.hasher = get_request_block_hasher(hash_block_size, sha256)
        self.trace: list = []
        """What the connector did: matches, jobs (GPU and CPU blocks), flushes, events."""
        self.in_flight: set[int] = set()

    def request(self, req_id: str, tokens: Iterable[int]) -> Request:
        request = vllm_request(req_id, tokens, 8, self.hasher)
        self.connector.on_new_request(request)
        return request

    def step(
        self,
        new: Iterable[NewRequestData] = (),
        scheduled: dict[str, int] | None = None,
        finished: Iterable[str] = (),
        preempted: set[str] | None = None,
    ) -> None:
        """build_connector_meta for one step; its jobs go to the (hand-played) worker."""
        output = SchedulerOutput.make_empty()
        output.scheduled_new_reqs = list(new)
        output.num_scheduled_tokens = dict(scheduled or {})
        output.total_num_scheduled_tokens = sum(output.num_scheduled_tokens.values())
        output.finished_req_ids = set(finished)
        output.preempted_req_ids = preempted
        meta = self.connector.build_connector_meta(output)
        for kind, jobs in (("load", meta.load_jobs), ("store", meta.store_jobs)):
            for job_id, job in jobs.items():
                gpu, cpu = (
                    (job.dst_spec, job.src_spec) if kind == "load" else (job.src_spec, job.dst_spec)
                )
                self.trace.append((kind, job.req_id, gpu.block_ids.tolist(), list(gpu.group_sizes)))
                self.trace.append(("cpu", cpu.block_ids.tolist()))
                self.in_flight.add(job_id)
        if meta.jobs_to_flush:
            self.trace.append(("flush", sorted(meta.jobs_to_flush)))
        self._events()

    def complete(self) -> None:
        """The worker reports every job it was given."""
        done, self.in_flight = self.in_flight, set()
        worker = OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(done, 1))
        self.connector.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=worker))
        self._events()

    def _events(self) -> None:
        """One drain's events, sorted: vLLM completes a store with a set of keys, so the
        order of its events within a drain is the set's."""
        self.trace += sorted(
            (type(event).__name__, list(getattr(event, "block_hashes", ())))
            for event in self.connector.take_events()
        )

    def lookup(self, request: Request) -> int:
        """get_num_new_matched_tokens after the GPU prefix cache, then the allocation and
        update_state_after_alloc: with a hit, its load job goes out in a step of its own."""
        blocks, local, _ = self.kv_cache.get_computed_blocks(request)
        hit, load_async = self.connector.get_num_new_matched_tokens(request, local)
        assert hit is not None
        self.trace.append(("match", request.request_id, local, hit, load_async))
        allocated = self.kv_cache.allocate_slots(
            request,
            0 if hit else request.num_tokens - local,
            num_new_computed_tokens=local,
            new_computed_blocks=blocks,
            num_external_computed_tokens=hit,
            delay_cache_blocks=bool(hit),
        )
        assert allocated is not None
        self.connector.update_state_after_alloc(
            request, self.kv_cache.get_blocks(request.request_id), hit
        )
        request.num_computed_tokens = local + hit
        if hit:
            self.step()
        return hit

    def prefill(self, request: Request, complete: bool = True) -> None:
        """The whole prompt in one step, after its lookup (and load, if any)."""
        if self.lookup(request):
            self.complete()
            self.kv_cache.cache_blocks(request, request.num_computed_tokens)
            if request.num_computed_tokens == request.num_tokens:
                request.num_computed_tokens -= 1  # vLLM recomputes the last token
            assert self.kv_cache.allocate_slots(
                request, request.num_tokens - request.num_computed_tokens
            )
        todo = request.num_tokens - request.num_computed_tokens
        request.status = RequestStatus.RUNNING
        data = NewRequestData.from_request(request, self.kv_cache.get_block_ids(request.request_id))
        self.step(new=[data], scheduled={request.request_id: todo})
        request.num_computed_tokens += todo
        if complete:
            self.complete()

    def finish(
        self,
        request: Request,
        status: RequestStatus = RequestStatus.FINISHED_STOPPED,
        complete: bool = True,
    ) -> None:
        request.status = status
        self.connector.request_finished(request)
        self.kv_cache.free(request)
        self.step(finished=[request.request_id])
        if complete:
            self.complete()

    def again(self, req_id: str, tokens: Iterable[int]) -> None:
        """A request for ``tokens`` that the GPU prefix cache cannot serve."""
        self.kv_cache.reset_prefix_cache()
        request = self.request(req_id, tokens)
        self.prefill(request)
        self.finish(request)


PROMPT = range(1, 101)  # six and a quarter blocks of 16: a partial tail


def _reuse(engine: Engine) -> None:
    """Stored, then found and loaded; a longer prompt loads the prefix and stores its tail."""
    engine.again("a", PROMPT)
    engine.again("b", PROMPT)
    engine.again("c", [*range(1, 41), *range(500, 530)])


def _abort_while_storing(engine: Engine) -> None:
    """A request aborted while its store is in flight: the store still lands."""
    a = engine.request("a", PROMPT)
    engine.prefill(a, complete=False)
    engine.finish(a, RequestStatus.FINISHED_ABORTED, complete=False)
    engine.complete()
    engine.again("b", PROMPT)


def _preempt_while_storing(engine: Engine) -> None:
    """A preemption flushes the request's store job; the request resumes and hits."""
    a = engine.request("a", PROMPT)
    engine.prefill(a, complete=False)
    engine.kv_cache.free(a)
    a.status, a.num_computed_tokens = RequestStatus.PREEMPTED, 0
    engine.step(preempted={"a"})
    engine.complete()
    engine.kv_cache.reset_prefix_cache()
    engine.prefill(a)
    engine.finish(a)
    engine.again("b", PROMPT)


def _reset_while_storing(engine: Engine) -> None:
    """A prefix-cache reset with a store in flight: its late report is dropped, and the
    request's chunks are offered again from the start."""
    a = engine.request("a", PROMPT)
    engine.prefill(a, complete=False)
    engine.connector.reset_cache()
    engine.complete()
    engine.finish(a)
    engine.again("b", PROMPT)


def _reset_while_loading(engine: Engine) -> None:
    """A prefix-cache reset with a load in flight, the loading request then aborted."""
    engine.again("a", PROMPT)
    engine.kv_cache.reset_prefix_cache()
    b = engine.request("b", PROMPT)
    assert engine.lookup(b) == 96
    engine.connector.reset_cache()
    engine.complete()
    engine.finish(b, RequestStatus.FINISHED_ABORTED)
    engine.again("c", PROMPT)
    engine.again("d", PROMPT)


def _evictions(engine: Engine) -> None:
    """A tier of 10 chunks under 4 prompts of 5 to 8 chunks each, then two of them again."""
    for number in (0, 1, 2, 3, 3, 0):
        engine.again(f"r{number}", range(1000 * number + 1, 1000 * number + 101))


SCRIPTS: dict[str, tuple[Callable[[Engine], None], int]] = {
    "reuse": (_reuse, 64),
    "abort_while_storing": (_abort_while_storing, 64),
    "preempt_while_storing": (_preempt_while_storing, 64),
    "reset_while_storing": (_reset_while_storing, 64),
    "reset_while_loading": (_reset_while_loading, 64),
    "evictions": (_evictions, 10),
}


def _trace(
    extra: dict[str, Any], hybrid: str, script: str, options: dict[str, Any] | None = None
) -> list:
    run, chunks = SCRIPTS[script]
    engine = Engine(
        {**extra, **(options or {}), "cpu_bytes_to_use": chunks * PAGE}, HYBRIDS[hybrid]
    )
    run(engine)
    engine.connector.shutdown()
    return engine.trace


@pytest.fixture(autouse=True)
def _quiet() -> Iterable[None]:
    """vLLM logs each store the tier has no room for; the trace says so already."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("hybrid", list(HYBRIDS))
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_vllms_scheduler_connector_does_the_same_on_kvscope_and_on_vllms_cpu_tier(
    hybrid: str, script: str
) -> None:
    """Tokens matched, every job's GPU and CPU blocks and every event: identical, with
    kvscope's publisher off and on (sampling every request)."""
    expected = _trace(VLLM_SPEC, hybrid, script)
    assert any(entry[0] == "load" for entry in expected) or script == "evictions"
    assert _trace(SPEC, hybrid, script) == expected
    # Nothing subscribes: any free port serves, one of the publisher's own choosing.
    published = {**SPEC, "kvscope_endpoint": "tcp://127.0.0.1:*", "sample_rate": 1.0}
    assert _trace(published, hybrid, script) == expected


@pytest.mark.parametrize(
    "options",
    [{"blocks_per_chunk": 2}, {"store_threshold": 2}],
    ids=["two blocks a chunk", "stored at the second offer"],
)
@pytest.mark.parametrize("hybrid", ["full16+swa16", "full32+swa16"])
@pytest.mark.parametrize("script", ["reuse", "evictions"])
def test_vllms_own_options_change_the_same_decisions_on_both_tiers(
    options: dict[str, Any], hybrid: str, script: str
) -> None:
    """vLLM's connector options (chunks of several blocks, the reuse threshold) through
    kvscope's spec: the same matches, jobs and events as on vLLM's CPU tier given the same
    options, which change what vLLM's tier does."""
    expected = _trace(VLLM_SPEC, hybrid, script, options)
    assert expected != _trace(VLLM_SPEC, hybrid, script)
    assert _trace(SPEC, hybrid, script, options) == expected
