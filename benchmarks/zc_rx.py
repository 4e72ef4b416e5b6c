"""Zero-copy receive benchmarks: soft-zc vs the uring copy engines, consumer thread vs same, and
verification speed. Prints numbers and ratios against peers measured in the same run.

    python benchmarks/zc_rx.py [--rounds 5] [--mib 2048] [--verify]

Each round runs every engine once, in a rotating order, on one loopback TCP flow fed by a sender
process; the medians over rounds are compared, so drift on a shared machine hits all alike. Every
engine first receives a short warm-up flow that is not counted, so imports and first-use costs
do not land in one engine's CPU per GiB. Receiver CPU is getrusage of this process (the sender
is a child): tick-sampled, so short runs are coarse. ``--cpu`` pins the receiver and puts the
sender on the other CPUs; ``--cpu N --sender-cpu N`` runs both on one CPU, where the receiver's
own cost decides the rate instead of the sender's.
Targets: soft-zc >= 1.0x uring and >= 1.1x uring-mshot, soft-zc user CPU <= 30 ms per GiB,
consumer thread >= 0.9x same, verify >= 5 GB/s.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import time
from typing import Any

import numpy as np

from zcnet.pattern import PERIOD, TILED, StreamPattern, Verifier, pattern_view
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import make_engine
from zcnet.uring.syscall import backend


def sender(port: int, total: int, chunk: int, cpus: set[int] | None) -> None:
    if cpus is not None:  # else the forked sender inherits the receiver's pinning
        os.sched_setaffinity(0, cpus)
    mv = memoryview(TILED)
    with socket.create_connection(("127.0.0.1", port)) as s:
        sent = 0
        while sent < total:
            start = sent % PERIOD
            sent += s.send(mv[start:start + min(chunk, total - sent)])


def run_engine(name: str, total: int, verify: bool, sender_cpus: set[int] | None = None,
               **opts: Any) -> tuple[float, dict[str, Any]]:
    """Gbit/s of one engine receiving ``total`` bytes, and its engine stats (plus the sender
    process's busy share under ``sender_busy``: user + system over the receive's wall time;
    on loopback that system time includes the receive softirq, which runs on the sender)."""
    o = EngineOptions()
    for k, v in opts.items():
        setattr(o, k, v)  # consumer etc. may not be EngineOptions fields yet
    eng = make_engine(name, o)
    if why := eng.unsupported():
        raise SystemExit(f"{name}: unsupported: {why}")
    with socket.create_server(("127.0.0.1", 0)) as srv:
        p = mp.get_context("fork").Process(target=sender,
                                           args=(srv.getsockname()[1], total, 1 << 20,
                                                 sender_cpus))
        p.start()
        conn, _ = srv.accept()
    with conn:
        v = Verifier() if verify else None
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        st = eng.run(conn, v.check if v else None)
        dt = time.perf_counter() - t0
    p.join()
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    st.extra["sender_busy"] = ((kids1.ru_utime - kids0.ru_utime)
                               + (kids1.ru_stime - kids0.ru_stime)) / dt
    if st.bytes != total or (v and v.mismatches):
        raise SystemExit(f"{name}: got {st.bytes}/{total} bytes, "
                         f"{v.mismatches if v else 0} mismatches")
    return st.bytes * 8 / dt / 1e9, st.extra


def verify_speed(chunk: int, nbytes: int = 1 << 30) -> dict[str, float]:
    """GB/s of checking ``chunk``-byte pieces of received bytes against the pattern."""
    out = {}
    n = nbytes // chunk
    area = np.empty(chunk + 4096, dtype=np.uint8)
    data = area[64:64 + chunk]  # where a receive buffer would sit
    data[:] = pattern_view(12345, chunk)
    v = Verifier()
    t0 = time.perf_counter()
    for _ in range(n):
        v.check(data, 12345)
    out["pattern.Verifier.check"] = nbytes / (time.perf_counter() - t0) / 1e9
    sp = StreamPattern()
    data[:] = sp.expected(12345, chunk)
    t0 = time.perf_counter()
    for _ in range(n):
        sp.matches(12345, data)
    out["pattern.StreamPattern.matches"] = nbytes / (time.perf_counter() - t0) / 1e9
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=2048, help="MiB per run")
    ap.add_argument("--verify", action="store_true", help="consumers verify every byte")
    ap.add_argument("--cpu", type=int, default=None,
                    help="pin the receiver to this CPU (the sender to the others)")
    ap.add_argument("--sender-cpu", type=int, default=None,
                    help="pin the sender to this CPU (with --cpu and the same number: one CPU)")
    args = ap.parse_args()
    allowed = os.sched_getaffinity(0)
    for c in (args.cpu, args.sender_cpu):
        if c is not None and c not in allowed:
            raise SystemExit(f"CPU {c} is not one this process may run on "
                             f"({', '.join(map(str, sorted(allowed)))}): pick one of those")
    if args.sender_cpu is not None:
        sender_cpus: set[int] | None = {args.sender_cpu}
    elif args.cpu is not None:
        sender_cpus = (allowed - {args.cpu}) or {args.cpu}
    else:
        sender_cpus = None
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    total = args.mib << 20
    cells = {
        "uring": ("uring", {}),
        "uring-mshot": ("uring-mshot", {}),
        "soft-zc": ("soft-zc", {"consumer": "same"}),
        "soft-zc/thread": ("soft-zc", {"consumer": "thread"}),
        "soft-zc/incremental": ("soft-zc", {"zc_incremental": True}),
    }
    for eng, opts in cells.values():  # warm-up: imports, first mappings; not counted
        run_engine(eng, 64 << 20, args.verify, sender_cpus, **opts)
    results: dict[str, list[float]] = {k: [] for k in cells}
    extra: dict[str, dict[str, Any]] = {}
    cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in cells}
    busy: dict[str, list[float]] = {k: [] for k in cells}
    names = list(cells)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for key in order:
            eng, opts = cells[key]
            before = resource.getrusage(resource.RUSAGE_SELF)
            gbps, extra[key] = run_engine(eng, total, args.verify, sender_cpus, **opts)
            after = resource.getrusage(resource.RUSAGE_SELF)
            results[key].append(gbps)
            busy[key].append(extra[key].pop("sender_busy"))
            cpu[key].append((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime))
    print(f"loopback, {args.mib} MiB per run, {args.rounds} rounds, verify={args.verify}, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, receiver on "
          f"{args.cpu if args.cpu is not None else 'any'} CPU, sender on "
          f"{','.join(map(str, sorted(sender_cpus))) if sender_cpus else 'any'}, "
          f"ring hot path {backend()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    med = {k: statistics.median(v) for k, v in results.items()}
    usr_ms: dict[str, float] = {}
    for k, v in results.items():
        spread = f"{min(v):.1f}..{max(v):.1f}"
        usr = statistics.median(u for u, _ in cpu[k]) / args.mib * 1024
        sys_ = statistics.median(s for _, s in cpu[k]) / args.mib * 1024
        usr_ms[k] = usr * 1000
        # busy shares: the receiver's CPU time over the run's wall time (from its Gbit/s)
        wall = args.mib / 1024 * 8 * (1 << 30) / 1e9 / med[k]
        print(f"  {k:20s} median {med[k]:6.2f} Gbit/s  (range {spread});  receiver CPU per "
              f"GiB: user {usr * 1000:5.1f} ms, sys {sys_ * 1000:5.1f} ms; busy: receiver "
              f"{(usr + sys_) * args.mib / 1024 / wall:4.0%}, sender "
              f"{statistics.median(busy[k]):4.0%}")
    print("  (busy = CPU time over wall time. Loopback runs the receive softirq on the sender's "
          "CPU, so the sender's share includes it; the engines all receive through the same "
          "kernel copy, and only their own costs differ: a sender near 100% bounds them alike)")
    print(f"  soft-zc / uring          = {med['soft-zc'] / med['uring']:.2f}x  (target >= 1.0)")
    print(f"  soft-zc / uring-mshot    = {med['soft-zc'] / med['uring-mshot']:.2f}x")
    print(f"  thread / same (soft-zc)  = {med['soft-zc/thread'] / med['soft-zc']:.2f}x  "
          "(target >= 0.9)")
    print(f"  soft-zc/incremental / uring = {med['soft-zc/incremental'] / med['uring']:.2f}x")
    st = extra["soft-zc"]
    print(f"  soft-zc stats: delivered {st.get('delivered')}, coalesced {st.get('coalesced')}, "
          f"peak in flight {st.get('peak_in_flight')}, rearms {st.get('rearms')}, "
          f"backpressure {st.get('backpressure')}")
    for chunk in (64 << 10, 1 << 20):
        for name, gbs in verify_speed(chunk).items():
            print(f"  verify {chunk >> 10:5d} KiB pieces, {name:36s} {gbs:6.1f} GB/s  "
                  "(target >= 5)")
    print(f"target softzc_vs_uring {med['soft-zc'] / med['uring']:.3f} x goal >= 1.0")
    print(f"target softzc_vs_uring_mshot {med['soft-zc'] / med['uring-mshot']:.3f} x goal >= 1.1")
    print(f"target softzc_user_cpu {usr_ms['soft-zc']:.1f} ms/GiB goal <= 30")
    print(f"target thread_vs_same {med['soft-zc/thread'] / med['soft-zc']:.3f} x goal >= 0.9")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
