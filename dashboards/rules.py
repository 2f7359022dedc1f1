"""Names of the recording rules in docker/prometheus/rules/ that the dashboards plot.

Ratios are computed once, by Prometheus, so a panel and the alert on it read
the same figure. The live test checks that every name here is recorded.
"""

from __future__ import annotations

HIT_RATIO = "kvscope:lookup_hit_ratio:rate5m"
TOKEN_HIT_RATIO = "kvscope:lookup_token_hit_ratio:rate5m"
OCCUPANCY = "kvscope:occupancy:ratio"
DEAD_WRITE_RATIO = "kvscope:dead_write_ratio:rate5m"
TURNOVER = "kvscope:capacity_turnover:increase5m"
TRANSFER_FAILURE_RATIO = "kvscope:transfer_failure_ratio:rate5m"
WINDOW_EFFICIENCY = "kvscope:window_efficiency:ratio"
WINDOW_OPTIMUM_HIT_RATIO = "kvscope:window_optimum_hit_ratio:ratio"
WINDOW_TIER_HIT_RATIO = "kvscope:window_tier_hit_ratio:ratio"
VLLM_GPU_HIT_RATIO = "kvscope:vllm_prefix_cache_hit_ratio:rate5m"
VLLM_EXTERNAL_HIT_RATIO = "kvscope:vllm_external_prefix_cache_hit_ratio:rate5m"
VLLM_OFFLOAD_MEAN_SECONDS = "kvscope:vllm_offload_mean_transfer_seconds:rate5m"
