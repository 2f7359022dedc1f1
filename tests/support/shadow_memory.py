"""A tier's memory once its policy's metadata is full, as tracemalloc counts it.

Run as ``python -m tests.support.shadow_memory [--python-forms] [--worker] POLICY
CAPACITY...``: it prints, as JSON, the bytes of one tier (a manager, as a shadow tier is
one) of each capacity, driven until everything its policy remembers is at its bound.
``--worker`` drives it as vLLM's connector drives a worker's tier: miss reasons kept (a
shadow tier keeps none), every request named, its loads and offers met by the policy, and
at the end as many requests left running, each with blocks met and not stored, as the
policies keep waiting (gated's ``_met``: ``MET_REQUESTS``, and ``MET_CAPACITIES`` tiers'
worth of blocks, each a hash nothing else keeps). ``--python-forms`` blocks
kvscope's C extensions before anything imports them, so every form is the Python one, as in
the sidecar's image, which is built without a compiler: the forms are chosen at import, so
only a fresh interpreter can run the other one.
"""

from __future__ import annotations

import json
import random
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from itertools import count
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when run: the forms are chosen by then
    from offload.cpu.manager import CPUOffloadingManager

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


def position(block_hash: bytes) -> int:
    """A block's place in its prompt: its number, which grows along every chain
    ``requests`` makes (a prefix's blocks were numbered before the new ones after it)."""
    return int.from_bytes(block_hash)


def run_named(tier: CPUOffloadingManager, block_hashes: Sequence[bytes]) -> None:
    """One request as vLLM's connector drives the tier: named, its loads met before they are
    pinned and its offers before they are stored, finished once stored (no touch)."""
    from offload.cpu.request_recency import RequestRecency

    request, policy = RequestRecency(position), tier.policy
    hits = tier.lookup(block_hashes)
    loaded = block_hashes[:hits]
    if hits:
        blocks = tier.readable(loaded)
        policy.observe(loaded, request)
        tier.pin(blocks)
        tier.complete_load(loaded)
    offered = block_hashes[hits:]
    policy.observe(offered, request)
    out = tier.prepare_store(offered, request, parent=loaded[-1] if hits else None)
    if out is not None and out.block_hashes_to_store:
        tier.complete_store(out.block_hashes_to_store)
    policy.finish(block_hashes, frozenset(loaded), request)


def leave_running(tier: CPUOffloadingManager, first: int) -> None:
    """Requests left running, each having met new blocks (numbered from ``first``) it has
    not stored: as many requests as gated's ``_met`` keeps waiting, one block each, then one
    more block each in turn up to the blocks it keeps. Their references are dropped here,
    so the tier keeps them alive, as it would for requests whose end it never heard of."""
    from offload.cpu.policies.gated_lru import MET_CAPACITIES, MET_REQUESTS
    from offload.cpu.request_recency import RequestRecency

    blocks = MET_CAPACITIES * tier.num_blocks
    running = [RequestRecency(position) for _ in range(min(MET_REQUESTS, blocks))]
    numbers = count(first)
    for met in range(blocks):
        tier.policy.observe([next(numbers).to_bytes(HASH_BYTES)], running[met % len(running)])


def tier_bytes(policy: str, capacity: int, *, worker: bool, seed: int = 0) -> int:
    """Traced bytes of one tier of ``policy`` at ``capacity`` after its fill (the hashes it
    keeps alive included), driven as a shadow tier is, or as vLLM drives a worker's."""
    from offload.cpu.manager import CPUOffloadingManager
    from offload.sim.workload import run_request

    sent = requests(capacity, seed)  # before tracing: only what the tier keeps counts

    def fill() -> CPUOffloadingManager:
        tier = CPUOffloadingManager(1, capacity, policy, attribute_misses=worker)
        for request in sent:
            block_hashes = [n.to_bytes(HASH_BYTES) for n in request]
            if worker:
                run_named(tier, block_hashes)
            else:
                run_request(tier, block_hashes)
        if worker:
            leave_running(tier, 1 + max(max(request) for request in sent))
        return tier

    return held_bytes(fill)


def held_bytes(fill: Callable[[], object]) -> int:
    """Bytes tracemalloc counts as allocated by ``fill`` and still held once it returns, what
    it returns (the thing measured) kept alive until they are counted."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fill()
        held = tracemalloc.get_traced_memory()[0] - before
        del kept
    finally:
        tracemalloc.stop()
    return held


def arguments(argv: list[str]) -> list[str]:
    """``argv`` without its flags, once ``--python-forms``, if given, has blocked kvscope's C
    extensions (their imports fail on None), before anything imports them."""
    if "--python-forms" in argv:
        sys.modules.update(dict.fromkeys(C_EXTENSIONS))
    return [arg for arg in argv if not arg.startswith("--")]


def main(argv: list[str]) -> None:
    worker = "--worker" in argv
    policy, *capacities = arguments(argv)
    held = {c: tier_bytes(policy, int(c), worker=worker) for c in capacities}
    print(json.dumps(held))


if __name__ == "__main__":
    main(sys.argv[1:])
