"""zcnet.aio's ``rcvlowat`` receiver option (SO_RCVLOWAT, for bulk ingest): the loop is not woken
for less than the threshold, yet the end of the stream (FIN) and a reset still wake it with less
queued, so every byte is read; a bad value is a usage error before anything is allocated."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from aio_util import LOOPS, Recorder, StreamCheck, loop_pass, pattern, run, tcp_pair
from zcnet import aio
from zcnet.errors import UsageError
from zcnet.rx.engine import RCVLOWAT

pytestmark = [pytest.mark.parametrize("loop_kind", list(LOOPS)),
              pytest.mark.usefixtures("loop_pass")]
__all__ = ["loop_pass"]  # the fixture, imported for pytest

OPTS = {"area_size": 4 << 20, "buf_size": 64 << 10}
SMALL = 1000  # far below the threshold: on its own it never wakes the loop


def _rcvlowat(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


async def _iterate(rx: aio.AsyncReceiver, check: StreamCheck) -> None:
    async for chunk in rx:
        check.add(chunk.data, chunk.stream_offset)
        chunk.release()


def _open(style: str, s: socket.socket, data: Any) -> tuple[StreamCheck, asyncio.Future[Any],
                                                           aio.AsyncReceiver | None]:
    """Receive ``s`` with the threshold set, in ``style``: (the stream check, a future that ends
    with the stream (its result or exception is the ending), the receiver to close or None)."""
    if style == "iterate":
        check = StreamCheck(data)
        rx = aio.open_receiver(s, own_socket=True, rcvlowat=RCVLOWAT, **OPTS)
        assert _rcvlowat(s) == RCVLOWAT
        return check, asyncio.ensure_future(_iterate(rx, check)), rx
    p = Recorder(data)
    aio.start_protocol(s, p, rcvlowat=RCVLOWAT, **OPTS)
    assert _rcvlowat(s) == RCVLOWAT
    return p.check, p.lost, None


def _end(c: socket.socket, how: str) -> None:
    if how == "fin":
        c.shutdown(socket.SHUT_WR)
    else:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()  # linger 0: RST


@pytest.mark.parametrize("style", ["iterate", "protocol"])
def test_bulk_stream_with_a_tail_below_the_threshold_is_read_whole(loop_kind, style, no_leaks):
    size = 3 * RCVLOWAT + 12345

    async def main() -> None:
        c, s = await tcp_pair()
        data = pattern(3, size)
        check, ending, rx = _open(style, s, data)
        try:
            await asyncio.get_running_loop().sock_sendall(c, memoryview(data))
            c.shutdown(socket.SHUT_WR)
            await asyncio.wait_for(ending, 30)
            assert ending.result() is None and check.complete
            if rx is not None:
                await rx.aclose()
        finally:
            c.close()

    run(loop_kind, main)


@pytest.mark.parametrize("how", ["fin", "rst"])
@pytest.mark.parametrize("style", ["iterate", "protocol"])
def test_end_of_stream_wakes_the_receiver_below_the_threshold(loop_kind, style, how, no_leaks):
    """A few bytes below the threshold are not delivered on their own (the option is in
    effect); the FIN or the reset that follows wakes the receiver: the bytes, then the end."""

    async def main() -> None:
        c, s = await tcp_pair()
        data = pattern(5, SMALL)
        check, ending, rx = _open(style, s, data)
        try:
            for _ in range(5):  # the receive is armed in the loop's next iterations
                await asyncio.sleep(0)
            await asyncio.get_running_loop().sock_sendall(c, memoryview(data))
            await asyncio.sleep(0.1)
            assert check.got == 0 and not ending.done()
            _end(c, how)
            await asyncio.wait([ending], timeout=10)
            assert ending.done()
            exc = ending.exception() or ending.result()  # iterate raises, protocol reports
            assert isinstance(exc, ConnectionResetError) if how == "rst" else exc is None, exc
            assert check.complete  # the bytes before the end came first
            if rx is not None:
                await rx.aclose()
        finally:
            c.close()

    run(loop_kind, main)


def test_default_leaves_the_kernel_default(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        try:
            async with aio.open_receiver(s, **OPTS):
                assert _rcvlowat(s) == 1
            tr = aio.start_protocol(s, aio.ZcProtocol(), **OPTS)
            assert _rcvlowat(s) == 1
            tr.close()
        finally:
            c.close()
            s.close()

    run(loop_kind, main)


@pytest.mark.parametrize("value", [-1, 1 << 31, "1M", True, 1.5])
def test_bad_rcvlowat_is_a_usage_error_before_anything_is_opened(loop_kind, value, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        try:
            with pytest.raises(UsageError, match="rcvlowat") as e:
                aio.open_receiver(s, rcvlowat=value, **OPTS)
            assert "bulk" in (e.value.hint or "")
            with pytest.raises(UsageError, match="rcvlowat"):
                aio.start_protocol(s, aio.ZcProtocol(), rcvlowat=value, **OPTS)
            assert _rcvlowat(s) == 1
        finally:
            c.close()
            s.close()

    run(loop_kind, main)
