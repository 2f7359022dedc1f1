"""kvscope's offloading core: a CPU tier for KV-cache blocks, instrumented.

Imported inside the inference worker; never imports the sidecar (``app``).
"""

from offload.block_pool import Block, BlockPool
from offload.cpu_manager import CPUOffloadingManager
from offload.events import BlockHash, OffloadingEvent
from offload.load_store_spec import CPULoadStoreSpec, LoadStoreSpec
from offload.offloading_manager import OffloadingManager, PrepareStoreOutput
from offload.policies import CachePolicy, make_policy, policy_names, register_policy

__all__ = [
    "Block",
    "BlockHash",
    "BlockPool",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CachePolicy",
    "LoadStoreSpec",
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "make_policy",
    "policy_names",
    "register_policy",
]
