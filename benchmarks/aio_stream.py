"""zcnet.aio bulk receive against the event-loop receivers Python services use, in one run.

    python benchmarks/aio_stream.py                  # 4 GiB per case, 3 rounds (minutes)
    python benchmarks/aio_stream.py --gib 0.5 --rounds 1   # a quick look

Receivers, each in its own process on its own loop, fed by a sender process over loopback:

  streams        asyncio streams, ``await reader.read(65536)`` (default asyncio loop)
  asyncio-proto  asyncio BufferedProtocol into a 256 KiB buffer
  uvloop-proto   uvloop BufferedProtocol into a 256 KiB buffer
  uvloop-proto-lowat  the same with SO_RCVLOWAT ``--rcvlowat`` set on its socket
  zcnet          zcnet.aio, soft provider, ``await rx.recv_batch()`` + release (uvloop loop)
  zcnet-asyncio  the same on the default asyncio loop
  zcnet-proto    zcnet.aio callback style: ``ZcProtocol.chunk_received`` counts and releases
                 (uvloop loop; the shared ring's round, compiled when zcnet.aio._loopaccel is)
  blocking-1m    no loop: a blocking ``recv_into`` of 1 MiB (the issue's own ceiling for a
                 receiver that copies; printed as a reference, one-stream cases only)

The zcnet rows open their receivers with ``rcvlowat`` (``--rcvlowat``, 1 MiB by default: the
option zcnet.aio offers for bulk ingest, TCP wakes the reader once that much is queued). The
issue's targets compare against the plain rows, which wake on any data; the ratio against
uvloop-proto-lowat, which sets the same option, is printed after them so the gain that the
option alone brings to any receiver is visible.

Cases: one stream with the sender and the receiving loop pinned to ONE CPU (the loop's own cost
decides); the same on two CPUs (all meet at the kernel's copy; compare the receiving process's
CPU per GiB: user + system time, which includes the kernel's copy into the buffers); 100
concurrent streams on one loop, one CPU. Each round runs every receiver once in a rotating
order; medians over rounds are compared, so drift on a shared machine hits all alike.
"""

from __future__ import annotations

import quiet_blas  # noqa: F401  (first: before numpy is imported)

# isort: split
import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import selectors
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import uvloop

from zcnet import aio
from zcnet.aio import taskrun
from zcnet.aio.pool import POOL_SIZE
from zcnet.aio.receiver import AREA_SIZE, BUF_SIZE
from zcnet.aio.shared import loop_backend
from zcnet.aio.taskrun import taskrun_name
from zcnet.pattern import StreamPattern
from zcnet.rx.engine import RCVLOWAT
from zcnet.uring.syscall import backend

BLOCK = bytes(1 << 20)
#: The rows that set SO_RCVLOWAT (``--rcvlowat``).
LOWAT_ROWS = ("uvloop-proto-lowat", "zcnet", "zcnet-asyncio", "zcnet-proto")
PROTO_BUF = 256 << 10
#: Multishot receives the zcnet rows re-armed, summed over the receiving process's streams: each
#: one is a pass spent on a receive that ended (chiefly a bundle that took the ring's last buffer).
REARMS = [0]


def _cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


# --- receivers: each returns the bytes of one connection ---------------------------------------
async def recv_streams(conn: socket.socket) -> int:
    reader, writer = await asyncio.open_connection(sock=conn)
    n = 0
    while data := await reader.read(65536):
        n += len(data)
    writer.close()
    return n


class _Count(asyncio.BufferedProtocol):
    def __init__(self, done: asyncio.Future[int]) -> None:
        self.buf = bytearray(PROTO_BUF)
        self.n = 0
        self.done = done

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.n += nbytes

    def eof_received(self) -> bool:
        self.done.set_result(self.n)
        return False


async def recv_proto(conn: socket.socket) -> int:
    return await recv_proto_lowat(0)(conn)


def recv_proto_lowat(rcvlowat: int) -> Callable[[socket.socket], Any]:
    async def run(conn: socket.socket) -> int:
        if rcvlowat:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, rcvlowat)
        return await _recv_proto(conn)
    return run


async def _recv_proto(conn: socket.socket) -> int:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    tr, _ = await loop.connect_accepted_socket(lambda: _Count(done), conn)
    n = await done
    tr.close()
    return n


