"""kvscope inside vLLM 0.33: the out-of-tree offloading spec and what it builds.

Users load it with ``{"spec_name": "KVScopeOffloadingSpec", "spec_module_path":
"offload.vllm"}`` in ``kv_connector_extra_config``. This package is the only
part of kvscope that imports vLLM, and only vLLM's factory imports it.
"""

import sys
from typing import NoReturn

from offload.shown import shown_repr
from offload.vllm.spec import KVScopeOffloadingSpec

__all__ = ["KVScopeOffloadingSpec"]


def __getattr__(name: str) -> NoReturn:
    """Refuse a name this package lacks, saying what ``spec_name`` must be.

    vLLM's factory reads ``spec_name`` as an attribute of the module
    ``spec_module_path`` names, with ``getattr`` and nothing around it: a
    misspelt name failed in Python's own AttributeError, naming neither key.
    This is the one point of a wrong ``spec_name`` that reaches kvscope.
    """
    raise AttributeError(
        f"module 'offload.vllm' has no attribute {shown_repr(name)}; as "
        "kv_connector_extra_config spec_name (with spec_module_path 'offload.vllm') "
        "kvscope's spec is 'KVScopeOffloadingSpec'",
        name=name,
        obj=sys.modules[__name__],
    )
