"""Connection churn: what a zcnet.aio server pays per connection, against a uvloop Protocol
server, in one run.

    python benchmarks/aio_churn.py                          # 2000 connections, 1 and 8 at once
    python benchmarks/aio_churn.py --connections 200 --rounds 1   # a quick look

Each connection is opened, sends 64 bytes, reads the echo and is closed by the client. Servers,
each in its own process on uvloop, pinned to one CPU (the client threads to another):

  uvloop-proto  ``data_received`` -> ``transport.write``
  zcnet         task style: ``open_receiver`` per accepted socket, ``async for``, the loop's
                ``sock_sendall``
  zcnet-proto   callback style: ``start_protocol`` per accepted socket, ``transport.write``
  .../kept      the same two, serving inside ``async with zcnet.aio.keep_ring()``
  .../pool      the same two inside ``keep_ring``, each receiver on the loop's pool
                (``pool=True``: no area of its own to populate, no buffer ring to register)

The zcnet rows use zcnet.aio's default area (``--area``), what a service gets. Opening a
receiver populates its area unless the loop's ring kept one from a closed receiver (spare
areas, docs/aio.md), and the ring itself is set up with the loop's first receiver and torn
down with its last. With ``--concurrency 1`` every connection is the loop's only one: without
``keep_ring`` each pays for a ring and a new area; the /kept rows hold the ring and its spare
areas between connections, as a server should.

Reported: connections per second and the server's CPU time per connection (user + system,
getrusage of the server process over the measured connections); medians over rounds, every
server measured in each round in rotating order.
"""

from __future__ import annotations

import quiet_blas  # noqa: F401  (first: before numpy is imported)

# isort: split
import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import resource
import socket
import statistics
import threading
import time
from typing import Any

import uvloop
from aio_echo import EchoProto, ZcEcho  # the echo servers' protocols, as measured there

from zcnet import aio
from zcnet.aio.receiver import AREA_SIZE, BUF_SIZE
from zcnet.aio.shared import loop_backend
from zcnet.uring.syscall import backend

MSG = 64
KEPT = "/kept"  # suffix: the server holds its loop's ring with zcnet.aio.keep_ring()
POOLED = "/pool"  # suffix: the same, and its receivers are on the loop's pool
SERVERS = ("uvloop-proto", "zcnet", "zcnet-proto", "zcnet" + KEPT, "zcnet-proto" + KEPT,
           "zcnet" + POOLED, "zcnet-proto" + POOLED)


