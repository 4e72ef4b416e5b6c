"""What a CQE_MIXED ring costs to reap, against a CQE32 ring in the same run.

Usage: python benchmarks/cq_mixed.py [--batch N] [--seconds S] [--rounds R]

Each cell fills ``batch`` NOP SQEs, enters once waiting for all, then times only the reap that
takes their CQEs (``Ring.reap()``, one call). Rings: ``cqe32`` (IORING_SETUP_CQE32: every CQE
32 bytes, one copy of the CQ window), ``mixed-big`` (IORING_SETUP_CQE_MIXED, every NOP with
IORING_NOP_CQE32: the RECV_ZC-only case of a zcrx queue) and ``mixed-half`` (every other NOP
small: a ring that also carries sends or timeouts). A mixed reap walks the entries and widens
them to 32 bytes (zcnet.uring.mixed; in C on the compiled path), so its cost per CQE is the
question; the CQ bytes each ring needs for the batch are printed beside it. Both hot paths when
the accelerator is built; the best of ``--rounds`` rounds (a shared machine disturbs the rest).
Needs Linux 6.18 (CQE_MIXED).
"""

from __future__ import annotations

import argparse
import os
import time

from zcnet.errors import Unsupported
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import accel_available

FLAGS = u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN
KINDS = {"cqe32": (u.IORING_SETUP_CQE32, 0), "mixed-big": (u.IORING_SETUP_CQE_MIXED, 1),
         "mixed-half": (u.IORING_SETUP_CQE_MIXED, 2)}


def cell(kind: str, batch: int, seconds: float) -> tuple[float, int]:
    """(ns per reaped CQE, CQ bytes the batch took)."""
    flag, big_every = KINDS[kind]
    with Ring(batch, flags=FLAGS | flag, cq_entries=4 * batch) as r:
        ops = [u.IORING_NOP_CQE32 if big_every and i % big_every == 0 else 0
               for i in range(batch)]
        spent = 0.0
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for i, f in enumerate(ops):
                r.prep(u.IORING_OP_NOP, user_data=i, op_flags=f)
            r.submit(batch)
            t0 = time.perf_counter()
            c = r.reap()
            spent += time.perf_counter() - t0
            assert len(c) == batch
            n += batch
        slots = sum(2 if f else 1 for f in ops) if r.cqe_mixed else batch
        return spent / n * 1e9, slots * (16 if r.cqe_mixed else 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    paths = ["c", "pure"] if accel_available() else ["pure"]
    best: dict[tuple[str, str], float] = {}
    cq_bytes: dict[str, int] = {}
    try:
        for _ in range(a.rounds):
            for path in paths:
                os.environ["ZCNET_PURE"] = "1" if path == "pure" else "0"
                for kind in KINDS:
                    ns, cq_bytes[kind] = cell(kind, a.batch, a.seconds)
                    best[path, kind] = min(best.get((path, kind), ns), ns)
    except Unsupported as e:
        raise SystemExit(f"cq_mixed: {e}") from None
    print(f"reap of {a.batch} NOP CQEs, ns per CQE (best of {a.rounds}), CQ bytes per batch")
    print(f"{'path':6} {'ring':11} {'ns/CQE':>8} {'vs cqe32':>9} {'CQ bytes':>9}")
    for path in paths:
        for kind in KINDS:
            ns = best[path, kind]
            print(f"{path:6} {kind:11} {ns:8.1f} {ns / best[path, 'cqe32']:8.2f}x "
                  f"{cq_bytes[kind]:9d}")
    path = paths[0]
    print(f"target mixed_big_reap_{path} {best[path, 'mixed-big'] / best[path, 'cqe32']:.2f} "
          "x goal 2.0")


if __name__ == "__main__":
    main()
