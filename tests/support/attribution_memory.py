"""A manager's memory of miss reasons at its largest, as tracemalloc counts it.

Run as ``python -m tests.support.attribution_memory [--python-forms] CAPACITY...``: it
prints, as JSON, the bytes of the miss attribution (``MissAttribution``) of a manager of
each capacity once the three memories it keeps (evicted, refused, no room) hold two full
generations of hashes that nothing else keeps alive, and a miss is pending, its hash kept
too: the most it ever keeps. ``--python-forms`` runs the Python form, as
tests/support/shadow_memory.py does.
"""

from __future__ import annotations

import json
import sys
from itertools import count

from tests.support.shadow_memory import HASH_BYTES, arguments, held_bytes

BATCH = 8
"""Hashes refused, evicted and given no room per store, as a short prompt's store does."""


def attribution_bytes_held(capacity: int) -> int:
    """Traced bytes of one manager's miss attribution at ``capacity``, every generation full:
    a generation turns at its horizon-th hash, so ``2 * horizon - 1`` distinct hashes of a
    reason leave the old generation full and the new one one hash short."""
    from offload.cpu.miss_attribution import HORIZON_CAPACITIES, MissAttribution

    def fill() -> MissAttribution:
        misses = MissAttribution(capacity, HORIZON_CAPACITIES)
        numbers = count()
        left = 2 * capacity * HORIZON_CAPACITIES - 1
        while left:
            batch = min(BATCH, left)
            refused = [next(numbers).to_bytes(HASH_BYTES) for _ in range(batch)]
            evicted = [next(numbers).to_bytes(HASH_BYTES) for _ in range(batch)]
            no_room = [next(numbers).to_bytes(HASH_BYTES) for _ in range(batch)]
            misses.stored((), 0, refused, evicted, no_room)
            left -= batch
        misses.miss([next(numbers).to_bytes(HASH_BYTES)], 0, False)
        return misses

    return held_bytes(fill)


def main(argv: list[str]) -> None:
    capacities = arguments(argv)
    print(json.dumps({c: attribution_bytes_held(int(c)) for c in capacities}))


if __name__ == "__main__":
    main(sys.argv[1:])