async def zc_echo(conn: socket.socket, area: int, pool: bool) -> None:
    loop = asyncio.get_running_loop()
    async with aio.open_receiver(conn, own_socket=True, area_size=area,
                                 buf_size=min(BUF_SIZE, area // 2), pool=pool) as rx:
        async for chunk in rx:
            data = bytes(chunk.data)
            chunk.release()
            await loop.sock_sendall(conn, data)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def server_main(name: str, srv: socket.socket, cpu: int, area: int, ctl: Any) -> None:
    """Serves until the parent closes ``ctl``; answers each byte on it with its CPU time."""
    os.sched_setaffinity(0, {cpu})
    pool = name.endswith(POOLED)
    keep = pool or name.endswith(KEPT)
    name = name.removesuffix(KEPT).removesuffix(POOLED)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        srv.setblocking(False)
        # the ring (and the areas it keeps) stays open between connections
        keeper = aio.keep_ring() if keep else None
        stop = loop.create_future()

        def on_ctl() -> None:
            try:
                more = ctl.recv()
            except EOFError:  # the parent is gone
                more = False
            if more:
                ctl.send(_cpu())
            elif not stop.done():
                loop.remove_reader(ctl.fileno())
                stop.set_result(None)

        loop.add_reader(ctl.fileno(), on_ctl)
        tasks: set[asyncio.Task[None]] = set()

        async def accept() -> None:
            while True:
                c, _ = await loop.sock_accept(srv)
                c.setblocking(False)
                if name == "zcnet":
                    t = asyncio.create_task(zc_echo(c, area, pool))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                elif name == "zcnet-proto":
                    aio.start_protocol(c, ZcEcho(), area_size=area,
                                       buf_size=min(BUF_SIZE, area // 2), pool=pool)
                else:
                    await loop.connect_accepted_socket(EchoProto, c)

        acceptor = asyncio.create_task(accept())
        ctl.send(_cpu())  # ready
        await stop
        acceptor.cancel()
        if keeper is not None:
            keeper.close()

    uvloop.run(main())


def client(port: int, connections: int, concurrency: int, cpu: int) -> float:
    """Seconds to open, echo 64 B over, and close ``connections`` connections, ``concurrency``
    at a time (threads with blocking sockets, pinned to ``cpu``)."""
    left = [connections]
    lock = threading.Lock()
    errors: list[BaseException] = []
    payload = b"x" * MSG

    def worker() -> None:
        os.sched_setaffinity(0, {cpu})
        try:
            while True:
                with lock:
                    if not left[0]:
                        return
                    left[0] -= 1
                with socket.create_connection(("127.0.0.1", port)) as s:
                    s.sendall(payload)
                    got = 0
                    while got < MSG:
                        n = len(s.recv(MSG - got))
                        if not n:
                            raise ConnectionError("the server closed before echoing")
                        got += n
        except BaseException as e:  # reported by the caller, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"client failed: {errors[0]!r}")
    return time.perf_counter() - t0


def measure(name: str, args: argparse.Namespace, concurrency: int) -> dict[str, float]:
    ctx = mp.get_context("fork")
    with socket.create_server(("127.0.0.1", 0), backlog=1024) as srv:
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=server_main,
                        args=(name, srv, args.cpus[0], args.area << 10, theirs))
        p.start()
        theirs.close()
        try:
            if not ours.poll(30):
                raise SystemExit(f"{name}: the server did not start")
            ours.recv()
            port = srv.getsockname()[1]
            client(port, min(50, args.connections), concurrency, args.cpus[1])  # warm-up
            ours.send(True)
            c0 = ours.recv()
            secs = client(port, args.connections, concurrency, args.cpus[1])
            ours.send(True)
            c1 = ours.recv()
        finally:
            with contextlib.suppress(OSError):  # the server may be gone already
                ours.send(False)
            ours.close()
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return {"rate": args.connections / secs, "cpu_us": (c1 - c0) / args.connections * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=2000, help="per measurement")
    ap.add_argument("--concurrency", default="1,8",
                    help="comma-separated numbers of connections open at once")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--area", type=int, default=AREA_SIZE >> 10,
                    help="zcnet area per connection, KiB (default: zcnet.aio's)")
    ap.add_argument("--only", help="comma-separated servers (default: all)")
    args = ap.parse_args()
    try:
        levels = [int(x) for x in args.concurrency.split(",")]
    except ValueError:
        raise SystemExit(f"--concurrency takes numbers such as 1,8, got {args.concurrency!r}") \
            from None
    names = args.only.split(",") if args.only else list(SERVERS)
    bad = [n for n in names if n not in SERVERS]
    if bad:
        raise SystemExit(f"unknown server {bad[0]!r}: pick from {', '.join(SERVERS)}")
    if args.connections < 1 or args.rounds < 1 or args.area < 8 or min(levels) < 1:
        raise SystemExit("--connections, --rounds and --concurrency must be at least 1, "
                         "--area at least 8 (KiB)")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the server, one for the client")
    args.cpus = cpus[:2]
    print(f"hot path: ring {backend()}, loop pass {loop_backend()}; zcnet area {args.area} KiB; "
          f"server CPU {args.cpus[0]}, client CPU {args.cpus[1]}")
    for conc in levels:
        rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                rows[n].append(measure(n, args, conc))
        med = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in rows.items()}
        print(f"\n{args.connections} connections, {conc} at a time, median of {args.rounds}")
        for n, m in med.items():
            spread = ", ".join(f"{x['rate']:.0f}" for x in rows[n])
            print(f"  {n:17s} {m['rate']:8.0f} connections/s  server CPU {m['cpu_us']:7.1f} "
                  f"us per connection  (rounds: {spread})")
        if "uvloop-proto" in med:
            base = med["uvloop-proto"]
            for n in names:
                if n != "uvloop-proto":
                    print(f"target churn_{conc}_{n}_vs_uvloop_proto "
                          f"{med[n]['rate'] / base['rate']:.2f} x goal report")


if __name__ == "__main__":
    main()
