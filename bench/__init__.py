"""Benchmarks (make bench-package, make bench-launch): medians and spreads, never timed tests."""
