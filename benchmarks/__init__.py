"""Benchmarks that print numbers: each figure a ratio against a baseline measured in the same command."""