async def recv_blocking(conn: socket.socket) -> int:
    """No event loop at all: what a copying receiver gets with the least user-space work."""
    conn.setblocking(True)
    buf = memoryview(bytearray(1 << 20))
    n = 0
    while k := conn.recv_into(buf):
        n += k
    return n


def recv_zcnet(area: int, buf: int, rcvlowat: int, pool: int) -> Callable[[socket.socket], Any]:
    async def run(conn: socket.socket) -> int:
        n = 0
        async with aio.open_receiver(conn, "soft", own_socket=True, area_size=area,
                                     buf_size=buf, rcvlowat=rcvlowat,
                                     pool=pool or False) as rx:
            while (batch := await rx.recv_batch()) is not None:
                n += batch.length
                batch.release()
            REARMS[0] += rx.stats.rearms
        return n
    return run


class _ZcCount(aio.ZcProtocol):
    """Callback style: counts and releases each chunk inside ``chunk_received``."""

    def __init__(self, done: asyncio.Future[int]) -> None:
        self.n = 0
        self.done = done

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def chunk_received(self, chunk: Any) -> None:
        self.n += chunk.length
        chunk.release()

    def eof_received(self) -> bool:
        REARMS[0] += self.transport.stats.rearms
        self.done.set_result(self.n)
        return False


def recv_zcnet_proto(area: int, buf: int, rcvlowat: int,
                     pool: int) -> Callable[[socket.socket], Any]:
    async def run(conn: socket.socket) -> int:
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        aio.start_protocol(conn, _ZcCount(done), area_size=area, buf_size=buf,
                           rcvlowat=rcvlowat, pool=pool or False)
        return await done
    return run


def receivers_area(args: argparse.Namespace, streams: int = 100) -> tuple[int, int, int]:
    """(area, buffer size, pool) in KiB of each zcnet receiver. Many streams: the loop's pool
    (``--zc-many-pool``; docs/aio.md, "The loop's pool"), or with ``--zc-many-pool 0`` an area
    each, twice rcvlowat: a wake-up's bundle receive that takes the ring's last buffer ends the
    multishot (docs/aio.md, "Sizing the area"); with 1 MiB areas and 1 MiB rcvlowat that
    happened once per MiB."""
    if streams == 1:
        return args.zc_area, args.zc_buf, 0
    return (args.zc_many_area or max(2 * args.rcvlowat, 1024), args.zc_many_buf,
            args.zc_many_pool)


def receivers(args: argparse.Namespace,
              streams: int = 1) -> dict[str, tuple[Callable[[], Any], Any]]:
    area, buf, pool = receivers_area(args, streams)
    lowat = args.rcvlowat << 10
    zc = recv_zcnet(area << 10, buf << 10, lowat, pool << 10)
    return {
        "streams": (asyncio.new_event_loop, recv_streams),
        "asyncio-proto": (asyncio.new_event_loop, recv_proto),
        "uvloop-proto": (uvloop.new_event_loop, recv_proto),
        "uvloop-proto-lowat": (uvloop.new_event_loop, recv_proto_lowat(lowat)),
        "zcnet": (uvloop.new_event_loop, zc),
        "zcnet-proto": (uvloop.new_event_loop,
                        recv_zcnet_proto(area << 10, buf << 10, lowat, pool << 10)),
        "zcnet-asyncio": (asyncio.new_event_loop, zc),
        "blocking-1m": (asyncio.new_event_loop, recv_blocking),
    }


