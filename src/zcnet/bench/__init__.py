"""Benchmarks: runs, the server/client control plane, flow workers, placement, accounting."""
