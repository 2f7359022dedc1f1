"""A tier's memory once its policy's metadata is full, as tracemalloc counts it.

Run as ``python -m tests.support.shadow_memory [--python-forms] [--attribute-misses]
POLICY CAPACITY...``: it prints, as JSON, the bytes of one tier (a manager, as a shadow
tier is one) of each capacity, driven until everything its policy remembers is at its
bound. ``--attribute-misses`` keeps miss reasons, as a vLLM worker's manager does (a shadow
tier keeps none). ``--python-forms`` blocks
kvscope's C extensions before anything imports them, so every form is the Python one, as in
the sidecar's image, which is built without a compiler: the forms are chosen at import, so
only a fresh interpreter can run the other one.
"""

from __future__ import annotations

import json
import random
import sys
import tracemalloc

C_EXTENSIONS = (
    "offload.cpu._miss_attribution",
    "offload.cpu.policies._miniature",
    "offload.cpu.policies._offer_history",
    "offload.insight._sample_test",
    "offload.wire._sample_recorder",
)
FILL_CAPACITIES = 128
"""Distinct blocks offered, in tiers' worth: twice what the largest history any built-in
policy keeps (gated's, 64 hashes per slot, in the tier and in each of its models) can hold,
so every history has turned over (twice as many left gated's cost within 1%)."""
HASH_BYTES = 64
"""The longest block hash a sample frame carries (``MAX_HASH_BYTES``): the costliest key."""


def requests(capacity: int, seed: int) -> list[list[int]]:
    """Prompts that share prefixes (recent ones often, old ones rarely) and end in new
    blocks, until ``FILL_CAPACITIES`` tiers' worth of distinct blocks were offered: hits,
    refusals, evictions and re-offers at every reuse gap, and histories full of new hashes.
    As numbers: the tier is given each as the bytes of a hash made when it runs."""
    rng = random.Random(seed)
    sent: list[list[int]] = []
    fresh = 0
    while fresh < FILL_CAPACITIES * capacity:
        prefix: list[int] = []
        if sent and rng.random() < 0.7:
            back = rng.randint(1, min(len(sent), 8 if rng.random() < 0.8 else 64 * capacity))
            chain = sent[-back]
            prefix = chain[: rng.randint(1, len(chain))]
        new = list(range(fresh, fresh + rng.randint(1, 8)))
        fresh += len(new)
        sent.append(prefix + new)
    return sent


def tier_bytes(policy: str, capacity: int, *, attribute_misses: bool, seed: int = 0) -> int:
    """Traced bytes of one tier of ``policy`` at ``capacity`` after its fill (the hashes it
    keeps alive included), driven as a shadow tier is."""
    from offload.cpu.manager import CPUOffloadingManager
    from offload.sim.workload import run_request

    sent = requests(capacity, seed)  # before tracing: only what the tier keeps counts
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tier = CPUOffloadingManager(1, capacity, policy, attribute_misses=attribute_misses)
        for request in sent:
            run_request(tier, [n.to_bytes(HASH_BYTES) for n in request])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return held


def main(argv: list[str]) -> None:
    if "--python-forms" in argv:
        sys.modules.update(dict.fromkeys(C_EXTENSIONS))  # None: their imports fail
    attribute_misses = "--attribute-misses" in argv
    policy, *capacities = (arg for arg in argv if not arg.startswith("--"))
    held = {c: tier_bytes(policy, int(c), attribute_misses=attribute_misses) for c in capacities}
    print(json.dumps(held))


if __name__ == "__main__":
    main(sys.argv[1:])
