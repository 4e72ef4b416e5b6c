"""Echo / request-response service: an ordinary asyncio ``start_server`` handing its
connections to zcnet.aio in three lines.

    python examples/aio_echo.py                    # self-test: 50 clients x 200 requests
    python examples/aio_echo.py --listen 127.0.0.1:7000        # serve until Ctrl-C
    python examples/aio_echo.py --callbacks        # the same service as a zcnet.aio.ZcProtocol

Protocol: a request is a 4-byte big-endian length and that many bytes; the reply is the same
frame with the payload upper-cased. The server parses frames straight from the chunks (views
into the receiver's area) and sends replies with the async sender; it copies only the bytes
of a frame that straddles two chunks.

Two styles of the same server: a task per connection (``handle``: ``await rx.recv()``, ``await
tx.sendall``), and ``--callbacks`` (``FrameProtocol``: ``chunk_received`` called from the loop's
shared io_uring, replies written from the callback; no task wake-up per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import time
from typing import Any

import aio_common

from zcnet import aio

HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 20


class Frames:
    """Sans-I/O framing: feed views, get complete payloads (bytes) out."""

    def __init__(self) -> None:
        self.partial = bytearray()

    def feed(self, view: memoryview) -> list[bytes]:
        out = []
        if self.partial:
            self.partial += view
            view = memoryview(bytes(self.partial))
            self.partial.clear()
        while len(view) >= HEADER.size:
            (n,) = HEADER.unpack_from(view)
            if n > MAX_FRAME:
                raise ValueError(f"frame of {n} bytes exceeds {MAX_FRAME}")
            if len(view) < HEADER.size + n:
                break
            out.append(bytes(view[HEADER.size:HEADER.size + n]).upper())
            view = view[HEADER.size + n:]
        self.partial += view
        return out


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock, early = await aio.adopt_stream(reader, writer)         # 1: take the connection over
    rx = aio.open_receiver(sock, "soft", own_socket=True,        # 2: zero-copy receive
                           area_size=1 << 20, buf_size=16 << 10)
    async with rx, aio.open_sender(sock, "copy") as tx:          # 3: async send
        frames = Frames()
        replies = frames.feed(memoryview(early))
        with contextlib.suppress(ConnectionResetError):
            while True:
                for reply in replies:
                    await tx.sendall(HEADER.pack(len(reply)) + reply)
                chunks = await rx.recv()
                if not chunks:
                    break
                replies = []
                for chunk in chunks:
                    replies += frames.feed(chunk.data)
                    chunk.release()


class FrameProtocol(aio.ZcProtocol):
    """The callback style: frames parsed and answered inside ``chunk_received``."""

    def __init__(self, early: bytes) -> None:
        self.frames = Frames()
        self.early = early

    def connection_made(self, transport: aio.ZcTransport) -> None:
        self.tr = transport
        self.reply(self.frames.feed(memoryview(self.early)))

    def chunk_received(self, chunk: Any) -> None:
        try:
            self.reply(self.frames.feed(chunk.data))
        finally:
            chunk.release()

    def reply(self, replies: list[bytes]) -> None:
        for r in replies:
            self.tr.write(HEADER.pack(len(r)) + r)


async def handle_callbacks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock, early = await aio.adopt_stream(reader, writer)
    aio.start_protocol(sock, FrameProtocol(early), area_size=1 << 20, buf_size=16 << 10)


async def client(port: int, requests: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    rtts = []
    for i in range(requests):
        payload = os.urandom(16 + i % 200).hex().encode()
        t0 = time.perf_counter()
        writer.write(HEADER.pack(len(payload)) + payload)
        (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        reply = await reader.readexactly(n)
        rtts.append(time.perf_counter() - t0)
        if reply != payload.upper():
            raise SystemExit(f"bad reply {reply[:20]!r}")
    writer.close()
    await writer.wait_closed()
    return rtts


async def self_test(clients: int, requests: int, callbacks: bool) -> None:
    serving: set[asyncio.Task[None]] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        serving.add(asyncio.current_task())  # type: ignore[arg-type]
        await (handle_callbacks if callbacks else handle)(reader, writer)

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, aio.keep_ring():  # connections reuse the loop's ring and areas
        t0 = time.perf_counter()
        per_client = await asyncio.gather(*(client(port, requests) for _ in range(clients)))
        rtts = sorted(t for ts in per_client for t in ts)
        dt = time.perf_counter() - t0
        # Each handler ends on its client's EOF: wait for that rather than cancel it at exit.
        await asyncio.wait_for(asyncio.gather(*serving), 10)
    print(f"{len(rtts)} requests from {clients} clients in {dt:.2f} s: "
          f"p50 {rtts[len(rtts) // 2] * 1e6:.0f} us, p99 {rtts[len(rtts) * 99 // 100] * 1e6:.0f} us"
          "; every reply checked")


async def serve(host: str, port: int, callbacks: bool) -> None:
    server = await asyncio.start_server(handle_callbacks if callbacks else handle, host, port)
    print(f"serving on {host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server, aio.keep_ring():  # connections reuse the loop's ring and areas
        await server.serve_forever()


def main() -> None:
    ap = aio_common.parser(__doc__)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--callbacks", action="store_true",
                    help="serve with a zcnet.aio.ZcProtocol instead of a task per connection")
    args = ap.parse_args()
    aio_common.run(args, lambda host, port: serve(host, port, args.callbacks),
                   lambda: self_test(args.clients, args.requests, args.callbacks))


if __name__ == "__main__":
    main()
