"""The optimum storing from a block's second reference bounds vLLM 0.33's reuse filter.

`bench.policy_hit_ratio` reports that bound beside vLLM's filter
(`store_threshold=2`) as the most any gate refusing first offers could hit;
it is a bound only if vLLM's filter, run through its own manager, never
stores a block at its first reference. Hit counts are compared exactly.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.base import make_offload_key

from bench.tooling.peer_workload import replay_once
from offload.sim.optimum import offline_hits
from tests.support.traces import prefix_closed_traces


@settings(max_examples=100, deadline=None)
@given(
    prefix_closed_traces(requests=40, depth=6),
    st.integers(1, 12),
    st.sampled_from(["lru", "arc"]),
)
def test_vllm_filter_never_beats_the_second_reference_optimum(
    trace: list[list[int]], capacity: int, policy: str
) -> None:
    keys = [[make_offload_key(h.to_bytes(8, "big"), 0) for h in request] for request in trace]
    filtered = replay_once(keys, policy, capacity, store_threshold=2)[0]
    assert filtered <= offline_hits(trace, capacity, stored_from=2)
    assert replay_once(keys, policy, capacity)[0] <= offline_hits(trace, capacity)
