"""Handing connections from an existing asyncio server (start_server or a Protocol) to zcnet."""

from __future__ import annotations

import asyncio

import pytest

from aio_util import LOOPS, StreamCheck, pattern, run
from zcnet import aio

pytestmark = pytest.mark.parametrize("loop_kind", list(LOOPS))
SIZE = 1 << 20


async def echo(sock, early: bytes = b"") -> None:
    """Echo everything back: receive zero-copy, send from the chunk's own memory."""
    rx = aio.open_receiver(sock, own_socket=True, area_size=1 << 20, buf_size=16 << 10)
    async with rx, aio.open_sender(sock, "copy") as tx:
        if early:
            await tx.sendall(early)
        async for chunk in rx:
            await tx.sendall(chunk.data)
            chunk.release()


async def client(port: int, seed: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = pattern(seed, SIZE)
    check = StreamCheck(data)

    async def send() -> None:
        writer.write(data.tobytes())
        await writer.drain()
        writer.write_eof()

    t = asyncio.create_task(send())
    while got := await reader.read(1 << 16):
        check.add(got)
    await t
    writer.close()
    await writer.wait_closed()
    assert check.complete


def test_start_server_handler_hands_over(loop_kind, no_leaks):
    async def main() -> None:
        handlers: list[asyncio.Task] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock, early = await aio.adopt_stream(reader, writer)
            await echo(sock, early)

        def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            handlers.append(asyncio.ensure_future(handle(r, w)))

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        await asyncio.gather(*(client(port, i) for i in range(8)))
        await asyncio.gather(*handlers)
        server.close()
        await server.wait_closed()

    run(loop_kind, main)


def test_protocol_hands_over_in_connection_made(loop_kind, no_leaks):
    async def main() -> None:
        handlers: list[asyncio.Task] = []
        lost: list[object] = []

        class Handoff(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = aio.adopt_transport(transport)
                handlers.append(asyncio.ensure_future(echo(sock)))

            def data_received(self, data: bytes) -> None:
                raise AssertionError("the transport read data after the hand-over")

            def connection_lost(self, exc: Exception | None) -> None:
                lost.append(exc)

        loop = asyncio.get_running_loop()
        server = await loop.create_server(Handoff, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        await asyncio.gather(*(client(port, i) for i in range(8)))
        await asyncio.gather(*handlers)
        server.close()
        await server.wait_closed()
        assert lost == [None] * 8

    run(loop_kind, main)
