"""The LRU stack's memory, and the prefix check's alone, against the estimates the insight
memory bound rests on."""

from __future__ import annotations

import gc
import tracemalloc
from itertools import count

import pytest

from app.state.insight import PREFIX_CHECK_BYTES_PER_BLOCK, STACK_BYTES_PER_BLOCK
from offload.insight.estimator import STACK_POLICY, CurveEstimator
from offload.insight.prefix_check import PrefixCheck
from offload.wire.labels import MAX_HASH_BYTES


@pytest.mark.parametrize("request_blocks", [3, 37])
def test_a_full_stack_and_its_prefix_check_keep_at_most_the_estimate_per_hash(
    request_blocks: int,
) -> None:
    """Every request new, of the longest hashes a frame carries, so that the stack stays full
    of hashes nothing else keeps alive while its tables churn: the estimate of 256 bytes a
    hash was under the stack alone (about 367) before the prefix check added its entry (up
    to about 100 more), and ``KVSCOPE_INSIGHT_MAX_BYTES`` was passed by as much."""
    numbers = count()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        stack = CurveEstimator(1_500, 1.0, [STACK_POLICY])
        largest = max(stack.capacities)
        worst = 0.0
        for _ in range(3 * largest // request_blocks):
            request = [next(numbers).to_bytes(MAX_HASH_BYTES, "big") for _ in range(request_blocks)]
            stack.record(request, request_blocks)
            if stack.held_blocks == largest:
                held = tracemalloc.get_traced_memory()[0] - before
                worst = max(worst, held / largest)
    finally:
        tracemalloc.stop()
    assert worst > 0, "the stack never filled"
    assert worst <= STACK_BYTES_PER_BLOCK


@pytest.mark.parametrize("request_blocks", [2, 37])
def test_a_prefix_check_alone_keeps_at_most_the_estimate_per_block_of_its_bound(
    request_blocks: int,
) -> None:
    """Where no stack runs the check (lru not simulated), nothing else keeps its hashes:
    every request new, of the longest hashes, so that each entry keeps its own hash and, in
    requests of two, its predecessor's too, through the clears at its bound."""
    numbers = count()
    bound = 1_500
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        check = PrefixCheck(bound)
        most = 0
        for _ in range(3 * bound // (request_blocks - 1)):
            request = [next(numbers).to_bytes(MAX_HASH_BYTES, "big") for _ in range(request_blocks)]
            check.add_many([request])
            del request
            most = max(most, tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()
    assert check.held_blocks > 0
    assert most <= PREFIX_CHECK_BYTES_PER_BLOCK * bound
