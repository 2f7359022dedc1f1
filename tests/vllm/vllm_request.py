"""A vLLM 0.33 ``Request`` as its engine makes one, for the tests that drive vLLM's own
scheduler or connector: one place where vLLM's request constructor is called."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from vllm import SamplingParams
from vllm.v1.core.kv_cache_utils import BlockHash
from vllm.v1.request import Request


def vllm_request(
    req_id: str,
    tokens: Iterable[int],
    max_tokens: int,
    hasher: Callable[[Request], list[BlockHash]],
) -> Request:
    """A request for ``tokens`` that samples ``max_tokens`` tokens, whatever they are (no
    end-of-sequence token stops it early: the tests play the model), its blocks hashed by
    ``hasher``."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, 2)
    return Request(
        request_id=req_id,
        prompt_token_ids=list(tokens),
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
    )
