"""The built-in inference-worker stand-in: a trace driven through both tiers.

``kvscope demo`` needs a worker that behaves like vLLM with kvscope's
offloading connector, without a GPU or vLLM: this worker runs a trace,
request by request, through a model of vLLM's GPU prefix cache
(``GPUPrefixCache``) and, for what that misses, the real manager and real
CPU transfers (a store is a GPU->CPU job, a hit a CPU->GPU job, completed
asynchronously when the job finishes). It publishes both tiers' events on
one stream (GPU ones with medium "GPU", as vLLM's publisher names them) and
the CPU tier's stats frames, so the sidecar draws a two-tier picture. The
"GPU" KV tensors are small CPU tensors: their content does not matter, the
bytes moved do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from offload.base import BlockHash
from offload.cpu.manager import CPUOffloadingManager
from offload.sim.gpu_prefix_cache import GPUPrefixCache
from offload.sim.mooncake import BUNDLED_TRACE_BLOCK_SIZE
from offload.transfer import CPUTransferBackend, Direction, KVLayout, TransferResult
from offload.wire.publisher import Publisher
from offload.wire.sample_buffer import Sampler
from offload.worker_telemetry import WorkerTelemetry


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What the demo worker looks like: its tier, its pace and its KV geometry."""

    policy: str = "lru"
    capacity_blocks: int = 2000
    block_size: int = BUNDLED_TRACE_BLOCK_SIZE
    requests_per_s: float = 200.0
    stats_period_s: float = 1.0
    engine_id: str = "demo"
    num_layers: int = 2
    num_gpu_blocks: int = 1024
    """Rows of the stand-in KV tensors: more than the longest request in blocks, so one
    job never names a GPU block twice. Not the prefix cache's size (``gpu_cache_blocks``)."""
    gpu_cache_blocks: int | None = None
    """Blocks the GPU prefix cache holds; None: a quarter of the CPU tier, as a GPU's
    KV cache is usually a fraction of the host memory given to offloading."""
    head_dim: int = 32
    num_heads: int = 2

    @property
    def gpu_cache_capacity(self) -> int:
        """``gpu_cache_blocks``, or its default when None (at least one block)."""
        if self.gpu_cache_blocks is not None:
            return self.gpu_cache_blocks
        return max(1, self.capacity_blocks // 4)


class DemoWorker:
    """Runs requests in a loop until stopped, with asynchronous transfers."""

    def __init__(
        self,
        requests: Sequence[Sequence[BlockHash]],
        publisher: Publisher,
        config: DemoConfig = DemoConfig(),
        sampler: Sampler | None = None,
    ) -> None:
        """``sampler`` (offload.insight.sampling.SpatialSampler) turns on the sampled access
        stream: the references each request makes to the CPU tier, on the sample topic."""
        if not requests:
            raise ValueError("the demo worker needs at least one request")
        longest = max(map(len, requests))
        if longest > config.num_gpu_blocks:  # a job would name a GPU block twice
            raise ValueError(
                f"a request of {longest:,} blocks is longer than the GPU's "
                f"{config.num_gpu_blocks:,} (DemoConfig.num_gpu_blocks): raise it to at least "
                f"{longest:,}"
            )
        self.config = config
        self.requests = requests
        self.manager = CPUOffloadingManager(
            config.block_size, config.capacity_blocks, config.policy, enable_events=True
        )
        self.gpu = GPUPrefixCache(config.gpu_cache_capacity, config.block_size)
        # A token per block row keeps the "GPU" cache small: the geometry is a
        # stand-in, only the number of bytes per block matters to the figures.
        gpu = [
            torch.zeros(2, config.num_gpu_blocks, 1, config.num_heads, config.head_dim,
                        dtype=torch.float16)
            for _ in range(config.num_layers)
        ]  # fmt: skip
        layout = KVLayout(gpu)
        self.transfers = CPUTransferBackend(layout, config.capacity_blocks)
        self.telemetry = WorkerTelemetry(
            self.manager,
            engine_id=config.engine_id,
            transfers=self.transfers.stats,
            publisher=publisher,
            bytes_per_block=layout.bytes_per_cpu_block,
            sampler=sampler,
        )
        self.requests_done = 0
        self._stores: dict[int, list[BlockHash]] = {}
        self._loads: dict[int, list[BlockHash]] = {}

    def run(self, stop: threading.Event, max_requests: int | None = None) -> None:
        """Run requests until ``stop`` is set (or ``max_requests`` are done), then drain."""
        interval = 1.0 / self.config.requests_per_s
        next_stats = next_step = time.monotonic()
        while not stop.is_set() and (max_requests is None or self.requests_done < max_requests):
            block_hashes = self.requests[self.requests_done % len(self.requests)]
            self.step(block_hashes)
            self.requests_done += 1
            now = time.monotonic()
            if now >= next_stats:
                self.telemetry.publish_stats()
                next_stats = now + self.config.stats_period_s
            next_step += interval
            # At most what a thread can wait: a rate slow enough (1e-300 a second) asks for
            # more, which raised OverflowError and ended the worker.
            stop.wait(min(max(0.0, next_step - time.monotonic()), threading.TIMEOUT_MAX))
        self._finish()

    def step(self, block_hashes: Sequence[BlockHash]) -> None:
        """One request, as vLLM with the connector runs it: GPU prefix, then the CPU tier.

        The GPU-resident prefix is a hit with nothing to move; the CPU tier is
        asked only about the rest, and its hit prefix is loaded. The blocks the
        request computed are stored to the CPU tier (so its hit ratio measures
        what it saves), every block of the request becomes GPU-resident, and
        the blocks that pushes out of the GPU are offered to the CPU tier too,
        as the connector offloads what the GPU is about to drop.
        """
        manager = self.manager
        self._complete(self.transfers.poll())
        missed = block_hashes[self.gpu.lookup(block_hashes) :]
        # What the CPU tier is asked is its access stream: the curve is that tier's.
        self.telemetry.record_request(missed)
        hits = manager.lookup(missed)
        if hits:
            loaded = list(missed[:hits])
            spec = manager.prepare_load(loaded)
            manager.touch(missed)
            job = self.transfers.submit(
                Direction.CPU_TO_GPU, spec.block_ids, self._gpu_blocks(loaded)
            )
            self._loads[job] = loaded
        computed = len(block_hashes) - len(missed) + hits  # where the tier's misses start
        self._store(block_hashes[computed:], block_hashes[computed - 1] if computed else None)
        for parent, run in self.gpu.admit(block_hashes):
            self._store(run, parent)
        self._publish_events()

    def _store(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:
        """Offer blocks (one run of a chain, under ``parent``) to the CPU tier; the ones it
        takes go out as one GPU->CPU job."""
        out = self.manager.prepare_store(list(block_hashes), parent=parent)
        if out is not None and out.block_hashes_to_store:
            stored = out.block_hashes_to_store
            job = self.transfers.submit(
                Direction.GPU_TO_CPU, self._gpu_blocks(stored), out.store_spec.block_ids
            )
            self._stores[job] = stored

    def _publish_events(self) -> None:
        """Both tiers' events since the last step, as one batch on the worker's stream."""
        events = [*self.gpu.take_events(), *self.manager.take_events()]
        self.telemetry.publisher.publish_events(events)
        self.telemetry.publish_sample()

    def _gpu_blocks(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Stand-in GPU block ids, distinct within a job as a real block table's are."""
        base = hash(block_hashes[0]) if block_hashes else 0
        count = self.config.num_gpu_blocks
        return [(base + offset) % count for offset in range(len(block_hashes))]

    def _complete(self, results: list[TransferResult]) -> None:
        for result in results:
            if result.job_id in self._stores:
                self.manager.complete_store(self._stores.pop(result.job_id), result.success)
            else:
                self.manager.complete_load(self._loads.pop(result.job_id))

    def settle(self) -> None:
        """Wait for every job in flight and complete it, so no block stays pinned."""
        for job in [*self._stores, *self._loads]:
            self.transfers.wait(job)
        self._complete(self.transfers.poll())
        self._publish_events()

    def _finish(self) -> None:
        self.settle()
        self.transfers.close()
        self.telemetry.publish_sample(force=True)
        self.telemetry.publish_stats()
