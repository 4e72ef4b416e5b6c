"""NOP submit+reap throughput at several batch sizes: the cost of the Python ring mechanics.

Usage: python benchmarks/ring_nop.py [--seconds S]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from zcnet.uapi import io_uring as u
from zcnet.uring.prep import prep_nop
from zcnet.uring.ring import Ring


def measure(batch: int, seconds: float) -> float:
    flags = u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN
    with Ring(batch, flags=flags, cq_entries=2 * batch) as r:
        ud = np.arange(batch, dtype=np.uint64)
        done = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            for _ in range(16):
                if batch == 1:
                    prep_nop(r, 0)  # one SQE: the scalar pack_into path, not numpy
                else:
                    r.prep_batch(u.IORING_OP_NOP, ud)
                r.submit(batch)
                done += len(r.reap())
        return done / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    base = None
    print(f"{'batch':>6} {'M ops/s':>9} {'ns/op':>7} {'vs batch 1':>10}")
    for batch in (1, 32, 256, 1024):
        ops = measure(batch, args.seconds)
        base = base or ops
        print(f"{batch:>6} {ops / 1e6:>9.2f} {1e9 / ops:>7.0f} {ops / base:>9.1f}x")


if __name__ == "__main__":
    main()
