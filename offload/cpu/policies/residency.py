"""How long a block stays in the tier: the age of the oldest block when room is made.

The admission gate compares a block's reuse gap with this: a block that comes
back only after the tier would have evicted it is not worth a slot. The figure
follows the workload (a moving average), so nothing in it is tuned per trace.
"""

from __future__ import annotations


class ResidencyAge:
    """A moving average of the age of evicted blocks, in the policy's clock ticks.

    Each eviction of n blocks weighs n / capacity: the average spans about
    one tier's worth of evictions, however the stores are batched. ``age``
    stays None until ``turnovers`` tiers' worth of blocks were evicted: the
    first evictions follow the fill, when every block is as old as the fill,
    so the average means nothing before a turnover; the gate refuses nothing
    while it has no age.
    """

    __slots__ = ("_average", "_evicted", "age", "capacity", "turnovers")

    def __init__(self, capacity: int, turnovers: int) -> None:
        self.capacity = capacity
        self.turnovers = turnovers
        self.age: float | None = None
        """None until the tier has turned over ``turnovers`` times."""
        self._average: float | None = None
        self._evicted = 0
        """Blocks evicted so far, counted until ``age`` is published."""

    def observe(self, age: int, evicted: int) -> None:
        if self._average is None:
            self._average = float(age)
        else:
            self._average += (age - self._average) * min(1.0, evicted / self.capacity)
        if self.age is None:
            self._evicted += evicted
            if self._evicted < self.turnovers * self.capacity:
                return
        self.age = self._average

    def clear(self) -> None:
        self.age = self._average = None
        self._evicted = 0
