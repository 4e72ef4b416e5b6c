"""Imported first by benchmarks that measure CPU: one OpenBLAS thread instead of one per CPU.

numpy's OpenBLAS starts a thread per CPU when numpy is imported, and they spin before they
sleep: a process that imports numpy and sleeps used 0.18 s of CPU here, 0.07 s with one
thread. In a benchmark those spins land on the CPUs being measured, during its first row.
Neither zcnet nor the benchmarks use BLAS. An explicit OPENBLAS_NUM_THREADS is kept.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
