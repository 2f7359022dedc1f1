"""``KVScopeOffloadingSpec``: what vLLM 0.33's ``OffloadingSpecFactory`` loads.

vLLM builds one spec per process from its ``OffloadingConfig``; the scheduler
asks it for a manager, each worker for a worker. Every key is checked when the
spec is built, before any memory is allocated.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo

from offload.cpu.config import ConfigError
from offload.cpu.manager import CPUOffloadingManager
from offload.insight.sampling import SpatialSampler
from offload.shown import shown, shown_repr
from offload.vllm.manager import KVScopeManager
from offload.vllm.settings import check_chunk_tokens, read_settings, read_store_threshold
from offload.vllm.stats import metric_definitions
from offload.vllm.worker import KVScopeWorker, build_backend
from offload.wire.endpoint_host import interface_refusal, listened_addresses, unbindable_host
from offload.wire.publisher import BindError, EventPublisher
from offload.worker_telemetry import WorkerTelemetry

CONFIG_INFO_KEYS = (*CPUOffloadingInfo.config_info_keys(), "eviction_policy")
"""vLLM's CPU tier's labels on ``vllm:kv_offload_config_info``, and kvscope's policy."""


class KVScopeOffloadingSpec(OffloadingSpec):
    """kvscope's CPU tier as a vLLM offloading backend."""

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions(read_store_threshold(extra_config))

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        return CONFIG_INFO_KEYS

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        # vLLM offers the single-copy (replicated) layout to every MLA model under tensor
        # parallelism on one node; a backend takes the offer by setting its spec's
        # replicated_layout, which vLLM's connector worker reads. kvscope keeps one copy per
        # worker (and sizes the tier so), so it declines: refusing stopped such engines.
        self.replicated_layout = False
        self.settings = read_settings(
            self.extra_config,
            worker_kv_bytes_per_block=config.worker_kv_bytes_per_block,
            world_size=config.parallel.world_size,
            blocks_per_chunk=self.blocks_per_chunk,
            data_parallel_rank=config.parallel.data_parallel_index,
            data_parallel_size=config.parallel.data_parallel_size,
        )
        self.chunk_tokens = {
            group.group_id: group.tokens_per_block * self.blocks_per_chunk
            for group in config.groups
        }
        """Tokens of one chunk by KV cache group index (the offload key's): groups may differ."""
        tokens = self.tokens_per_block[0] if self.tokens_per_block else 1
        self.tokens_per_chunk = tokens * self.blocks_per_chunk
        """The first group's, the tier's unit for its token counts."""
        check_chunk_tokens(self.extra_config, (self.tokens_per_chunk, *self.chunk_tokens.values()))
        self._manager: KVScopeManager | None = None
        self._worker: KVScopeWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            # The publisher first: an endpoint that cannot be bound fails before the tier
            # is allocated.
            publisher = self._publisher()
            try:
                self._manager = self._build_manager(publisher)
            except BaseException:
                # Bound and its thread running: left open, a retry in this process (vLLM
                # building the connector again) found its own port taken.
                if publisher is not None:
                    publisher.close()
                raise
        return self._manager

    def _build_manager(self, publisher: EventPublisher | None) -> KVScopeManager:
        """The tier, its policy and its telemetry on ``publisher`` (None: no telemetry)."""
        settings = self.settings
        telemetry = None
        vllm_events = self.kv_events_config.enable_kv_cache_events
        core = CPUOffloadingManager(
            self.tokens_per_chunk,
            settings.num_chunks,
            settings.eviction_policy,
            enable_events=vllm_events or publisher is not None,
        )
        if publisher is not None:
            telemetry = WorkerTelemetry(
                core,
                engine_id=self.config.engine_id,
                rank=self.config.parallel.data_parallel_index,
                publisher=publisher,
                bytes_per_block=settings.bytes_per_chunk,
                sampler=(
                    SpatialSampler(settings.sample_rate) if settings.sample_rate > 0 else None
                ),
            )
        return KVScopeManager(
            core,
            settings,
            self.chunk_tokens or {0: self.tokens_per_chunk},
            vllm_events=vllm_events,
            telemetry=telemetry,
            config_info={
                # vLLM's own values, its tokens at max_model_len included (hybrid and
                # sliding-window groups counted as vLLM counts them).
                **CPUOffloadingInfo.from_config(
                    self.config, settings.num_chunks, settings.bytes_per_chunk
                ).as_config_info(),
                "eviction_policy": settings.eviction_policy,
            },
        )

    def _publisher(self) -> EventPublisher | None:
        """kvscope's publisher, its batches and stats frames stamped with this engine's
        data-parallel rank, as vLLM stamps its own batches; None without kvscope_endpoint."""
        endpoint = self.settings.kvscope_endpoint
        if endpoint is None:
            return None
        replay = self.settings.kvscope_replay_endpoint
        for key, bound in (("kvscope_endpoint", endpoint), ("kvscope_replay_endpoint", replay)):
            if bound is not None:
                _check_bindable(key, bound)
        rank = self.config.parallel.data_parallel_index
        try:
            return EventPublisher(endpoint, replay, data_parallel_rank=rank)
        except BindError as exc:
            key = "kvscope_endpoint" if exc.endpoint == endpoint else "kvscope_replay_endpoint"
            # ZMQ's reason quotes an ipc path raw, and a path may hold a newline or an escape.
            raise ConfigError(
                f"{key}: cannot bind {shown_repr(exc.endpoint)} (data-parallel rank {rank}) "
                f"on this host: {shown(exc.strerror)}"
            ) from exc

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            backend = build_backend(kv_caches, self.blocks_per_chunk, self.settings.num_chunks)
            self._worker = KVScopeWorker(backend)
        return self._worker


def _check_bindable(key: str, endpoint: str) -> None:
    """Refuse ``key``'s ``endpoint`` where this host cannot bind it, as the sidecar refuses
    its ``--listen``: a zone naming no interface here (``interface_refusal``), or a host name
    ZMQ binds no address for (``listened_addresses``, ``unbindable_host``), such as
    ``tcp://LO:5560``, which ZMQ's bind refused as "No such device", saying nothing of what
    a name to bind is.

    Here, where the scheduler binds: ``read_settings`` checks the endpoints by shape only,
    in every process, on every node.
    """
    refusal = interface_refusal(endpoint)
    if refusal is None:
        found = listened_addresses([endpoint]).get(endpoint)
        refusal = unbindable_host(found) if isinstance(found, str) else None
    if refusal is not None:
        raise ConfigError(f"{key}={shown_repr(endpoint)} {refusal}")