def receive_main(name: str, args: argparse.Namespace, srv: socket.socket, streams: int,
                 cpu: int, out: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    new_loop, handler = receivers(args, streams)[name]

    async def main() -> tuple[int, float, float, float]:
        loop = asyncio.get_running_loop()
        srv.setblocking(False)
        conns = []
        t0 = 0.0
        c0 = (0.0, 0.0)
        for i in range(streams):
            c, _ = await loop.sock_accept(srv)
            c.setblocking(False)
            if i == 0:
                t0, c0 = time.perf_counter(), _cpu()
            conns.append(c)
        got = await asyncio.gather(*(handler(c) for c in conns))
        c1 = _cpu()
        return (sum(got), time.perf_counter() - t0, c1[0] - c0[0], c1[1] - c0[1],
                REARMS[0])

    with asyncio.Runner(loop_factory=new_loop) as r:
        out.send(r.run(main()))


def send_main(port: int, streams: int, per_stream: int, cpu: int, verify: bool = False) -> None:
    """``streams`` connections of ``per_stream`` bytes each, round-robin as their sockets take
    data; ``verify``: zcnet's stream pattern instead of zeros (benchmarks/uring_pool.py)."""
    os.sched_setaffinity(0, {cpu})
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
    mv = memoryview(BLOCK)
    pattern = StreamPattern() if verify else None

    def chunk(at: int) -> Any:  # views, never copies
        n = min(len(mv), per_stream - at)
        return mv[:n] if pattern is None else pattern.expected(at, n)

    if streams == 1:
        s, sent = socks[0], 0
        while sent < per_stream:
            sent += s.send(chunk(sent))
        s.close()
        return
    sel = selectors.DefaultSelector()
    sent_on = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_WRITE)
        sent_on[s] = 0
    while sent_on:
        for key, _ in sel.select():
            s = key.fileobj
            try:
                sent_on[s] += s.send(chunk(sent_on[s]))
            except BlockingIOError:
                continue
            if sent_on[s] == per_stream:
                sel.unregister(s)
                s.close()
                del sent_on[s]


def measure(name: str, args: argparse.Namespace, streams: int, total: int,
            cpus: tuple[int, int]) -> dict[str, float]:
    ctx = mp.get_context("fork")
    per = total // streams
    with socket.create_server(("127.0.0.1", 0), backlog=streams) as srv:
        rd, wr = ctx.Pipe(duplex=False)
        rp = ctx.Process(target=receive_main, args=(name, args, srv, streams, cpus[0], wr))
        rp.start()
        sp = ctx.Process(target=send_main, args=(srv.getsockname()[1], streams, per, cpus[1]))
        sp.start()
    nbytes, secs, user, system, rearms = rd.recv()
    rp.join()
    sp.join()
    if nbytes != per * streams:
        raise SystemExit(f"{name}: received {nbytes} of {per * streams} bytes")
    gib = nbytes / (1 << 30)
    return {"gbps": nbytes * 8 / secs / 1e9, "cpu_ms_per_gib": (user + system) / gib * 1e3,
            "user_ms_per_gib": user / gib * 1e3, "rearms_per_gib": rearms / gib}


def run_case(title: str, args: argparse.Namespace, names: list[str], streams: int,
             cpus: tuple[int, int]) -> dict[str, dict[str, float]]:
    total = int(args.gib * (1 << 30)) // streams * streams
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            rows[n].append(measure(n, args, streams, total, cpus))
    med = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in rows.items()}
    print(f"\n{title}: {total / (1 << 30):.2f} GiB, {streams} stream(s), receiver CPU "
          f"{cpus[0]}, sender CPU {cpus[1]}, median of {args.rounds}")
    for n, m in med.items():
        spread = [f"{x['gbps']:.1f}" for x in rows[n]]
        print(f"  {n:14s} {m['gbps']:6.2f} Gbit/s  {m['cpu_ms_per_gib']:7.1f} ms CPU/GiB "
              f"({m['user_ms_per_gib']:6.1f} user)  (rounds: {', '.join(spread)})"
              + (f"  re-arms/GiB {m['rearms_per_gib']:.0f}" if n.startswith("zcnet") else ""))
    return med


