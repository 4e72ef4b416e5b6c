"""64-byte echo latency: a zcnet.aio server against a uvloop Protocol server, in one run.

    python benchmarks/aio_echo.py                     # 1 and 50 clients, 5 s each, 3 rounds
    python benchmarks/aio_echo.py --seconds 1 --rounds 1   # a quick look

Servers (each in its own process, on uvloop):

  uvloop-proto  ``data_received`` -> ``transport.write`` (the usual asyncio echo server)
  uvloop-streams  task style on asyncio streams: ``await reader.read()`` -> ``writer.write`` ->
                ``await writer.drain()``, a coroutine per connection (what the task-style row is
                fairly compared with; its ratio is printed, the issue's targets use uvloop-proto)
  zcnet         task style: ``async for chunk in rx`` -> ``await tx.sendall(chunk.data)`` ->
                ``chunk.release()`` (soft provider, copy sender: 64 B gains nothing from SEND_ZC)
  zcnet-proto   callback style: ``ZcProtocol.chunk_received`` -> ``transport.write(chunk.data)``
                -> ``chunk.release()``, called from the shared ring's dispatch (no Task)

The client process (uvloop, one Protocol per connection) keeps one 64-byte request in flight per
connection and records each round trip once every connection has had its first reply and a
warm-up has passed (connection setup is not measured); server and client sit on different CPUs.
p50 and p99 are medians over rounds, every server measured in each round in rotating order.
"""

from __future__ import annotations

import quiet_blas  # noqa: F401  (first: before numpy is imported)

# isort: split
import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import statistics
import time
from typing import Any

import numpy as np
import uvloop

from zcnet import aio
from zcnet.aio import taskrun
from zcnet.aio.shared import loop_backend
from zcnet.aio.taskrun import taskrun_name
from zcnet.uring.syscall import backend

MSG = 64


class EchoProto(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport

    def data_received(self, data: bytes) -> None:
        self.tr.write(data)  # type: ignore[attr-defined]


async def streams_echo(conn: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=conn)
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def zc_echo(conn: socket.socket) -> None:
    rx = aio.open_receiver(conn, "soft", own_socket=True, area_size=1 << 20, buf_size=4096)
    async with rx, aio.open_sender(conn, "copy") as tx:
        async for chunk in rx:
            await tx.sendall(chunk.data)
            chunk.release()


class ZcEcho(aio.ZcProtocol):
    def connection_made(self, transport: aio.ZcTransport) -> None:
        self.tr = transport

    def chunk_received(self, chunk: Any) -> None:
        self.tr.write(chunk.data)
        chunk.release()


def server_main(name: str, srv: socket.socket, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})

    async def main() -> None:
        loop = asyncio.get_running_loop()
        srv.setblocking(False)
        tasks = []
        while True:  # until the parent kills the process
            c, _ = await loop.sock_accept(srv)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.setblocking(False)
            if name in ("zcnet", "uvloop-streams"):
                echo = zc_echo if name == "zcnet" else streams_echo
                tasks.append(asyncio.create_task(echo(c)))
            elif name == "zcnet-proto":
                aio.start_protocol(c, ZcEcho(), area_size=1 << 20, buf_size=4096)
            else:
                await loop.connect_accepted_socket(EchoProto, c)

    uvloop.run(main())


