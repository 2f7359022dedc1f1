"""kvscope inside vLLM 0.33: the out-of-tree offloading spec and what it builds.

Users load it with ``{"spec_name": "KVScopeOffloadingSpec", "spec_module_path":
"offload.vllm"}`` in ``kv_connector_extra_config``. This package is the only
part of kvscope that imports vLLM, and only vLLM's factory imports it.
"""

from offload.vllm.spec import KVScopeOffloadingSpec

__all__ = ["KVScopeOffloadingSpec"]
