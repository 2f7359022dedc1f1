"""Simulation without vLLM or a GPU: Mooncake traces, the canonical workload, the demo worker."""
