"""Each policy's stated memory per slot holds once everything it remembers is full.

The sidecar sizes its shadow tiers by ``metadata_bytes_per_slot`` and ``TIER_BYTES``
(offload/insight/shadow.py) to keep ``KVSCOPE_INSIGHT_MAX_BYTES``: a figure below what a
policy really keeps breaks that bound silently. Each form is measured, the C one and the
Python one the sidecar's image runs (it has no compiler), in an interpreter of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from offload import register_policy
from offload.cpu.policies import LRUCachePolicy
from offload.cpu.policies.registry import BUILT_IN, metadata_bytes_per_slot, policy_names
from offload.insight.shadow import TIER_BYTES, ShadowTiers, max_bytes

CAPACITIES = (1, 5, 64, 511)
"""One slot (the fixed part's worst share), a few, and just under ``2 * MODEL_SLOTS``, where
gated's models still have as many slots as the tier: its most histories per slot."""


def measured(policy: str, *, python_forms: bool) -> dict[int, float]:
    """Bytes per slot of a full shadow tier of ``policy`` at each of ``CAPACITIES``."""
    forms = ["--python-forms"] if python_forms else []
    capacities = [str(c) for c in CAPACITIES]
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.shadow_memory", *forms, policy, *capacities],
        capture_output=True,
        text=True,
        check=True,
    )
    return {int(c): per_slot for c, per_slot in json.loads(result.stdout).items()}


@pytest.mark.parametrize("python_forms", [False, True], ids=["c_forms", "python_forms"])
@pytest.mark.parametrize("policy", policy_names())
def test_a_full_shadow_tier_keeps_no_more_than_its_policy_states(
    policy: str, python_forms: bool
) -> None:
    for capacity, per_slot in measured(policy, python_forms=python_forms).items():
        assert per_slot * capacity <= max_bytes([policy], [capacity]), (capacity, per_slot)


def test_every_built_in_policy_states_its_own_figure() -> None:
    """Inherited, a subclass's figure would be its parent's (gated's, the LRU's), whatever
    more it keeps."""
    for policy_cls in BUILT_IN:
        assert "metadata_bytes_per_slot" in vars(policy_cls), policy_cls.__name__


def test_a_policy_that_states_no_figure_is_refused() -> None:
    class Unstated(LRUCachePolicy):
        name = "unstated"
        metadata_bytes_per_slot = None  # type: ignore[assignment]

    with pytest.raises(ValueError, match="metadata_bytes_per_slot=None must be"):
        register_policy(Unstated)
    assert "unstated" not in policy_names()


def test_shadow_tiers_are_bounded_by_their_policies_figures_and_keep_no_miss_reasons() -> None:
    """The bound counts one fixed part per tier (none for a tier of 0) and each policy's
    figure per slot; nothing reads a shadow's misses, so its managers attribute none."""
    tiers = ShadowTiers(["arc", "gated"], [0, 2, 3])
    for request in ([1, 2, 3], [4, 5], [1, 2, 6], [7], [4, 8]):
        tiers.add(request)
    per_slot = metadata_bytes_per_slot("arc") + metadata_bytes_per_slot("gated")
    assert max_bytes(tiers.policies, tiers.capacities) == 4 * TIER_BYTES + 5 * per_slot
    assert tiers.estimated_bytes == 4 * TIER_BYTES + 5 * per_slot  # every slot filled
    managers = [m for ms in tiers._tiers.values() for m in ms if m is not None]
    assert all(m.misses.remembered == 0 and not any(m.misses.lookups.values()) for m in managers)