class Client(asyncio.Protocol):
    """Keeps one request in flight; records round trips while ``record`` is set."""

    def __init__(self, rtts: list[int], state: dict[str, Any],
                 first: asyncio.Future[None], done: asyncio.Future[None]) -> None:
        self.rtts, self.state, self.first, self.done = rtts, state, first, done
        self.got = 0
        state.setdefault("replies", 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport
        self._send()

    def _send(self) -> None:
        self.t0 = time.perf_counter_ns()
        self.tr.write(b"x" * MSG)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got < MSG:
            return
        self.got -= MSG
        self.state["replies"] += 1
        if not self.first.done():
            self.first.set_result(None)
        if self.state["record"]:
            self.rtts.append(time.perf_counter_ns() - self.t0)
        if self.state["run"]:
            self._send()
        else:
            self.tr.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


def client_main(port: int, clients: int, seconds: float, warmup: float, cpu: int,
                out: Any) -> None:
    """Connect every client and wait for each one's first reply (the server has set the
    connection up), warm up, then record for ``seconds``."""
    os.sched_setaffinity(0, {cpu})

    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        rtts: list[int] = []
        state: dict[str, Any] = {"record": False, "run": True}
        firsts, dones = [], []
        for _ in range(clients):
            f: asyncio.Future[None] = loop.create_future()
            d: asyncio.Future[None] = loop.create_future()
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.create_connection(lambda f=f, d=d: Client(rtts, state, f, d), sock=s)
            firsts.append(f)
            dones.append(d)
        await asyncio.gather(*firsts)
        await asyncio.sleep(warmup)
        state["record"] = True
        await asyncio.sleep(seconds)
        state["record"] = state["run"] = False
        await asyncio.gather(*dones)
        return rtts, state.get("replies", 0)

    out.send(uvloop.run(main()))


def measure(name: str, clients: int, args: argparse.Namespace,
            cpus: tuple[int, int]) -> dict[str, float]:
    ctx = mp.get_context("fork")
    srv = socket.create_server(("127.0.0.1", 0), backlog=clients)
    sp = ctx.Process(target=server_main, args=(name, srv, cpus[0]))
    sp.start()
    rd, wr = ctx.Pipe(duplex=False)
    cp = ctx.Process(target=client_main, args=(srv.getsockname()[1], clients, args.seconds,
                                              args.warmup, cpus[1], wr))
    cp.start()
    got, replies = rd.recv()
    rtts = np.asarray(got, dtype=np.float64) / 1e3
    cp.join()
    server_cpu = _process_cpu(sp.pid)  # every reply the server sent, warm-up included
    sp.kill()
    sp.join()
    srv.close()
    if not len(rtts):
        raise SystemExit(f"{name}: no round trips completed")
    return {"p50": float(np.percentile(rtts, 50)), "p99": float(np.percentile(rtts, 99)),
            "rps": len(rtts) / args.seconds, "cpu_us": server_cpu / max(1, replies) * 1e6}


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds a live process has used (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="1,50")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs")
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    names = ["uvloop-proto", "uvloop-streams", "zcnet", "zcnet-proto"]
    print(f"hot path: ring {backend()} (zcnet.uring._accel), loop pass {loop_backend()} "
          f"(zcnet.aio._loopaccel), loop rings {taskrun_name()}_taskrun (zcnet.aio.taskrun; "
          f"{taskrun.ENV}=defer|coop to choose)")
    results: dict[int, dict[str, dict[str, float]]] = {}
    for n in map(int, args.clients.split(",")):
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in names}
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                rows[k].append(measure(k, n, args, (c0, c1)))
        med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in rows.items()}
        results[n] = med
        print(f"\n{n} client(s), {MSG} B echo, server CPU {c0}, client CPU {c1}, "
              f"median of {args.rounds} x {args.seconds:g} s")
        for k, m in med.items():
            print(f"  {k:14s} p50 {m['p50']:7.1f} us  p99 {m['p99']:7.1f} us  "
                  f"{m['rps']:9.0f} req/s  server CPU {m['cpu_us']:5.1f} us/request")
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for n, med in results.items():
        for q in ("p50", "p99"):
            for k, style in (("zcnet", "task"), ("zcnet-proto", "callback")):
                ratio = med[k][q] / med["uvloop-proto"][q]
                print(f"target echo_{n}_clients_{q}_zcnet_{style}_vs_uvloop {ratio:.2f} x "
                      "goal <=1.0")
    print("\ntask style against asyncio's own (uvloop-streams; not the issue's targets):")
    for n, med in results.items():
        print(f"  {n} client(s): " + ", ".join(
            f"{q} {med['zcnet'][q] / med['uvloop-streams'][q]:.2f}x" for q in ("p50", "p99")))


if __name__ == "__main__":
    main()
