"""Each policy's stated memory bound holds once everything it remembers is full.

The sidecar sizes its shadow tiers by ``CachePolicy.metadata_bound`` (offload/insight/
shadow.py) to keep ``KVSCOPE_INSIGHT_MAX_BYTES``, and vLLM's start-up check counts it, with
the miss reasons a worker's manager keeps (``attribution_bytes``), beside the tier's chunks:
a figure below what a tier really keeps breaks either bound silently. Each form is
measured, the C one and the Python one the sidecar's image runs (it has no compiler), in an
interpreter of its own, at capacities on both sides of where gated's models stop growing,
and of where its waiting requests (``_met``) stop growing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from offload import MetadataBound, register_policy
from offload.cpu.miss_attribution import (
    C_REMEMBERED_BYTES,
    HORIZON_CAPACITIES,
    PY_REMEMBERED_BYTES,
    attribution_bytes,
)
from offload.cpu.policies import LRUCachePolicy
from offload.cpu.policies.gated_lru import MET_CAPACITIES, MET_REQUESTS
from offload.cpu.policies.miniature import MODEL_SLOTS
from offload.cpu.policies.registry import BUILT_IN, metadata_bound, policy_names
from offload.insight.shadow import ShadowTiers, max_bytes

CAPACITIES = (1, 64, 2 * MODEL_SLOTS - 1, 2 * MODEL_SLOTS, 4 * MODEL_SLOTS - 1, 4 * MODEL_SLOTS)
"""One slot (the fixed part's worst share), a few, just under ``2 * MODEL_SLOTS``, where
gated's models still have as many slots as the tier (their most per slot), just past it,
where they have half as many, and on both sides of twice that, where they have as many
again (the capped part's tightest point past the cap) and then half as many."""
WORKER_CAPACITIES = (1, 2 * MODEL_SLOTS - 1, 2 * MET_REQUESTS // MET_CAPACITIES)
"""Capacities a worker's tier is measured at: the fixed part's worst share, gated's
costliest slots, and past where ``_met`` holds ``MET_REQUESTS`` requests (then each waits
with two blocks)."""
ATTRIBUTION_CAPACITIES = {
    (): (1, 64, 1 + 64, 1 + 256, 1 + 1024),
    ("--python-forms",): (1, 64, 1 + 306 // HORIZON_CAPACITIES, 1 + 1228 // HORIZON_CAPACITIES),
}
"""Per form, the fixed part's worst share, a capacity where no table is at its fullest, and
those where the statement is tightest: in C, a slot past a power of two (the tables double),
in Python, a generation a few hashes past a set's growth to over six slots an entry (at 307
and 1,229 entries)."""
REMEMBERED_BYTES = {(): C_REMEMBERED_BYTES, ("--python-forms",): PY_REMEMBERED_BYTES}
"""What each form states one remembered hash costs."""


def measured(
    capacities: tuple[int, ...], *args: str, harness: str = "shadow_memory"
) -> dict[int, int]:
    """Bytes at each of ``capacities`` that tests/support/``harness``.py counts with
    ``args`` (flags, then a policy for shadow_memory)."""
    result = subprocess.run(
        [sys.executable, "-m", f"tests.support.{harness}", *args] + [str(c) for c in capacities],
        capture_output=True,
        text=True,
        check=True,
    )
    return {int(c): held for c, held in json.loads(result.stdout).items()}


FORMS = pytest.mark.parametrize("forms", [(), ("--python-forms",)], ids=["c_forms", "python_forms"])


@FORMS
@pytest.mark.parametrize("policy", policy_names())
def test_a_full_shadow_tier_keeps_no_more_than_its_policy_states(
    policy: str, forms: tuple[str, ...]
) -> None:
    for capacity, held in measured(CAPACITIES, *forms, policy).items():
        assert held <= max_bytes([policy], [capacity]), (capacity, held)


@FORMS
@pytest.mark.parametrize("policy", policy_names())
def test_a_workers_full_tier_keeps_no_more_than_the_memory_check_counts(
    policy: str, forms: tuple[str, ...]
) -> None:
    """Driven as vLLM's connector drives it, miss reasons kept and requests left waiting
    (offload/vllm/settings.py counts the same two statements)."""
    remembered = REMEMBERED_BYTES[forms]
    for capacity, held in measured(WORKER_CAPACITIES, "--worker", *forms, policy).items():
        bound = metadata_bound(policy).at(capacity) + attribution_bytes(capacity, remembered)
        assert held <= bound, (capacity, held)


@FORMS
def test_a_managers_miss_reasons_keep_no_more_than_attribution_bytes_and_reach_it(
    forms: tuple[str, ...],
) -> None:
    """Every generation full of hashes nothing else keeps: at most the form's statement,
    and at its tightest capacity within a twentieth of it (the statement is the layout's
    worst case, not a guess above it)."""
    capacities = ATTRIBUTION_CAPACITIES[forms]
    held = measured(capacities, *forms, harness="attribution_memory")
    bound = {c: attribution_bytes(c, REMEMBERED_BYTES[forms]) for c in capacities}
    assert all(held[c] <= bound[c] for c in capacities), (held, bound)
    assert held[capacities[-1]] > 0.95 * bound[capacities[-1]], (held, bound)


def test_every_built_in_policy_states_its_own_bound() -> None:
    """Inherited, a subclass's bound would be its parent's (gated's, the LRU's), whatever
    more it keeps."""
    for policy_cls in BUILT_IN:
        assert "metadata_bound" in vars(policy_cls), policy_cls.__name__


@pytest.mark.parametrize(
    ("stated", "named"),
    [
        (None, "metadata_bound=None must be an offload.MetadataBound"),
        ((100, 10), r"must be an offload\.MetadataBound.*: it is not one"),
        (MetadataBound(0, 0), "a tier of one slot would keep no bytes"),
        (MetadataBound(1, -1), "per_slot=-1 is not a whole number >= 0"),
        (MetadataBound(1, 1, 2.5, 8), "capped_per_slot=2.5 is not a whole number >= 0"),
    ],
)
def test_a_policy_that_states_no_bound_is_refused(stated: object, named: str) -> None:
    class Unstated(LRUCachePolicy):
        name = "unstated"
        metadata_bound = stated  # type: ignore[assignment]

    with pytest.raises(ValueError, match=named):
        register_policy(Unstated)
    assert "unstated" not in policy_names()


def test_a_bound_grows_with_capacity_and_its_capped_part_stops() -> None:
    bound = MetadataBound(1000, 10, 100, 5)
    assert [bound.at(c) for c in (0, 1, 5, 6, 100)] == [1000, 1110, 1550, 1560, 2500]


def test_shadow_tiers_are_bounded_by_their_policies_bounds_and_keep_no_miss_reasons() -> None:
    """The bound counts each policy's at each capacity (nothing for a tier of 0), and the
    estimate each policy's at the blocks held; nothing reads a shadow's misses, so its
    managers attribute none."""
    tiers = ShadowTiers(["arc", "gated"], [0, 2, 3])
    for request in ([1, 2, 3], [4, 5], [1, 2, 6], [7], [4, 8]):
        tiers.add(request)
    expected = sum(metadata_bound(p).at(c) for p in ("arc", "gated") for c in (2, 3))
    assert max_bytes(tiers.policies, tiers.capacities) == expected
    assert tiers.estimated_bytes == expected  # every slot filled
    managers = [m for ms in tiers._tiers.values() for m in ms if m is not None]
    assert all(m.misses.remembered == 0 and not any(m.misses.lookups.values()) for m in managers)
