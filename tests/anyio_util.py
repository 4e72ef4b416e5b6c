"""Helpers for the zcnet.aio tests under anyio and trio: the runs to test on, connected pairs,
a sender that is not zcnet's. Written with anyio's API, which works inside a plain trio.run."""

from __future__ import annotations

import functools
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import trio

from aio_util import StreamCheck

Main = Callable[[], Awaitable[Any]]

#: How a test's main() is run: anyio on asyncio (and uvloop), trio itself, anyio on trio.
RUNNERS: dict[str, Callable[[Main], Any]] = {
    "anyio-asyncio": functools.partial(anyio.run, backend="asyncio"),
    "anyio-uvloop": functools.partial(anyio.run, backend="asyncio",
                                      backend_options={"use_uvloop": True}),
    "trio": trio.run,
    "anyio-trio": functools.partial(anyio.run, backend="trio"),
}
ASYNCIO_RUNS = ["anyio-asyncio", "anyio-uvloop"]
TRIO_RUNS = ["trio", "anyio-trio"]


def _warm_up() -> None:
    """trio and anyio set up process-wide state with their first run (trio's thread cache,
    anyio's worker bookkeeping): do it before any leak snapshot is taken."""
    async def nothing() -> None:
        await anyio.sleep(0)

    for run in RUNNERS.values():
        run(nothing)


_warm_up()


def tcp_pair(n: int = 1) -> list[tuple[socket.socket, socket.socket]]:
    """``n`` connected loopback pairs (client, server), non-blocking; made without a loop."""
    ls = socket.create_server(("127.0.0.1", 0), backlog=max(n, 8))
    try:
        pairs = []
        for _ in range(n):
            c = socket.create_connection(ls.getsockname())
            s, _ = ls.accept()
            c.setblocking(False)
            s.setblocking(False)
            pairs.append((c, s))
        return pairs
    finally:
        ls.close()


async def sendall(sock: socket.socket, data: Any, close: bool = True) -> None:
    """Send ``data`` with plain ``send`` calls, waiting through anyio; then close ``sock``."""
    view = memoryview(data).cast("B")
    try:
        while view:
            try:
                n = sock.send(view)
            except BlockingIOError:
                await anyio.wait_writable(sock)
                continue
            view = view[n:]
    finally:
        if close:
            sock.close()


async def receive_checked(rx: Any, expected: np.ndarray) -> StreamCheck:
    """Read ``rx`` to EOF with ``async for``, every chunk checked by stream offset, released."""
    check = StreamCheck(expected)
    async for chunk in rx:
        check.add(chunk.data, chunk.stream_offset)
        chunk.release()
    return check
