"""Callback-style receive (zcnet.aio.start_protocol / ZcProtocol) on real loopback sockets."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import warnings

import numpy as np
import pytest

from aio_util import LOOPS, Recorder, StreamCheck, loop_pass, pattern, run, tcp_pair
from zcnet import aio
from zcnet.errors import ClosedError, UsageError, ZcnetError

pytestmark = [pytest.mark.parametrize("loop_kind", list(LOOPS)),
              pytest.mark.usefixtures("loop_pass")]
__all__ = ["loop_pass"]  # the fixture, imported for pytest

SMALL = {"area_size": 256 << 10, "buf_size": 16 << 10}


async def send_all(c: socket.socket, data: np.ndarray, *, close: bool = True) -> None:
    await asyncio.get_running_loop().sock_sendall(c, data.tobytes())
    if close:
        c.close()


async def recv_exactly(c: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < n:
        part = await loop.sock_recv(c, n - len(got))
        if not part:
            break
        got += part
    return bytes(got)


def exceptions_seen() -> list[dict]:
    """The contexts the running loop's exception handler gets from now on."""
    seen: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    return seen


def test_stream_arrives_whole_and_in_order_then_eof(loop_kind, no_leaks):
    size = (3 << 20) + 123

    async def main() -> None:
        c, s = await tcp_pair()
        p = Recorder(pattern(1, size))
        tr = aio.start_protocol(s, p, **SMALL)
        assert p.transport is tr and tr.is_reading()
        await send_all(c, pattern(1, size))
        assert await asyncio.wait_for(p.lost, 30) is None
        assert p.check.complete and p.eof
        assert tr.is_closing() and tr.stats.in_flight == 0
        assert s.fileno() == -1  # the transport owns the socket

    run(loop_kind, main)


class Echo(aio.ZcProtocol):
    def __init__(self) -> None:
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: aio.ZcTransport) -> None:
        self.tr = transport

    def chunk_received(self, chunk) -> None:
        self.tr.write(chunk.data)  # the view is sent or copied before the release
        chunk.release()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.set_result(exc)


def test_echo_from_the_callback_returns_every_byte(loop_kind, no_leaks):
    """Written from inside chunk_received, released straight after: more than the socket
    buffers hold goes through the write buffer while the peer is not reading yet."""
    size = 8 << 20

    async def main() -> None:
        c, s = await tcp_pair()
        p = Echo()
        aio.start_protocol(s, p, **SMALL)
        data = pattern(2, size).tobytes()
        sender = asyncio.ensure_future(asyncio.get_running_loop().sock_sendall(c, data))
        await asyncio.sleep(0.2)  # the echo backs up into the transport's write buffer
        assert p.tr.get_write_buffer_size() > 0
        got = await asyncio.wait_for(recv_exactly(c, size), 60)
        await sender
        assert got == data
        c.close()
        assert await asyncio.wait_for(p.lost, 10) is None

    run(loop_kind, main)


def test_chunks_held_past_close_stay_valid(loop_kind, no_leaks):
    """The protocol keeps chunks and closes the transport from inside the callback: the rest
    of the round is released, the kept chunks read right until they are released."""
    size = 200 << 10

    class Keeper(Recorder):
        def __init__(self, expected: np.ndarray) -> None:
            super().__init__(expected)
            self.kept: list = []

        def chunk_received(self, chunk) -> None:
            self.kept.append(chunk)
            if len(self.kept) == 3:
                self.transport.close()

    async def main() -> None:
        c, s = await tcp_pair()
        p = Keeper(pattern(3, size))
        tr = aio.start_protocol(s, p, **SMALL)
        await send_all(c, pattern(3, size), close=False)
        assert await asyncio.wait_for(p.lost, 10) is None
        assert len(p.kept) == 3 and tr.is_closing()
        area = tr.rx.area
        assert not area.closed
        for ch in p.kept:
            p.check.add(ch.data, ch.stream_offset)
        with pytest.raises(ClosedError):
            tr.write(b"late")
        for ch in p.kept:
            ch.release()
        assert area.closed
        c.close()

    run(loop_kind, main)


def test_delivery_pauses_at_max_held_and_resumes_on_release_from_a_thread(loop_kind, no_leaks):
    size = 2 << 20

    class Holder(Recorder):
        def __init__(self, expected: np.ndarray) -> None:
            super().__init__(expected)
            self.held: list = []
            self.pauses = 0

        def chunk_received(self, chunk) -> None:
            self.check.add(chunk.data, chunk.stream_offset)
            self.held.append(chunk)
            if self.transport.stats.in_flight_bytes > 64 << 10:  # max_held is a quarter
                held, self.held = self.held, []
                self.pauses += 1
                loop = asyncio.get_running_loop()
                loop.call_later(0.02, lambda: threading.Thread(
                    target=lambda: [h.release() for h in held]).start())

    async def main() -> None:
        c, s = await tcp_pair()
        p = Holder(pattern(4, size))
        tr = aio.start_protocol(s, p, max_held=0.25, **SMALL)
        await send_all(c, pattern(4, size))
        assert await asyncio.wait_for(p.lost, 30) is None
        assert p.check.complete and p.pauses > 0
        assert tr.stats.backpressure > 0  # delivery really paused
        for h in p.held:
            h.release()

    run(loop_kind, main)


