"""Benchmarks for k7core: ``python -m benchmarks`` (a first quick probe)."""
