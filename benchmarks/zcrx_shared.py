"""Many connections on one zcrx queue vs one soft-zc ring per connection, same run: Gbit/s,
receiver CPU per GiB and their ratios, for 1, 8 and 64 loopback connections.

Needs a kernel with zcrx copy mode (ZCRX_REG_NODEV, 7.x), e.g. inside `zcnet vm run`:

    zcnet vm run -- python benchmarks/zcrx_shared.py [--rounds 3] [--mib 64] [--conns 1,8,64]

One receiving thread serves every connection either way, as a server does:
- zcrx: one ZcrxQueue (copy mode) that every connection joins; ``ready()`` does one enter for
  all of them and names those with completions, each then ``recv(0)``.
- soft: a soft-zc Receiver (own ring, own area) per connection, ``recv(0)`` on each in turn:
  one enter per connection per pass.
The senders run in a child process (their CPU is not the receiver's). Under TCG absolute numbers
mean little; the ratios are what count. Rounds alternate the order; medians are compared.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import resource
import socket
import statistics
import sys
import time

from zcnet.rx.zc import Receiver, open_receiver
from zcnet.rx.zc.zcrx import kernel_offers, open_zcrx_queue

PIECE = 256 << 10


def send_all(port: int, n: int, each: int) -> None:
    """Child: ``n`` connections, ``each`` bytes on each, written in turns of PIECE."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    buf = os.urandom(PIECE)
    left = [each] * n
    while any(left):
        for i, s in enumerate(socks):
            if left[i]:
                k = min(PIECE, left[i])
                s.sendall(buf[:k])
                left[i] -= k
    for s in socks:
        s.close()


def serve(kind: str, conns: list[socket.socket], area: int) -> int:
    """Receive every connection to EOF in this thread; returns the bytes."""
    total = 0
    if kind == "zcrx":
        with open_zcrx_queue(area, copy=True) as zq:
            rx_of = {}
            for s in conns:
                p = zq.join(s.fileno())
                rx_of[p] = Receiver(s, p, max_held=1.0)
            while rx_of:
                for p in zq.ready(1.0):
                    rx = rx_of[p]
                    for c in rx.recv(0):
                        total += c.length
                        c.release()
                    if rx.eof:
                        rx.close()
                        del rx_of[p]
        return total
    rxs = [open_receiver(s, "soft", area_size=max(area // len(conns), 2 << 20),
                         buf_size=64 << 10, max_held=1.0) for s in conns]
    while rxs:
        for rx in list(rxs):
            for c in rx.recv(0):
                total += c.length
                c.release()
            if rx.eof:
                rx.close()
                rxs.remove(rx)
    return total


def run(kind: str, n: int, total: int, area: int) -> tuple[float, float]:
    """(Gbit/s, receiver CPU seconds per GiB) of one cell."""
    with socket.create_server(("127.0.0.1", 0), backlog=n) as srv:
        p = mp.get_context("fork").Process(target=send_all,
                                           args=(srv.getsockname()[1], n, total // n))
        p.start()
        conns = [srv.accept()[0] for _ in range(n)]
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        got = serve(kind, conns, area)
        dt = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for s in conns:
            s.close()
        p.join()
    if got != total // n * n:
        raise SystemExit(f"{kind} x{n}: got {got} of {total // n * n} bytes")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return got * 8 / dt / 1e9, cpu / (got / (1 << 30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=64, help="MiB per cell (split over connections)")
    ap.add_argument("--conns", default="1,8,64", help="connection counts, comma-separated")
    ap.add_argument("--area-mib", type=int, default=32, help="the zcrx queue's area")
    args = ap.parse_args()
    if not kernel_offers().copy_mode:
        print(f"kernel {platform.release()} has no zcrx copy mode (7.x); run inside "
              "`zcnet vm run`", file=sys.stderr)
        return 2
    counts = [int(x) for x in args.conns.split(",")]
    total, area = args.mib << 20, args.area_mib << 20
    print(f"kernel {platform.release()}, loopback, {args.mib} MiB per cell, {args.rounds} "
          f"rounds, one receiving thread, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'conns':>5} {'zcrx Gbit/s':>12} {'soft Gbit/s':>12} {'ratio':>6} "
          f"{'zcrx s/GiB':>11} {'soft s/GiB':>11} {'ratio':>6}")
    for n in counts:
        cells: dict[str, list[tuple[float, float]]] = {"zcrx": [], "soft": []}
        for r in range(args.rounds):
            for kind in (("zcrx", "soft") if r % 2 == 0 else ("soft", "zcrx")):
                cells[kind].append(run(kind, n, total, area))
        g = {k: statistics.median(x[0] for x in v) for k, v in cells.items()}
        c = {k: statistics.median(x[1] for x in v) for k, v in cells.items()}
        print(f"{n:>5} {g['zcrx']:>12.3f} {g['soft']:>12.3f} {g['zcrx'] / g['soft']:>6.2f} "
              f"{c['zcrx']:>11.2f} {c['soft']:>11.2f} {c['zcrx'] / c['soft']:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
