"""Benchmarks and the readable references they measure against (source checkout only)."""
