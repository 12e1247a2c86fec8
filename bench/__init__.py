"""Benchmarks: every figure is printed as a ratio against baselines measured in the same run."""
