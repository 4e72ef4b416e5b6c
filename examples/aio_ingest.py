"""TCP ingest service on one asyncio loop: many concurrent streams, received zero-copy.

    python examples/aio_ingest.py                          # self-test: 64 streams x 16 MiB
    python examples/aio_ingest.py --out /tmp/ingest        # each stream into its own file
    python examples/aio_ingest.py --listen 127.0.0.1:9000 --streams 0   # serve until Ctrl-C

Each connection gets a zcnet.aio receiver (``--provider``, soft by default; ``--pool``: all of
them on the loop's one small pool instead of an area each). A chunk is a view into the
receiver's registered area: the numpy consumer checksums it in place, the file
consumer hands the view straight to os.write (no copy in Python); then the chunk is released
and the kernel may fill that memory again.

Bulk streams set ``rcvlowat`` (``--rcvlowat``, 1 MiB by default): TCP wakes the loop once that
much is queued instead of on every segment, which saves kernel and loop work per byte; the end
of a stream still wakes it with less queued. A request/response service must leave it at 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time
from pathlib import Path

import aio_common
import numpy as np

from zcnet import aio
from zcnet.rx.engine import RCVLOWAT


async def ingest(sock: socket.socket, out: Path | None, name: str, provider: str = "soft",
                 rcvlowat: int = RCVLOWAT, pool: bool = False) -> tuple[int, int]:
    """Receive one stream to EOF; returns (bytes, checksum of the bytes as uint64 sum)."""
    total = checksum = 0
    fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if out else -1
    try:
        async with aio.open_receiver(sock, provider, own_socket=True, rcvlowat=rcvlowat,
                                     pool=pool) as rx:
            while (batch := await rx.recv_batch()) is not None:
                for view in batch.views(coalesce=True):
                    if fd >= 0:
                        while view:  # page-cache writes; a slow disk would want a thread
                            view = view[os.write(fd, view):]
                    else:
                        checksum += int(np.frombuffer(view, np.uint8).sum(dtype=np.uint64))
                total += batch.length
                batch.release()
    finally:
        if fd >= 0:
            os.close(fd)
    return total, checksum


async def serve(listen: tuple[str, int], out: Path | None, expect: int,
                provider: str = "soft", rcvlowat: int = RCVLOWAT,
                pool: bool = False) -> list[tuple[int, int]]:
    """Accept connections and ingest each in its own task; with ``expect`` > 0 stop after that
    many streams ended, else serve until cancelled. ``pool``: every receiver on the loop's
    pool, held (with the loop's ring) between connections."""
    loop = asyncio.get_running_loop()
    keeper = aio.keep_ring() if pool else None
    srv = socket.create_server(listen, backlog=1024)
    srv.setblocking(False)
    print(f"listening on {srv.getsockname()[0]}:{srv.getsockname()[1]}", flush=True)
    tasks: set[asyncio.Task] = set()
    results = []
    n = 0
    try:
        while expect <= 0 or n < expect:
            conn, peer = await loop.sock_accept(srv)
            n += 1
            tasks.add(loop.create_task(ingest(conn, out, f"stream-{n:05d}-{peer[1]}",
                                              provider, rcvlowat, pool)))
        results = await asyncio.gather(*tasks)
    finally:
        srv.close()
        if keeper is not None:
            keeper.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


async def feed(port: int, streams: int, size: int) -> int:
    """The self-test's clients: ``streams`` connections sending ``size`` bytes each."""
    block = np.arange(1 << 20, dtype=np.uint32).view(np.uint8)[: 1 << 20].copy()

    async def one() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for off in range(0, size, len(block)):
            writer.write(block[: min(len(block), size - off)].tobytes())
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    await asyncio.gather(*(one() for _ in range(streams)))
    full, rest = divmod(size, len(block))
    return streams * (full * int(block.sum(dtype=np.uint64))
                      + int(block[:rest].sum(dtype=np.uint64)))


async def self_test(args: argparse.Namespace) -> None:
    size = args.mib << 20
    port_box: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    srv = socket.create_server(("127.0.0.1", 0))
    port_box.set_result(srv.getsockname()[1])
    srv.close()  # serve() binds it again: the port is only borrowed here
    server = asyncio.create_task(serve(("127.0.0.1", port_box.result()), args.out,
                                       args.streams, args.provider, args.rcvlowat << 10,
                                       args.pool))
    await asyncio.sleep(0.1)
    t0 = time.perf_counter()
    want = await feed(port_box.result(), args.streams, size)
    results = await server
    dt = time.perf_counter() - t0
    got = sum(n for n, _ in results)
    print(f"{len(results)} streams, {got / (1 << 20):.0f} MiB in {dt:.2f} s "
          f"({got * 8 / dt / 1e9:.2f} Gbit/s)")
    if got != args.streams * size:
        raise SystemExit(f"received {got} of {args.streams * size} bytes")
    if args.out is None and sum(c for _, c in results) != want:
        raise SystemExit("checksum mismatch")
    print("every byte accounted for" + ("" if args.out else " (checksums match)"))


def main() -> None:
    ap = aio_common.parser(__doc__)
    ap.add_argument("--streams", type=int, default=64, help="streams (0: serve forever)")
    ap.add_argument("--mib", type=int, default=16, help="self-test MiB per stream")
    ap.add_argument("--out", type=Path, help="write each stream to a file in this directory")
    ap.add_argument("--provider", default="soft",
                    help="zero-copy provider: soft, zcrx, devmem or auto (auto probes the NIC "
                         "per connection, which costs time at open)")
    ap.add_argument("--rcvlowat", type=int, default=RCVLOWAT >> 10,
                    help="SO_RCVLOWAT of each stream, KiB (0: wake on any data)")
    ap.add_argument("--pool", action="store_true",
                    help="every stream on the loop's pool (2 MiB for all) instead of an area "
                         "each (soft provider)")
    args = ap.parse_args()
    if args.rcvlowat < 0:
        ap.error(f"--rcvlowat {args.rcvlowat}: expected KiB >= 0 (0 wakes on any data)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    aio_common.run(args, lambda host, port: serve((host, port), args.out, args.streams,
                                                  args.provider, args.rcvlowat << 10,
                                                  args.pool),
                   lambda: self_test(args))


if __name__ == "__main__":
    main()
