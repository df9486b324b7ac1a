"""Tests of bench/ (the benchmarks' reports; no timing)."""
