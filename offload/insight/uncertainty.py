"""How far a sampled curve's point may be from the full stream's, from the sample itself.

A sampled hit ratio errs for two reasons, each of which the sample shows:

- Which blocks' references were drawn. SHARDS-adj (estimator.py) reads the
  miss ratio as the sample's misses over ``rate`` times the references;
  under a spatial sample those misses are a sum over the sampled blocks,
  whose variance is at least that of as many independent misses (each
  block missed at least once where it is missed at all): ``(1 - rate)``
  times the misses, over the expected sampled references squared.
- How many blocks the scaled tier holds. A tier of ``held`` sampled blocks
  stands for ``held / rate`` blocks only on average: the share of the
  tier's recent blocks that passed the test varies by about
  ``sqrt((1 - rate) / held)`` of itself, so the point is read at a capacity
  off by that share, which moves it by the curve's slope (per unit of log
  capacity) times that share. Small tiers (tens of sampled blocks) on a
  steep curve err by points; large ones by hundredths.

Both vanish at rate 1 (the replay is the stream's own) and are combined as
independent (in quadrature), one standard error. A difference between two
points of one sample (a larger tier, another policy) moves with both
points' capacity error but shares their drawn blocks: only the references
that hit in one and miss in the other (at least the difference itself)
differ, so its selection error counts those, not every miss twice.

A quotient of two replays of one sample (the window's tier over its optimum,
window_optimum.py) errs by which blocks were drawn alone: both run at the
same scaled size. Each count is a sum over the sampled blocks, so the
quotient's first-order error is a sum over them too, of each block's misses
under the one less the quotient times its misses under the other; a block
both replays treat alike adds nothing, a hot block one of them misses adds
its square. The sample holds every such term of its own blocks, so its sum,
over ``rate`` (a Poisson sample's variance), estimates the stream's, with no
bound on how the misses fall over the blocks.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

Block = TypeVar("Block", bound=Hashable)


def capacity_errors(
    ratios: Sequence[float], capacities: Sequence[int], held: Sequence[int], rate: float
) -> tuple[float, ...]:
    """Per capacity, the hit ratio's error from the scaled tier's size (0..1 units): the
    curve's slope per unit of log capacity there (across its neighbours, one-sided at the
    ends) times the relative error of a tier of ``held`` sampled blocks."""
    if len(ratios) != len(capacities) or len(held) != len(capacities):
        raise ValueError("ratios, capacities and held blocks must be as many")
    last = len(capacities) - 1
    out = []
    for index, blocks in enumerate(held):
        low, high = max(0, index - 1), min(last, index + 1)
        span = math.log(capacities[high] / capacities[low]) if high > low else 0.0
        slope = abs(ratios[high] - ratios[low]) / span if span else 0.0
        out.append(slope * math.sqrt((1.0 - rate) / max(1, blocks)))
    return tuple(out)


def selection_error(moved: float, rate: float, expected_refs: float) -> float:
    """The error (0..1 units) of a share ``moved`` of the stream's references (misses, or the
    references two points count differently) read from a sample expected to hold
    ``expected_refs`` references at ``rate``."""
    if expected_refs <= 0:
        return 0.0
    return math.sqrt((1.0 - rate) * max(0.0, moved) / expected_refs)


def point_errors(
    ratios: Sequence[float],
    capacities: Sequence[int],
    held: Sequence[int],
    rate: float,
    expected_refs: float,
) -> tuple[float, ...]:
    """Each point's standard error (0..1 units): its capacity error and the error of its
    misses, in quadrature."""
    by_size = capacity_errors(ratios, capacities, held, rate)
    return tuple(
        math.hypot(capacity, selection_error(1.0 - ratio, rate, expected_refs))
        for ratio, capacity in zip(ratios, by_size, strict=True)
    )


def difference_error(
    difference: float,
    capacity_error_a: float,
    capacity_error_b: float,
    rate: float,
    expected_refs: float,
) -> float:
    """The standard error (0..1 units) of ``difference`` between two points of one sample,
    each with its ``capacity_errors`` entry, the sample at ``rate`` expected to hold
    ``expected_refs`` references (the smaller one's, where two simulations differ)."""
    selection = selection_error(abs(difference), rate, expected_refs)
    return math.sqrt(capacity_error_a**2 + capacity_error_b**2 + selection**2)


def quotient_error(
    misses: Mapping[Block, int],
    other_misses: Mapping[Block, int],
    quotient: float,
    rate: float,
    other_hits: float,
) -> float:
    """The standard error (0..1 units) of ``quotient``, one replay's adjusted hits over
    another's (``other_hits``, SHARDS-adj on the sample) on the same sample at ``rate``,
    from each sampled block's misses under the one (``misses``) and the other
    (``other_misses``); 0 at rate 1."""
    if other_hits <= 0:
        return 0.0
    spread = sum(
        (misses.get(b, 0) - quotient * other_misses.get(b, 0)) ** 2
        for b in misses.keys() | other_misses.keys()
    )
    return math.sqrt((1.0 - rate) * spread) / other_hits
