"""vLLM 0.33's own ``Scheduler`` and ``OffloadingConnector`` on kvscope's spec, with no model.

vLLM's scheduler decides what runs each step (which waiting request it
admits, which waits for GPU blocks, which lookup it defers); this plays the
model runner and the worker around it: each step samples a token for every
request whose prompt is done and reports the step's transfer jobs finished
(loads as received), or holds them until a later step. vLLM needs a model
config to build its scheduler, so a one-layer config of an architecture
registered here (never run) stands for one: vLLM's real models cannot be
imported here (vLLM is installed without their dependencies).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from vllm import ModelRegistry
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from bench.tooling.vllm_config import SPEC
from offload.vllm.manager import KVScopeManager
from tests.vllm.kv_cache_configs import shared_pool_config
from tests.vllm.vllm_request import vllm_request

BLOCK_TOKENS = 16
ARCHITECTURE = "KVScopeSchedulerOnlyLM"


class _SchedulerOnlyModel(nn.Module):
    """The model vLLM's config names: vLLM inspects its interface; nothing here runs it."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


ModelRegistry.register_model(ARCHITECTURE, _SchedulerOnlyModel)
init_none_hash(sha256)


class Engine:
    """vLLM's scheduler with kvscope's CPU tier, stepped as vLLM's engine core steps it."""

    def __init__(
        self,
        model_dir: Path,
        num_gpu_blocks: int,
        extra: dict[str, Any],
        token_budget: int = 1024,
        prefill_chunk: int = 0,
    ) -> None:
        """``token_budget``: the tokens one step schedules at most (vLLM's
        ``max_num_batched_tokens``); a long prompt is prefilled over several steps.
        ``prefill_chunk``: the tokens of one prompt a step schedules at most while another
        request runs or waits (vLLM's ``long_prefill_token_threshold``; 0: no such bound)."""
        (model_dir / "config.json").write_text(
            json.dumps(
                {
                    "architectures": [ARCHITECTURE],
                    "model_type": "llama",
                    "hidden_size": 64,
                    "intermediate_size": 128,
                    "num_attention_heads": 2,
                    "num_key_value_heads": 1,
                    "num_hidden_layers": 1,
                    "vocab_size": 1000,
                    "max_position_embeddings": 4096,
                }
            )
        )
        model = ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, dtype="float16", max_model_len=4096
        )
        config = VllmConfig(
            model_config=model,
            cache_config=CacheConfig(block_size=BLOCK_TOKENS, enable_prefix_caching=True),
            device_config=DeviceConfig("cpu"),
            scheduler_config=SchedulerConfig(
                max_num_seqs=8,
                max_num_batched_tokens=token_budget,
                long_prefill_token_threshold=prefill_chunk,
                max_model_len=4096,
                is_encoder_decoder=False,
            ),
            kv_transfer_config=KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_connector_extra_config={**SPEC, **extra},
            ),
        )
        config.cache_config.num_gpu_blocks = num_gpu_blocks
        spec = FullAttentionSpec(
            block_size=BLOCK_TOKENS, num_kv_heads=1, head_size=8, dtype=torch.float16
        )
        self.scheduler = Scheduler(
            config,
            shared_pool_config([spec], num_gpu_blocks),
            StructuredOutputManager(config),
            block_size=BLOCK_TOKENS,
            log_stats=True,
        )
        connector = self.scheduler.connector
        assert connector is not None
        manager = connector.connector_scheduler.manager  # type: ignore[attr-defined]
        assert isinstance(manager, KVScopeManager)
        self.manager = manager
        self.hasher = get_request_block_hasher(BLOCK_TOKENS, sha256)
        self.held: set[int] = set()
        self.loading: set[str] = set()
        """Jobs handed to the worker and not reported finished yet; the requests they load."""
        self.external_queries = 0
        self.external_hits = 0
        """vLLM's own count of its connector's prefix-cache queries and hits, in tokens."""

    def add(self, req_id: str, tokens: Iterable[int], max_tokens: int) -> Request:
        request = vllm_request(req_id, tokens, max_tokens, self.hasher)
        self.scheduler.add_request(request)
        return request

    def step(self, hold: bool = False) -> SchedulerOutput:
        """One engine step: schedule, run (a token for each request whose prompt is done), and
        report the jobs held so far and this step's finished, unless ``hold``."""
        scheduler = self.scheduler
        output = scheduler.schedule()
        meta = output.kv_connector_metadata
        self.held.update(meta.load_jobs, meta.store_jobs)  # type: ignore[attr-defined]
        self.loading.update(job.req_id for job in meta.load_jobs.values())  # type: ignore[attr-defined]
        done: set[int] = set()
        loaded: set[str] = set()
        if not hold:
            done, self.held, loaded, self.loading = self.held, set(), self.loading, set()
        scheduled = list(output.num_scheduled_tokens)
        requests = scheduler.requests  # schedule() counted this step's tokens computed
        sampled = [
            [7] if requests[req_id].num_computed_tokens >= requests[req_id].num_tokens else []
            for req_id in scheduled
        ]
        worker = OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(done, 1))
        runner = ModelRunnerOutput(
            req_ids=scheduled,
            req_id_to_index={req_id: index for index, req_id in enumerate(scheduled)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_recving=loaded, kv_connector_worker_meta=worker
            ),
        )
        for outputs in scheduler.update_from_output(output, runner).values():
            stats = outputs.scheduler_stats
            external = stats.connector_prefix_cache_stats if stats is not None else None
            if external is not None:
                self.external_queries += external.queries + external.preempted_queries
                self.external_hits += external.hits + external.preempted_hits
        return output
