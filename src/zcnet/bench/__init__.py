"""Benchmark coordinator, workers, placement and stats collectors."""
