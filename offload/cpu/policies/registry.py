"""Policies by name, so configuration can pick one with a string."""

from __future__ import annotations

from offload.cpu.policies.arc import ARCCachePolicy
from offload.cpu.policies.cache_policy import CachePolicy
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.cpu.policies.lru import LRUCachePolicy

_POLICIES: dict[str, type[CachePolicy]] = {
    LRUCachePolicy.name: LRUCachePolicy,
    ARCCachePolicy.name: ARCCachePolicy,
    GatedLRUCachePolicy.name: GatedLRUCachePolicy,
}


def policy_names() -> list[str]:
    """The names a configuration may use, in registration order."""
    return list(_POLICIES)


def register_policy(policy_cls: type[CachePolicy]) -> type[CachePolicy]:
    """Add an out-of-tree policy under its ``name``; usable as a class decorator."""
    name = getattr(policy_cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{policy_cls.__name__} needs a non-empty string 'name' to register")
    if name in _POLICIES and _POLICIES[name] is not policy_cls:
        raise ValueError(f"cache policy {name!r} is already registered")
    _POLICIES[name] = policy_cls
    return policy_cls


def make_policy(name: str, capacity: int) -> CachePolicy:
    """Build the policy registered as ``name``; unknown names list the known ones."""
    policy_cls = _POLICIES.get(name)
    if policy_cls is None:
        raise ValueError(f"unknown cache policy {name!r}; known policies: {', '.join(_POLICIES)}")
    return policy_cls(capacity)
