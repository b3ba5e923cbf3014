"""Benchmarks of matroot's solvers and optimizer, measured side by side with eigh baselines."""
