"""io_uring from Python: ring setup, mmap, prep helpers, batched submit, vectorized reap."""
