"""Helpers for the zcnet.aio tests: loops to run on, connected pairs, recognisable payloads."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import uvloop

from zcnet import aio
from zcnet.aio import shared
from zcnet.errors import ZcnetError
from zcnet.rx.zc.chunks import Batch

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.fixture(params=["c", "pure"])
def loop_pass(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on both shared-ring passes: compiled (zcnet.aio._loopaccel, "c") and pure
    Python. Import it into a test module and mark the module ``usefixtures("loop_pass")``; the
    choice is read when a loop's ring and a transport are made (ZCNET_PURE). "c" skips, with
    the reason, when the extension is not built."""
    if request.param == "c" and shared._loopaccel is None:
        pytest.skip("zcnet.aio._loopaccel is not built: install with a C compiler to test it")
    monkeypatch.setenv("ZCNET_PURE", "1" if request.param == "pure" else "0")
    assert shared.loop_backend() == request.param
    return str(request.param)


def _warm_up_uvloop() -> None:
    """uvloop opens one pipe per process with its first loop and keeps it; open it before any
    leak snapshot is taken so the tests' fd accounting sees only what they create."""
    loop = uvloop.new_event_loop()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()


_warm_up_uvloop()


def run(kind: str, main: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``main()`` on a fresh loop of ``kind`` the way asyncio.run does (tasks cancelled and
    the loop closed at the end)."""
    with asyncio.Runner(loop_factory=LOOPS[kind]) as runner:
        return runner.run(main())  # type: ignore[arg-type]


async def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected loopback pair (client, server), both non-blocking."""
    loop = asyncio.get_running_loop()
    ls = socket.create_server(("127.0.0.1", 0))
    ls.setblocking(False)
    try:
        c = socket.socket()
        c.setblocking(False)
        await loop.sock_connect(c, ls.getsockname())
        s, _ = await loop.sock_accept(ls)
    finally:
        ls.close()
    s.setblocking(False)
    return c, s


def pattern(seed: int, n: int) -> np.ndarray:
    """Byte i of stream ``seed`` is (seed * 7 + i) % 251: a wrong offset or mixed-up stream
    shows at once."""
    return ((np.arange(n, dtype=np.uint32) + seed * 7) % 251).astype(np.uint8)


class StreamCheck:
    """Compares received pieces with the expected stream as they arrive, by stream offset."""

    def __init__(self, expected: np.ndarray) -> None:
        self.expected = expected
        self.got = 0

    def add(self, data: Any, stream_offset: int | None = None) -> None:
        a = np.frombuffer(data, dtype=np.uint8)
        if stream_offset is not None:
            assert stream_offset == self.got, (stream_offset, self.got)
        want = self.expected[self.got:self.got + len(a)]
        assert len(want) == len(a) and np.array_equal(a, want), f"mismatch at {self.got}"
        self.got += len(a)

    def take(self, got: Any) -> None:
        """Check and release one chunk or Batch (a Batch's views come in stream order)."""
        if isinstance(got, Batch):
            for v in got.views():
                self.add(v)
        else:
            self.add(got.data, got.stream_offset)
        got.release()

    async def drain(self, rx: aio.AsyncReceiver) -> None:
        """``async for`` over ``rx`` to its end, each chunk checked and released."""
        async for chunk in rx:
            self.take(chunk)

    async def through(self, rx: aio.AsyncReceiver, c: socket.socket) -> None:
        """Send the whole expected stream on ``c`` from a thread (then close it) while
        draining ``rx``; afterwards every byte has arrived."""
        send = asyncio.get_running_loop().run_in_executor(
            None, lambda: (c.setblocking(True), c.sendall(self.expected.tobytes()), c.close()))
        await self.drain(rx)
        await send
        assert self.complete

    @property
    def complete(self) -> bool:
        return self.got == len(self.expected)


class Recorder(aio.ZcProtocol):
    """Checks every chunk against the expected stream, releases it, records the ending."""

    def __init__(self, expected: np.ndarray) -> None:
        self.check = StreamCheck(expected)
        self.lost: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())
        self.eof = False
        self.transport: aio.ZcTransport | None = None

    def connection_made(self, transport: aio.ZcTransport) -> None:
        self.transport = transport

    def chunk_received(self, chunk) -> None:
        self.check.add(chunk.data, chunk.stream_offset)
        chunk.release()

    def eof_received(self) -> None:
        self.eof = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.set_result(exc)


def misuse_from_thread(rx: aio.AsyncReceiver, chunks: list,
                       run: Callable[[Callable[[], Awaitable[Any]]], Any]
                       ) -> tuple[threading.Thread, list[str]]:
    """A started thread that receives on ``rx`` inside a loop of its own (``run(main)``: asyncio
    or trio) and then closes it, both refused with ZcnetError (the messages go to the returned
    list), and releases ``chunks`` (allowed from any thread). Join it off the loop."""
    errors: list[str] = []

    def other() -> None:
        async def use() -> None:
            await rx.recv()
        try:
            run(use)
        except ZcnetError as e:
            errors.append(str(e))
        try:
            rx.close()
        except ZcnetError as e:
            errors.append(str(e))
        rx.rx.release_many(chunks)

    t = threading.Thread(target=other)
    t.start()
    return t, errors


async def refused_in_thread(use: Callable[[], Awaitable[Any]]) -> str:
    """Run ``use()`` in a new asyncio loop on another thread (joined off this loop); the
    ZcnetError it must raise, as text."""
    errors: list[str] = []

    def other() -> None:
        try:
            asyncio.run(use())  # type: ignore[arg-type]
        except ZcnetError as e:
            errors.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    await asyncio.get_running_loop().run_in_executor(None, t.join)
    assert errors, "the other thread's use was not refused"
    return errors[0]


def release_held_after_close(held: list, expected: np.ndarray, area: Any) -> None:
    """Chunks held past their receiver's close still read ``expected``; the area stays mapped
    until the last is released, and goes then."""
    got = np.concatenate([np.frombuffer(ch.data, np.uint8) for ch in held])
    assert np.array_equal(got, expected)
    assert not area.closed
    for ch in held:
        ch.release()
    assert area.closed