def test_pause_and_resume_reading(loop_kind, no_leaks):
    size = 1 << 20

    class Pauser(Recorder):
        n = 0

        def chunk_received(self, chunk) -> None:
            super().chunk_received(chunk)
            self.n += 1
            if self.n % 5 == 0:
                self.transport.pause_reading()
                assert not self.transport.is_reading()
                asyncio.get_running_loop().call_later(0.005, self.transport.resume_reading)

    async def main() -> None:
        c, s = await tcp_pair()
        p = Pauser(pattern(5, size))
        aio.start_protocol(s, p, **SMALL)
        await send_all(c, pattern(5, size))
        assert await asyncio.wait_for(p.lost, 30) is None
        assert p.check.complete and p.n >= 5

    run(loop_kind, main)


def test_a_failing_callback_is_reported_and_drops_the_connection(loop_kind, no_leaks):
    class Boom(Recorder):
        def chunk_received(self, chunk) -> None:
            chunk.release()
            raise ValueError("bad frame")

    async def main() -> None:
        seen = exceptions_seen()
        c, s = await tcp_pair()
        p = Boom(pattern(6, 1000))
        tr = aio.start_protocol(s, p, **SMALL)
        await send_all(c, pattern(6, 1000), close=False)
        exc = await asyncio.wait_for(p.lost, 10)
        assert isinstance(exc, ValueError) and str(exc) == "bad frame"
        assert [x["message"] for x in seen] == ["zcnet.aio protocol callback failed"]
        assert isinstance(seen[0]["exception"], ValueError)
        assert seen[0]["transport"] is tr
        assert s.fileno() == -1
        c.close()

    run(loop_kind, main)


