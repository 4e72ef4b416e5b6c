"""Many streams on one CPU: a buffer group per stream against one small pool that all share.

    python benchmarks/uring_pool.py                        # 100 streams, 2 GiB, 3 rounds
    python benchmarks/uring_pool.py --gib 0.25 --rounds 1 --verify

The question it answers. A zcnet.aio receiver without ``pool=`` has a provided-buffer group over
an area of its own (2 MiB each, say, for 100 streams). On one CPU the sender fills every
socket before the loop runs, each pass copies a whole area per stream, and 100 areas are far
more than the CPU's cache: the copy into them, and the sender's copy after it, miss (docs/aio.md,
"A pool per loop"). uvloop BufferedProtocol with SO_RCVLOWAT reads each socket into a buffer it
reuses at once and runs at about twice the rate. Would one small group shared by every stream,
refilled by whichever stream has data, close that gap?

Rows, each a receiving process on the first CPU fed by a sender process on the same CPU over
loopback (the issue's CPU-bound case), CPU per GiB of the receiving process (user + system):

  per-stream   zcnet.uring only: one io_uring (DEFER_TASKRUN), a multishot bundle receive per
               stream on a group of its own (``--area`` KiB), every chunk released at once, a
               receive that ended re-armed in the next pass (what zcnet.aio does)
  pool         the same ring, every stream's receive on ONE group (``--pool`` KiB). Completions
               are read in CQ order, so a bundle's buffers are the next ones in the shared
               ring's order. The pool runs dry every pass, which ends receives (the bundle that
               took the last buffer, -ENOBUFS for the others); those wait in a queue and
               ``--pace`` of them are re-armed per pass
  zcnet-proto  zcnet.aio's callback style on uvloop, every stream on the loop's pool of
               ``--pool`` KiB (``pool=``; aio_stream.py's row)
  uvloop-proto, uvloop-proto-lowat   aio_stream.py's anchors (the latter with SO_RCVLOWAT)

The first two use zcnet's ring layer with no event loop: they compare the buffer layouts, not
zcnet.aio. ``--verify`` sends zcnet's stream pattern and checks every byte of every chunk
(slower; for tests). Every zcnet row sets SO_RCVLOWAT ``--rcvlowat``.
"""

from __future__ import annotations

import quiet_blas  # noqa: F401  (first: before numpy is imported)

# isort: split
import argparse
import collections
import errno
import multiprocessing as mp
import os
import resource
import socket
import statistics
import time
from typing import Any

from aio_stream import measure as measure_aio  # the asyncio rows, as measured there
from aio_stream import send_main  # the same sender for every row

from zcnet.aio.pool import POOL_SIZE
from zcnet.pattern import StreamPattern
from zcnet.rx.zc.provider import RING_FLAGS
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing
from zcnet.uring.prep import prep_recv_multishot
from zcnet.uring.ring import Ring

