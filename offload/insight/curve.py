"""The hit-ratio curve: what the tier would hit at other capacities, per policy.

One type for every producer (the exact offline sweep, the estimate from a
sampled stream) and every reader (the replay's table and plot, the sidecar),
so a curve means the same thing wherever it is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MULTIPLES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Capacities, as multiples of the current one, that a live curve covers: 1/8x to 8x."""


def scaled_capacities(
    current: int, multiples: Sequence[float] = DEFAULT_MULTIPLES
) -> tuple[int, ...]:
    """``current`` times each multiple, in whole blocks (at least one), ascending, no repeats."""
    if isinstance(current, bool) or not isinstance(current, int) or current < 1:
        raise ValueError(f"current capacity must be a whole number of blocks >= 1, got {current!r}")
    if not multiples or any(not m > 0 for m in multiples):
        raise ValueError(f"capacity multiples must be positive, got {list(multiples)}")
    return tuple(sorted({max(1, round(current * m)) for m in multiples}))


@dataclass(frozen=True, slots=True)
class HitRatioCurve:
    """Hit ratios (0..1) per policy at each capacity (blocks, ascending).

    ``current`` is the live tier's capacity, one of ``capacities``; an
    offline sweep has none. ``exact`` says whether the ratios were replayed
    in full or estimated from a sample.
    """

    capacities: tuple[int, ...]
    hit_ratios: Mapping[str, tuple[float, ...]]
    current: int | None = None
    exact: bool = True

    def __post_init__(self) -> None:
        if not self.capacities or list(self.capacities) != sorted(set(self.capacities)):
            raise ValueError(f"capacities must be ascending and distinct, got {self.capacities}")
        for policy, ratios in self.hit_ratios.items():
            if len(ratios) != len(self.capacities):
                raise ValueError(
                    f"{policy}: {len(ratios)} hit ratios for {len(self.capacities)} capacities"
                )
        if self.current is not None and self.current not in self.capacities:
            raise ValueError(f"current capacity {self.current} is not one of {self.capacities}")

    @property
    def policies(self) -> list[str]:
        return list(self.hit_ratios)

    def multiples(self) -> tuple[float, ...] | None:
        """Each capacity over the current one; None without a current capacity."""
        if self.current is None:
            return None
        return tuple(capacity / self.current for capacity in self.capacities)

    def at(self, policy: str, capacity: int) -> float:
        return self.hit_ratios[policy][self.capacities.index(capacity)]

    def as_dict(self) -> dict[str, object]:
        return {
            "capacities": list(self.capacities),
            "current": self.current,
            "multiples": None if self.current is None else list(self.multiples() or ()),
            "exact": self.exact,
            "hit_ratios": {policy: list(ratios) for policy, ratios in self.hit_ratios.items()},
        }