def test_reset_by_peer_reaches_connection_lost(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        p = Recorder(pattern(7, 5000))
        aio.start_protocol(s, p, **SMALL)
        await send_all(c, pattern(7, 5000), close=False)
        await asyncio.sleep(0.05)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        c.close()  # linger 0: RST
        exc = await asyncio.wait_for(p.lost, 10)
        assert isinstance(exc, ConnectionResetError)
        assert p.check.complete  # the data before the reset was delivered first

    run(loop_kind, main)


def test_a_failed_send_reaches_connection_lost_and_later_writes_drop(loop_kind, no_leaks):
    """The peer reset before the reply: the send error ends the connection through
    connection_lost, and a write after it in the same callback raises nothing."""
    class Replier(Recorder):
        def chunk_received(self, chunk) -> None:
            super().chunk_received(chunk)
            self.transport.write(b"reply")
            self.transport.write(b"more")

    async def main() -> None:
        seen = exceptions_seen()
        c, s = await tcp_pair()
        p = Replier(pattern(11, 100))
        tr = aio.start_protocol(s, p, **SMALL)
        tr.pause_reading()
        await send_all(c, pattern(11, 100), close=False)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        c.close()  # RST before the server looks
        await asyncio.sleep(0.05)
        tr.resume_reading()
        exc = await asyncio.wait_for(p.lost, 10)
        assert isinstance(exc, (BrokenPipeError, ConnectionResetError)), exc
        assert not seen, [x["message"] for x in seen]

    run(loop_kind, main)


def test_protocols_and_async_receivers_share_the_loops_ring(loop_kind, no_leaks):
    size = 512 << 10

    async def main() -> None:
        (c1, s1), (c2, s2) = await tcp_pair(), await tcp_pair()
        p = Recorder(pattern(8, size))
        tr = aio.start_protocol(s1, p, **SMALL)
        rx = aio.open_receiver(s2, own_socket=True, **SMALL)
        assert tr.rx.provider.member.lr is rx.rx.provider.member.lr
        await asyncio.gather(send_all(c1, pattern(8, size)), send_all(c2, pattern(9, size)))
        check = StreamCheck(pattern(9, size))
        async with rx:
            async for ch in rx:
                check.add(ch.data, ch.stream_offset)
                ch.release()
        assert await asyncio.wait_for(p.lost, 30) is None
        assert check.complete and p.check.complete

    run(loop_kind, main)


def test_loop_shutdown_closes_an_open_transport(loop_kind, no_leaks):
    state: dict = {}

    async def main() -> None:
        c, s = await tcp_pair()
        state["c"] = c
        p = Recorder(pattern(10, 1000))
        state["p"] = p
        state["tr"] = aio.start_protocol(s, p, **SMALL)
        await send_all(c, pattern(10, 1000), close=False)
        await asyncio.sleep(0.05)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(loop_kind, main)
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "still open" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert state["tr"].is_closing() and state["tr"].rx.ring is None
    assert state["p"].check.complete
    state["c"].close()


def test_bad_input_is_refused_with_a_clear_error(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        with pytest.raises(UsageError, match="does not take incremental"):
            aio.start_protocol(s, aio.ZcProtocol(), incremental=True, **SMALL)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with pytest.raises((UsageError, ZcnetError)):
            aio.start_protocol(u, aio.ZcProtocol())
        u.close()
        c.close()
        s.close()

    run(loop_kind, main)
    ls = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(ls.getsockname())
    s, _ = ls.accept()
    try:
        with pytest.raises(ZcnetError, match="running asyncio event loop"):
            aio.start_protocol(s, aio.ZcProtocol())
    finally:
        for x in (c, s, ls):
            x.close()


def test_writes_of_the_wrong_kind_or_after_close_raise_on_both_passes(loop_kind, no_leaks):
    """``write`` (compiled or not) refuses what the socket cannot send with the same TypeError,
    sends a strided view's bytes through the Python path, and a write kept from before the
    close raises ClosedError."""
    async def main() -> None:
        c, s = await tcp_pair()
        p = Echo()
        tr = aio.start_protocol(s, p, **SMALL)
        write = tr.write  # the compiled one on the c pass: kept past the close below
        with pytest.raises(TypeError):
            tr.write("text")  # type: ignore[arg-type]
        with pytest.raises((TypeError, BufferError, ValueError)):
            tr.write(memoryview(b"abcdef")[::2])  # not contiguous: no send takes it
        tr.write(b"still open")
        got = b""
        while len(got) < 10:
            got += await asyncio.get_running_loop().sock_recv(c, 64)
        assert got == b"still open"
        tr.close()
        with pytest.raises(ClosedError):
            write(b"late")
        c.close()
        assert await asyncio.wait_for(p.lost, 10) is None

    run(loop_kind, main)


def test_a_callback_that_fails_leaves_other_connections_in_order(loop_kind, no_leaks):
    """A's callback raises while B's older data waits in the same pass: A's teardown closes a
    receiver, whose cancel runs a nested pass over the shared ring that brings B newer data.
    B still gets its bytes in stream order and keeps its connection."""

    async def main() -> None:
        seen = exceptions_seen()
        ca, sa = await tcp_pair()
        cb, sb = await tcp_pair()
        cb.setblocking(True)
        got: list[bytes] = []
        lost: list[BaseException | None] = []

        class A(aio.ZcProtocol):
            fired = False

            def chunk_received(self, chunk: aio.Chunk) -> None:
                chunk.release()
                if not A.fired:
                    A.fired = True
                    cb.sendall(b"2" * 100)  # B's newer data, arriving during A's callback
                    threading.Event().wait(0.01)
                    raise ValueError("a protocol bug on connection A")

        class B(aio.ZcProtocol):
            def chunk_received(self, chunk: aio.Chunk) -> None:
                got.append(bytes(chunk.data))
                chunk.release()

            def connection_lost(self, exc: BaseException | None) -> None:
                lost.append(exc)

        ta = aio.start_protocol(sa, A(), **SMALL)
        tb = aio.start_protocol(sb, B(), **SMALL)
        await asyncio.sleep(0.05)
        ca.send(b"a" * 100)  # first in the pass: A's completion
        cb.sendall(b"1" * 100)  # then B's older data
        threading.Event().wait(0.05)  # the loop is busy: both land in one pass
        for _ in range(100):
            await asyncio.sleep(0.01)
            if sum(map(len, got)) >= 200:
                break
        assert b"".join(got) == b"1" * 100 + b"2" * 100 and not lost
        assert any("protocol callback failed" in ctx["message"] for ctx in seen)
        assert ta.is_closing() and not tb.is_closing()
        tb.close()
        ca.close()
        cb.close()
        await asyncio.sleep(0.05)

    run(loop_kind, main)


def test_a_write_of_wide_items_that_the_socket_takes_in_part_keeps_every_byte(loop_kind,
                                                                               no_leaks):
    """The socket's count is bytes: the rest of an int32 array written when the socket takes
    only part is buffered by bytes, not by items, and arrives whole."""

    async def main() -> None:
        c, s = await tcp_pair()
        data = np.arange(4 << 20, dtype=np.int32)  # 16 MiB: more than the socket takes at once
        tr = aio.start_protocol(s, aio.ZcProtocol(), **SMALL)
        tr.write(data)
        tr.write(memoryview(data[:3]))  # behind the buffered rest: appended as bytes too
        got = await recv_exactly(c, data.nbytes + 12)
        assert got == data.tobytes() + data[:3].tobytes()
        tr.close()
        c.close()
        await asyncio.sleep(0.05)

    run(loop_kind, main)