AIO_ROWS = ("zcnet-proto", "uvloop-proto", "uvloop-proto-lowat")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Streams:
    """The receiving side of one run: ``conns`` on one ring, in groups of ``layout``."""

    def __init__(self, conns: list[socket.socket], layout: str, area: int, pool: int,
                 buf_size: int, pace: int, pattern: StreamPattern | None) -> None:
        self.conns, self.pace, self.pattern = conns, pace, pattern
        self.fds = [c.fileno() for c in conns]
        self.got = [0] * len(conns)
        self.rearms = self.nobufs = 0
        self.ring = Ring(256, flags=RING_FLAGS, cq_entries=16384)
        self.bufs: list[BufRing] = []
        try:
            if layout == "pool":
                shared = BufRing(self.ring, 0, pool // buf_size, buf_size)
                self.bufs = [shared]
                self.group = [shared] * len(conns)
                self.bgid = [0] * len(conns)
            else:
                self.bufs = [BufRing(self.ring, i, area // buf_size, buf_size)
                             for i in range(len(conns))]
                self.group, self.bgid = self.bufs, list(range(len(conns)))
        except BaseException:
            self.close()
            raise

    def arm(self, i: int) -> None:
        prep_recv_multishot(self.ring, self.fds[i], self.bgid[i], i, bundle=True)

    def run(self) -> None:
        """Until every stream's EOF: reap in CQ order, release at once, re-arm what ended."""
        for i in range(len(self.conns)):
            self.arm(i)
        live = len(self.conns)
        waiting: collections.deque[int] = collections.deque()
        ring, group, got, pattern = self.ring, self.group, self.got, self.pattern
        while live:
            # Never block while a stream waits for its re-arm: its data may be what the
            # sender is stuck behind.
            ring.submit(wait_nr=0 if waiting else 1)
            c = ring.reap()
            for i, res, fl in zip(c.user_data.tolist(), c.res.tolist(), c.flags.tolist(),
                                  strict=True):
                if res > 0:
                    buf = group[i]
                    ids = buf.consumed_ids(res, fl >> u.IORING_CQE_BUFFER_SHIFT)
                    if pattern is not None:
                        self._check(i, buf, ids, res)
                    got[i] += res
                    buf.provide_few(ids)
                if fl & u.IORING_CQE_F_MORE:
                    continue
                if res == 0:  # EOF
                    live -= 1
                elif res > 0 or res == -errno.ENOBUFS:
                    self.nobufs += res < 0
                    waiting.append(i)
                else:
                    raise OSError(-res, f"stream {i}: {os.strerror(-res)}")
            n = len(waiting) if not self.pace else min(self.pace, len(waiting))
            for _ in range(n):
                self.arm(waiting.popleft())
            self.rearms += n

    def _check(self, i: int, buf: BufRing, ids: list[int], res: int) -> None:
        assert self.pattern is not None
        at, left = self.got[i], res
        for bid in ids:
            n = min(left, buf.buf_size)
            if (buf.buffer(bid, n) != self.pattern.expected(at, n)).any():
                raise SystemExit(f"stream {i}: wrong bytes at offset {at} (buffer {bid})")
            at += n
            left -= n

    def close(self) -> None:
        for b in self.bufs:
            b.close()
        self.ring.close()


def receive_main(layout: str, args: argparse.Namespace, srv: socket.socket, out: Any) -> None:
    os.sched_setaffinity(0, {args.cpu})
    conns = [srv.accept()[0] for _ in range(args.streams)]
    t0, c0 = time.perf_counter(), _cpu()
    for c in conns:
        if args.rcvlowat:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, args.rcvlowat << 10)
    s = Streams(conns, layout, args.area << 10, args.pool << 10, args.buf << 10, args.pace,
                StreamPattern() if args.verify else None)
    try:
        s.run()
    finally:
        s.close()
        for c in conns:
            c.close()
    out.send((s.got, time.perf_counter() - t0, _cpu() - c0, s.rearms, s.nobufs))


def measure(layout: str, args: argparse.Namespace, per: int) -> dict[str, float]:
    ctx = mp.get_context("fork")
    with socket.create_server(("127.0.0.1", 0), backlog=args.streams) as srv:
        rd, wr = ctx.Pipe(duplex=False)
        rp = ctx.Process(target=receive_main, args=(layout, args, srv, wr))
        rp.start()
        sp = ctx.Process(target=send_main, args=(srv.getsockname()[1], args.streams, per,
                                                 args.cpu, args.verify))
        sp.start()
    try:
        if not rd.poll(600):
            raise SystemExit(f"{layout}: no result in 10 minutes")
        got, secs, cpu, rearms, nobufs = rd.recv()
    except EOFError:
        raise SystemExit(f"{layout}: the receiving process failed (its error is above)") from None
    finally:
        rp.join(5)
        sp.join(5)
        for p in (rp, sp):
            if p.is_alive():
                p.kill()
                p.join()
    if got != [per] * args.streams:
        raise SystemExit(f"{layout}: received {sum(got)} of {per * args.streams} bytes")
    gib = per * args.streams / (1 << 30)
    return {"gbps": per * args.streams * 8 / secs / 1e9, "cpu_ms_per_gib": cpu / gib * 1e3,
            "rearms_per_gib": rearms / gib, "nobufs_per_gib": nobufs / gib}


def aio_args(args: argparse.Namespace) -> argparse.Namespace:
    """aio_stream.py's options for its rows: zcnet.aio's pool of ``--pool`` KiB, our buffers
    and rcvlowat."""
    return argparse.Namespace(zc_area=args.area, zc_buf=args.buf, zc_many_area=args.area,
                              zc_many_buf=args.buf, zc_many_pool=args.pool,
                              rcvlowat=args.rcvlowat, streams=args.streams)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="bytes per row, GiB (default 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--area", type=int, default=2048, help="per-stream group, KiB (default 2048)")
    ap.add_argument("--pool", type=int, default=POOL_SIZE >> 10,
                    help=f"the shared group, KiB (default {POOL_SIZE >> 10}, zcnet.aio's)")
    ap.add_argument("--buf", type=int, default=64, help="buffer size, KiB (default 64)")
    ap.add_argument("--pace", type=int, default=2,
                    help="pool: receives re-armed per pass (0: all; default 2)")
    ap.add_argument("--rcvlowat", type=int, default=1024, help="SO_RCVLOWAT, KiB (0: none)")
    ap.add_argument("--verify", action="store_true", help="check every byte (ring rows)")
    ap.add_argument("--no-aio", action="store_true", help="only the two ring rows")
    args = ap.parse_args()
    for name in ("gib", "rounds", "streams", "area", "pool", "buf"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be positive")
    if args.pace < 0 or args.rcvlowat < 0:
        ap.error("--pace and --rcvlowat must be 0 or more")
    for name in ("area", "pool"):
        n = getattr(args, name) // args.buf
        if getattr(args, name) % args.buf or n & (n - 1) or n > 32768:
            ap.error(f"--{name} must be a power-of-two number of --buf buffers (at most 32768)")
    args.cpu = min(os.sched_getaffinity(0))
    per = int(args.gib * (1 << 30)) // args.streams
    layouts = ["per-stream", "pool"] + ([] if args.no_aio else list(AIO_ROWS))
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in layouts}
    aargs = aio_args(args)
    for r in range(args.rounds):
        for n in layouts[r % len(layouts):] + layouts[:r % len(layouts)]:
            rows[n].append(measure_aio(n, aargs, args.streams, per * args.streams,
                                       (args.cpu, args.cpu))
                           if n in AIO_ROWS else measure(n, args, per))
    med = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in rows.items()}
    print(f"{args.streams} streams, {per * args.streams / (1 << 30):.2f} GiB, sender and "
          f"receiver on CPU {args.cpu}, median of {args.rounds}; per-stream groups "
          f"{args.area} KiB, pool {args.pool} KiB, {args.buf} KiB buffers, pace {args.pace}, "
          f"SO_RCVLOWAT {args.rcvlowat} KiB{', every byte verified' if args.verify else ''}")
    for n, m in med.items():
        extra = (f"  re-arms/GiB {m['rearms_per_gib']:.0f}"
                 + (f" (-ENOBUFS {m['nobufs_per_gib']:.0f})" if n == "pool" else "")
                 if "nobufs_per_gib" in m else "")
        spread = ", ".join(f"{x['gbps']:.1f}" for x in rows[n])
        print(f"  {n:18s} {m['gbps']:6.2f} Gbit/s {m['cpu_ms_per_gib']:7.1f} ms CPU/GiB  "
              f"(rounds: {spread}){extra}")
    pool, per_stream = med["pool"], med["per-stream"]
    print(f"pool / per-stream: {pool['gbps'] / per_stream['gbps']:.2f}x Gbit/s, "
          f"{pool['cpu_ms_per_gib'] / per_stream['cpu_ms_per_gib']:.2f}x CPU/GiB")
    if not args.no_aio:
        for n in ("pool", "per-stream", "zcnet-proto", "uvloop-proto-lowat"):
            print(f"{n} / uvloop-proto: {med[n]['gbps'] / med['uvloop-proto']['gbps']:.2f}x "
                  "Gbit/s")


if __name__ == "__main__":
    main()
