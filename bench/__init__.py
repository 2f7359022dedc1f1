"""Benchmarks: figures side by side with a peer or a bound, never timed tests."""
