"""What the benchmarks share: the workload runner, the vLLM peer and its wheel, the bound."""
