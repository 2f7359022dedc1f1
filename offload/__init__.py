"""kvscope's offloading core: a CPU tier for KV-cache blocks, instrumented.

Imported inside the inference worker; never imports the sidecar (``app``).
docs/ARCHITECTURE.md maps the subpackages.
"""

from offload.base import (
    BlockHash,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
)
from offload.cpu.block_pool import Block, BlockPool
from offload.cpu.load_store_spec import CPULoadStoreSpec
from offload.cpu.manager import CPUOffloadingManager
from offload.cpu.policies import (
    CachePolicy,
    MetadataBound,
    PolicyContractError,
    make_policy,
    policy_names,
    register_policy,
)

__all__ = [
    "Block",
    "BlockHash",
    "BlockPool",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CachePolicy",
    "LoadStoreSpec",
    "MetadataBound",
    "OffloadingEvent",
    "OffloadingManager",
    "PolicyContractError",
    "PrepareStoreOutput",
    "make_policy",
    "policy_names",
    "register_policy",
]
