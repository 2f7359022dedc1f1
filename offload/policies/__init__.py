"""Eviction policies for the CPU tier, and the registry that names them."""

from offload.policies.arc import ARCCachePolicy
from offload.policies.cache_policy import CachePolicy
from offload.policies.lru import LRUCachePolicy
from offload.policies.registry import make_policy, policy_names, register_policy

__all__ = [
    "ARCCachePolicy",
    "CachePolicy",
    "LRUCachePolicy",
    "make_policy",
    "policy_names",
    "register_policy",
]