def target(name: str, value: float, unit: str, goal: str) -> None:
    print(f"target {name} {value:.2f} {unit} goal {goal}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=4.0, help="bytes per case, GiB (default 4)")
    ap.add_argument("--rounds", type=int, default=3)
    # zcnet.aio's own defaults, what a service gets (a 32 MiB area of 256 KiB buffers, used
    # here before, took 80 ms of loop CPU per GiB on two CPUs against 58 for these).
    ap.add_argument("--zc-area", type=int, default=AREA_SIZE >> 10,
                    help="zcnet area, KiB (default: zcnet.aio's)")
    ap.add_argument("--zc-buf", type=int, default=BUF_SIZE >> 10,
                    help="zcnet soft buffer size, KiB (default: zcnet.aio's)")
    ap.add_argument("--zc-many-area", type=int, default=0,
                    help="zcnet area per stream in the many-stream case, KiB (default: twice "
                         "--rcvlowat, at least 1024)")
    ap.add_argument("--zc-many-buf", type=int, default=64,
                    help="zcnet soft buffer size in the many-stream case, KiB")
    ap.add_argument("--zc-many-pool", type=int, default=POOL_SIZE >> 10,
                    help="the many-stream case on the loop's pool of this many KiB (default: "
                         "zcnet.aio's; 0: an area per stream, --zc-many-area)")
    ap.add_argument("--streams", type=int, default=100, help="streams of the many-stream case")
    ap.add_argument("--rcvlowat", type=int, default=RCVLOWAT >> 10,
                    help="SO_RCVLOWAT of the zcnet and uvloop-proto-lowat rows, KiB (0: none)")
    ap.add_argument("--only", help="comma-separated receivers (no targets then)")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs")
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    names = list(receivers(args))
    print(f"hot path: ring {backend()} (zcnet.uring._accel), loop pass {loop_backend()} "
          f"(zcnet.aio._loopaccel), loop rings {taskrun_name()}_taskrun (zcnet.aio.taskrun; "
          f"{taskrun.ENV}=defer|coop to choose)")
    print(f"SO_RCVLOWAT {args.rcvlowat} KiB set by: {', '.join(LOWAT_ROWS)}; "
          "the other rows wake on any data")
    many_area = receivers_area(args)
    many = (f"the loop's pool of {many_area[2]} KiB" if many_area[2]
            else f"{many_area[0]} KiB each")
    print(f"zcnet areas: one stream {args.zc_area} KiB of {args.zc_buf} KiB buffers; "
          f"{args.streams} streams {many} of {many_area[1]} KiB buffers")
    if args.only:
        for case, cpus in (("one CPU", (c0, c0)), ("two CPUs", (c0, c1))):
            run_case(case, args, args.only.split(","), 1, cpus)
        return
    one = run_case("one CPU", args, names, 1, (c0, c0))
    two = run_case("two CPUs", args, names, 1, (c0, c1))
    many = run_case(f"{args.streams} streams, one CPU", args,
                    ["uvloop-proto", "uvloop-proto-lowat", "zcnet", "zcnet-proto", "streams"],
                    args.streams, (c0, c0))
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for k in ("zcnet", "zcnet-proto"):
        target(f"one_cpu_{k}_vs_streams", one[k]["gbps"] / one["streams"]["gbps"], "x", ">=1.5")
        target(f"one_cpu_{k}_vs_uvloop_proto", one[k]["gbps"] / one["uvloop-proto"]["gbps"],
               "x", ">=1.2")
        target(f"two_cpu_loop_cpu_per_gib_{k}_vs_uvloop_proto",
               two[k]["cpu_ms_per_gib"] / two["uvloop-proto"]["cpu_ms_per_gib"], "x", "<=0.8")
        target(f"{args.streams}_streams_{k}_vs_uvloop_proto",
               many[k]["gbps"] / many["uvloop-proto"]["gbps"], "x", ">=1.2")
        target(f"{args.streams}_streams_{k}_loop_cpu_per_gib", many[k]["cpu_ms_per_gib"],
               "ms/GiB", "report")
    top = one["blocking-1m"]["gbps"]
    print(f"\none CPU, the ceiling of a copying receiver: blocking recv_into of 1 MiB at "
          f"{top / one['uvloop-proto']['gbps']:.2f}x uvloop-proto; zcnet "
          f"{one['zcnet']['gbps'] / top:.2f}x and zcnet-proto "
          f"{one['zcnet-proto']['gbps'] / top:.2f}x of it")
    print(f"\nagainst uvloop BufferedProtocol with the same SO_RCVLOWAT ({args.rcvlowat} KiB; "
          "not the issue's targets, which are above):")
    for k in ("zcnet", "zcnet-proto"):
        lo = "uvloop-proto-lowat"
        print(f"  {k}: one CPU {one[k]['gbps'] / one[lo]['gbps']:.2f}x Gbit/s, two CPUs "
              f"{two[k]['cpu_ms_per_gib'] / two[lo]['cpu_ms_per_gib']:.2f}x CPU/GiB, "
              f"{args.streams} streams {many[k]['gbps'] / many[lo]['gbps']:.2f}x Gbit/s")

if __name__ == "__main__":
    main()
