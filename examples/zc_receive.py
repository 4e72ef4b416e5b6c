"""Receive a TCP stream zero-copy and checksum it, releasing chunks from a worker thread.

    python examples/zc_receive.py                 # self-contained: sends 256 MiB over loopback
    python examples/zc_receive.py --provider auto --connect HOST:PORT
    python examples/zc_receive.py --provider zcrx --ifname eth1 --queue 3 --connect HOST:PORT

Each chunk is a view into the registered area (no copy): hash it, then release it so the kernel
may fill that memory again. Releases happen in the worker thread; the receiving thread hands
them back to the kernel in batches.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import queue
import socket
import threading
import time

from zcnet.errors import ZcnetError
from zcnet.rx.zc import Chunk, open_receiver


def serve_random(total: int) -> tuple[socket.socket, bytes, threading.Thread]:
    """A loopback connection fed with ``total`` random bytes; returns the receiving socket, the
    expected digest and the sending thread."""
    block = os.urandom(1 << 20)
    digest = hashlib.blake2b()
    for _ in range(total // len(block)):
        digest.update(block)
    srv = socket.create_server(("127.0.0.1", 0))
    out = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    srv.close()

    def send() -> None:
        with out:
            try:
                for _ in range(total // len(block)):
                    out.sendall(block)
            except OSError:
                pass  # the receiver gave up; it reports why

    t = threading.Thread(target=send)
    t.start()
    return conn, digest.digest(), t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", default="soft", help="soft, zcrx, devmem or auto")
    ap.add_argument("--connect", metavar="HOST:PORT", help="read from this server instead")
    ap.add_argument("--ifname")
    ap.add_argument("--queue", type=int)
    ap.add_argument("--mib", type=int, default=256, help="loopback mode: MiB to send")
    args = ap.parse_args()

    sender = None
    expected = None
    if args.connect:
        host, port = args.connect.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
    else:
        sock, expected, sender = serve_random(args.mib << 20)

    digest = hashlib.blake2b()
    work: queue.SimpleQueue[list[Chunk] | None] = queue.SimpleQueue()

    def consumer() -> None:
        while (batch := work.get()) is not None:
            for chunk in batch:
                digest.update(chunk.data)   # reads the area in place
            rx.release_many(batch)          # any thread may release

    try:
        rx = open_receiver(sock, args.provider, ifname=args.ifname, queue=args.queue)
    except ZcnetError as e:
        print(f"error: {e}")
        sock.close()
        if sender:
            sender.join()
        return 1
    t0 = time.perf_counter()
    with sock, rx:
        print(f"provider {rx.name}: {rx.why}")
        worker = threading.Thread(target=consumer)
        worker.start()
        try:
            while True:
                chunks = rx.recv()          # owner thread: receive, recycle released chunks
                if not chunks and rx.eof:
                    break
                work.put(chunks)
        finally:
            work.put(None)
            worker.join()
        rx.flush()
        stats = rx.stats_dict()
    seconds = time.perf_counter() - t0
    if sender:
        sender.join()
    nbytes = stats["delivered_bytes"]
    print(f"{nbytes} bytes in {seconds:.2f} s = {nbytes * 8 / seconds / 1e9:.1f} Gbit/s; "
          f"{stats['delivered']} chunks, peak {stats['peak_in_flight']} held, "
          f"{stats['backpressure']} back-pressure pauses")
    if expected is not None:
        ok = digest.digest() == expected
        print("digest", "matches" if ok else "MISMATCH")
        return 0 if ok else 1
    print("blake2b", digest.hexdigest())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
