"""What the benchmarks share: the workload runner, the vLLM peer and the offline bound."""
