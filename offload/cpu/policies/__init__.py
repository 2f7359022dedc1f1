"""Eviction policies for the CPU tier, and the registry that names them."""

from offload.cpu.policies.arc import ARCCachePolicy
from offload.cpu.policies.cache_policy import CachePolicy
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.cpu.policies.guarded import GuardedPolicy, PolicyContractError
from offload.cpu.policies.lru import LRUCachePolicy
from offload.cpu.policies.metadata_bound import MetadataBound
from offload.cpu.policies.registry import make_policy, policy_names, register_policy

__all__ = [
    "ARCCachePolicy",
    "CachePolicy",
    "GatedLRUCachePolicy",
    "GuardedPolicy",
    "LRUCachePolicy",
    "MetadataBound",
    "PolicyContractError",
    "make_policy",
    "policy_names",
    "register_policy",
]
