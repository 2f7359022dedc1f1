"""The most memory a tier over a policy keeps, as a statement of the policy's own.

Two callers size memory by it before anything is stored: the vLLM connector's start-up
check, which refuses a CPU tier whose chunks and records would not fit the host, and the
sidecar, which picks the rate its shadow tiers are sampled at to keep its memory bound. A
flat figure per slot is wrong at one end or the other for a policy whose histories stop
growing (gated's miniature models keep at most ``2 * MODEL_SLOTS - 1`` slots each), so the
statement has a part that stops: ``fixed + per_slot * capacity + capped_per_slot *
min(capacity, capped_slots)``, which grows with the capacity by construction and by no more
than ``per_slot + capped_per_slot`` a slot.
"""

from __future__ import annotations

from typing import NamedTuple


class MetadataBound(NamedTuple):
    """A tier's memory beyond its KV data, at most, once everything its policy remembers is
    full: its manager's objects, the policy's tables and the hashes they keep alive (of 64
    bytes, the longest a sample frame carries), not the miss reasons a manager may keep
    (``offload.cpu.miss_attribution.attribution_bytes`` states those)."""

    fixed: int
    """Bytes whatever the capacity: the manager's objects and the policy's empty tables."""
    per_slot: int
    """Bytes each slot of the capacity adds."""
    capped_per_slot: int = 0
    """Bytes each slot adds up to ``capped_slots``, none past it: what a part whose size
    stops growing (a model of at most that many slots) keeps per slot."""
    capped_slots: int = 0

    def at(self, capacity: int) -> int:
        """The bound for a tier of ``capacity`` slots."""
        return (
            self.fixed
            + self.per_slot * capacity
            + self.capped_per_slot * min(capacity, self.capped_slots)
        )

    def problems(self) -> list[str]:
        """What makes this no bound (a field not a whole number >= 0, or nothing counted)."""
        problems = [
            f"{field}={value!r:.80} is not a whole number >= 0"
            for field, value in self._asdict().items()
            if type(value) is not int or value < 0
        ]
        if not problems and self.fixed + self.per_slot < 1:
            problems.append("a tier of one slot would keep no bytes")
        return problems
