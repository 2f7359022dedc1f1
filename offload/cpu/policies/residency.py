"""How long a block stays in the tier: the age of the oldest block when room is made.

The admission gate compares a block's reuse gap with this: a block that comes
back only after the tier would have evicted it is not worth a slot. The figure
follows the workload (a moving average), so nothing in it is tuned per trace.
"""

from __future__ import annotations


class ResidencyAge:
    """A moving average of the age of evicted blocks, in the policy's clock ticks.

    Each eviction of n blocks weighs n / capacity: the average spans about
    one tier's worth of evictions, however the stores are batched.
    """

    __slots__ = ("age", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.age: float | None = None
        """None until the first eviction: before the tier is full, nothing is old."""

    def observe(self, age: int, evicted: int) -> None:
        if self.age is None:
            self.age = float(age)
            return
        weight = min(1.0, evicted / self.capacity)
        self.age += (age - self.age) * weight

    def clear(self) -> None:
        self.age = None
