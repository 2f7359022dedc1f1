"""Out-of-tree policies for tests: registered only while a block runs, as a plug-in is."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from offload import CachePolicy, CPUOffloadingManager, register_policy
from offload.cpu.policies import LRUCachePolicy, registry


class PluginLRU(LRUCachePolicy):
    """kvscope's LRU registered from outside: the same decisions, behind the guard."""

    name = "plugin-lru"


@contextmanager
def registered(*policy_classes: type[CachePolicy]) -> Iterator[None]:
    """The classes in the policy registry while the block runs, and only then."""
    saved = dict(registry._POLICIES)
    try:
        for policy_cls in policy_classes:
            register_policy(policy_cls)
        yield
    finally:
        registry._POLICIES.clear()
        registry._POLICIES.update(saved)


def plugin_manager(policy_cls: type[CachePolicy], capacity: int) -> CPUOffloadingManager:
    """A manager with events on over ``policy_cls``, registered for the manager's making."""
    with registered(policy_cls):
        return CPUOffloadingManager(16, capacity, policy_cls.name, enable_events=True)
