"""Policies by name, so configuration can pick one with a string."""

from __future__ import annotations

import inspect
import re
from typing import Final

from offload.base import positive_count
from offload.cpu.policies.arc import ARCCachePolicy
from offload.cpu.policies.cache_policy import CachePolicy
from offload.cpu.policies.gated_lru import GatedLRUCachePolicy
from offload.cpu.policies.guarded import GuardedPolicy
from offload.cpu.policies.lru import LRUCachePolicy
from offload.cpu.policies.metadata_bound import MetadataBound

BUILT_IN: Final = (LRUCachePolicy, ARCCachePolicy, GatedLRUCachePolicy)
"""The policies kvscope ships, held to the policy contract by its own test suites."""

OPTIMUM: Final = "opt"
"""The offline optimum's name wherever policies are compared (``kvscope replay``, sweeps):
no registered policy may take it."""

NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A policy name: what a command-line flag, a comma-separated list and a metric label carry
unquoted."""

_POLICIES: dict[str, type[CachePolicy]] = {cls.name: cls for cls in BUILT_IN}


def policy_names() -> list[str]:
    """The names a configuration may use, in registration order."""
    return list(_POLICIES)


def register_policy(policy_cls: type[CachePolicy]) -> type[CachePolicy]:
    """Add an out-of-tree policy under its ``name``; usable as a class decorator.

    Anything that could not be built as a policy, or a name that could not be
    chosen, is refused here, with the registry unchanged, rather than when a
    manager is first built with it.
    """
    if not (isinstance(policy_cls, type) and issubclass(policy_cls, CachePolicy)):
        raise TypeError(f"{policy_cls!r:.200} is not a subclass of offload.CachePolicy")
    if inspect.isabstract(policy_cls):
        missing = ", ".join(sorted(policy_cls.__abstractmethods__))
        raise TypeError(f"{policy_cls.__name__} does not implement {missing}")
    name = getattr(policy_cls, "name", None)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(
            f"{policy_cls.__name__}.name={name!r:.80} must be 1 to 64 letters, digits, '_', "
            "'.' or '-', starting with a letter or digit"
        )
    if name == OPTIMUM:
        raise ValueError(f"cache policy name {OPTIMUM!r} is the offline optimum's")
    bound = getattr(policy_cls, "metadata_bound", None)
    problems = bound.problems() if isinstance(bound, MetadataBound) else ["it is not one"]
    if problems:
        raise ValueError(
            f"{policy_cls.__name__}.metadata_bound={bound!r:.120} must be an "
            "offload.MetadataBound, the most a tier of it keeps at each capacity (see "
            f"CachePolicy): {problems[0]}"
        )
    held = _POLICIES.get(name)
    if held is not None and held is not policy_cls:
        raise ValueError(
            f"cache policy {name!r} is already registered, by {held.__module__}.{held.__name__}"
        )
    _POLICIES[name] = policy_cls
    return policy_cls


def metadata_bound(name: str) -> MetadataBound:
    """What the policy registered as ``name`` states a tier of it keeps at most."""
    return _POLICIES[name].metadata_bound


def make_policy(name: str, capacity: int) -> CachePolicy:
    """Build the policy registered as ``name``, behind a ``GuardedPolicy`` unless it is
    built in; unknown names list the known ones, and a capacity that is not a positive int
    is refused by name (a policy would take it and fail later, at its first eviction)."""
    positive_count("capacity", capacity)
    if not isinstance(name, str):
        raise TypeError(f"cache_policy must be a policy name, got {type(name).__name__}")
    policy_cls = _POLICIES.get(name)
    if policy_cls is None:
        raise ValueError(
            f"unknown cache policy {name!r:.80}; known policies: {', '.join(_POLICIES)}"
        )
    policy = policy_cls(capacity)
    return policy if policy_cls in BUILT_IN else GuardedPolicy(policy, capacity)
