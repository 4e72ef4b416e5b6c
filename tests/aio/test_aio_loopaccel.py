"""The compiled shared-ring pass (zcnet.aio._loopaccel) and the Python one it stands in for:
the same bytes, the same checks, nothing left behind; which one ran is visible."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import weakref

import numpy as np
import pytest

from aio_util import LOOPS, StreamCheck, loop_pass, pattern, run, tcp_pair
from zcnet import aio
from zcnet.aio import protocol, shared

pytestmark = [pytest.mark.parametrize("loop_kind", list(LOOPS)),
              pytest.mark.usefixtures("loop_pass")]
__all__ = ["loop_pass"]  # the fixture, imported for pytest

SMALL = {"area_size": 64 << 10, "buf_size": 4096}


class Frames(aio.ZcProtocol):
    """Request/response: answers each 64-byte frame with the frame reversed."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())
        self.pending = b""

    def connection_made(self, transport: aio.ZcTransport) -> None:
        self.tr = transport

    def chunk_received(self, chunk) -> None:
        data = self.pending + bytes(chunk.data)
        chunk.release()
        n = len(data) // 64 * 64
        for i in range(0, n, 64):
            self.tr.write(data[i:i + 64][::-1])
        self.pending = data[n:]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.set_result(exc)


def _release_refusing_misuse(chunk) -> bytes:
    """Release ``chunk``; a second release and its view after release are refused. Returns
    what the view held."""
    data = bytes(chunk.data)
    chunk.release()
    with pytest.raises(ValueError, match="released twice"):
        chunk.release()
    with pytest.raises(ValueError, match="after release"):
        chunk.data  # noqa: B018
    return data


def test_the_pass_that_runs_is_the_one_chosen(loop_kind, loop_pass, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        p = Frames()
        tr = aio.start_protocol(s, p, **SMALL)
        lr = tr._member.lr
        assert (lr._router is not None) == (loop_pass == "c")
        assert (tr._fast is not None) == (loop_pass == "c")
        if loop_pass == "c":  # the round's answers as the Python side names them
            accel = shared.loop_accel()
            assert (accel.DONE, accel.AGAIN, accel.FALLBACK) == (
                shared.ROUND_DONE, shared.ROUND_AGAIN, shared.ROUND_FALLBACK)
        c.close()
        assert await asyncio.wait_for(p.lost, 10) is None

    run(loop_kind, main)


def test_request_response_on_many_connections_every_byte(loop_kind, no_leaks):
    """40 clients, 30 requests each, one in flight: every reply is the request reversed, and
    every buffer is back in its ring when the connections end."""
    n_conn, n_req = 40, 30

    async def client(i: int, c: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for k in range(n_req):
            req = pattern(i * 100 + k, 64).tobytes()
            await loop.sock_sendall(c, req)
            got = b""
            while len(got) < 64:
                part = await loop.sock_recv(c, 64 - len(got))
                assert part, "server closed early"
                got += part
            assert got == req[::-1]
        c.close()

    async def main() -> None:
        pairs = [await tcp_pair() for _ in range(n_conn)]
        protos = [Frames() for _ in pairs]
        trs = [aio.start_protocol(s, p, **SMALL) for (_, s), p in zip(pairs, protos, strict=True)]
        await asyncio.gather(*(client(i, c) for i, (c, _) in enumerate(pairs)))
        for p, tr in zip(protos, trs, strict=True):
            assert await asyncio.wait_for(p.lost, 10) is None
            st = tr.stats
            assert st.delivered_bytes == n_req * 64 and st.in_flight == 0

    run(loop_kind, main)


def test_a_callback_failing_mid_round_leaves_no_buffer_behind(loop_kind, no_leaks):
    """The protocol raises on the first chunk of a round of many (the second round: the first
    arms the receive, in Python on both passes): the chunks it never got are released with the
    transport, so the area is unmapped and nothing stays in flight."""
    size = 48 << 10

    class Boom(aio.ZcProtocol):
        def __init__(self) -> None:
            self.lost: asyncio.Future[BaseException | None] = (
                asyncio.get_running_loop().create_future())
            self.calls = 0
            self.first = asyncio.get_running_loop().create_future()

        def chunk_received(self, chunk) -> None:
            self.calls += 1
            chunk.release()
            if self.calls == 2:
                raise ValueError("bad frame")
            self.first.set_result(None)

        def connection_lost(self, exc: BaseException | None) -> None:
            self.lost.set_result(exc)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, _ctx: None)  # reported: tested elsewhere
        c, s = await tcp_pair()
        c.setblocking(True)
        c.sendall(b"x")
        p = Boom()
        tr = aio.start_protocol(s, p, **SMALL)
        await asyncio.wait_for(p.first, 10)
        c.sendall(pattern(3, size).tobytes())  # one round of many chunks
        exc = await asyncio.wait_for(p.lost, 10)
        assert isinstance(exc, ValueError)
        assert p.calls == 2
        st = tr.stats
        assert st.delivered >= 3, "the round had one chunk: the test proves nothing"
        assert st.in_flight == 0 and tr.rx.area.closed
        c.close()

    run(loop_kind, main)


def test_release_checks_hold_on_chunks_of_the_compiled_round(loop_kind, no_leaks):
    """Double release, a chunk of another receiver, a view after release: refused, and the
    buffers still all come back."""
    got: list = []

    class Keep(aio.ZcProtocol):
        def __init__(self) -> None:
            self.lost: asyncio.Future[BaseException | None] = (
                asyncio.get_running_loop().create_future())

        def chunk_received(self, chunk) -> None:
            got.append(chunk)

        def connection_lost(self, exc: BaseException | None) -> None:
            self.lost.set_result(exc)

    async def main() -> None:
        (c1, s1), (c2, s2) = await tcp_pair(), await tcp_pair()
        p1, p2 = Keep(), Keep()
        t1 = aio.start_protocol(s1, p1, **SMALL)
        t2 = aio.start_protocol(s2, p2, **SMALL)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(c1, b"a" * 100)
        await loop.sock_sendall(c2, b"b" * 100)
        while sum(ch.length for ch in got) < 200:
            await asyncio.sleep(0.001)
        mine = [ch for ch in got if ch._rx is t1.rx.core]
        theirs = [ch for ch in got if ch._rx is t2.rx.core]
        with pytest.raises(ValueError, match="another receiver"):
            t1.rx.release(theirs[0])
        view_ok = _release_refusing_misuse(mine[0])
        assert view_ok == b"a" * len(view_ok)
        for ch in got:
            if ch._rx is not None:
                ch.release()
        c1.close()
        c2.close()
        await asyncio.wait_for(asyncio.gather(p1.lost, p2.lost), 10)
        assert t1.stats.in_flight == 0 and t2.stats.in_flight == 0

    run(loop_kind, main)


def test_async_for_through_the_compiled_take_keeps_every_byte_and_check(loop_kind, loop_pass,
                                                                         no_leaks):
    """``async for`` on the shared ring: under "c" its rounds are the compiled round's take()
    (none for a debug receiver, whose views are revoked in Python). Request/response frames
    arrive whole and in order; double release, another receiver's chunk and a view after
    release are refused on its chunks; a task cancelled while it waits loses nothing."""
    frames = [bytes([i]) * 64 for i in range(1, 41)]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        (c1, s1), (c2, s2), (c3, s3) = await tcp_pair(), await tcp_pair(), await tcp_pair()
        async with aio.open_receiver(s1, own_socket=True, **SMALL) as rx, \
                aio.open_receiver(s2, own_socket=True, **SMALL) as other, \
                aio.open_receiver(s3, own_socket=True, debug=True, **SMALL) as dbg:
            assert (rx._take is not None) == (loop_pass == "c")
            assert dbg._take is None
            got = b""
            for i, f in enumerate(frames):  # one frame in flight: each round is a few CQEs
                await loop.sock_sendall(c1, f)
                while len(got) < 64 * (i + 1):
                    chunk = await asyncio.wait_for(rx.__anext__(), 10)
                    got += bytes(chunk.data)
                    chunk.release()
            assert got == b"".join(frames)
            await loop.sock_sendall(c2, b"b" * 10)
            theirs = await asyncio.wait_for(other.__anext__(), 10)
            with pytest.raises(ValueError, match="another receiver"):
                rx.rx.release(theirs)
            theirs.release()
            waiter = asyncio.create_task(rx.__anext__())  # waits: nothing was sent
            await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await loop.sock_sendall(c1, b"z" * 100)
            rest = _release_refusing_misuse(await asyncio.wait_for(rx.__anext__(), 10))
            c1.close()
            async for chunk in rx:
                rest += bytes(chunk.data)
                chunk.release()
            assert rest == b"z" * 100
            assert rx.stats.in_flight == 0
        c2.close()
        c3.close()

    run(loop_kind, main)


def test_bulk_rounds_of_many_completions_arrive_whole(loop_kind, no_leaks):
    """More completions in one pass than the tuple path takes (shared.FEW): they reach the
    member as arrays, through either pass, and the stream is intact."""
    size = 1 << 20

    async def main() -> None:
        c, s = await tcp_pair()
        c.setblocking(True)
        rx = aio.open_receiver(s, own_socket=True, area_size=256 << 10, buf_size=1024)
        check = StreamCheck(pattern(9, size))
        first = asyncio.ensure_future(rx.recv())
        await asyncio.sleep(0)  # armed before the data
        c.sendall(pattern(9, size).tobytes()[:200 << 10])
        big = await first
        assert len(big) > shared.FEW
        for ch in big:
            check.add(ch.data, ch.stream_offset)
            ch.release()
        send = asyncio.get_running_loop().run_in_executor(
            None, lambda: (c.sendall(pattern(9, size).tobytes()[200 << 10:]), c.close()))
        async for ch in rx:
            check.add(np.frombuffer(ch.data, np.uint8), ch.stream_offset)
            ch.release()
        await send
        assert check.complete
        rx.close()

    run(loop_kind, main)


def test_a_closed_transport_and_its_ring_are_freed(loop_kind, no_leaks):
    """The compiled round and its transport refer to each other, the loop's ring and its router
    too: once the connection is gone nothing keeps any of them alive."""

    async def main() -> tuple[weakref.ref, weakref.ref]:
        c, s = await tcp_pair()
        p = Frames()
        tr = aio.start_protocol(s, p, **SMALL)
        await asyncio.get_running_loop().sock_sendall(c, bytes(64))
        c.close()
        assert await asyncio.wait_for(p.lost, 10) is None
        refs = weakref.ref(tr), weakref.ref(tr._member.lr)
        del p.tr
        return refs

    tr_ref, ring_ref = run(loop_kind, main)
    gc.collect()
    assert tr_ref() is None and ring_ref() is None


def test_ping_pong_leaves_the_eventfd_drained(loop_kind, no_leaks):
    """After each reply the loop's eventfd holds no stale signal (one would cost a spurious
    wake-up per request), and no wake-up is lost (a lost one would time the reply out)."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        c, s = await tcp_pair()
        p = Frames()
        tr = aio.start_protocol(s, p, **SMALL)
        efd = tr._member.lr.efd
        for k in range(100):
            req = pattern(k, 64).tobytes()
            await loop.sock_sendall(c, req)
            got = b""
            while len(got) < 64:
                got += await asyncio.wait_for(loop.sock_recv(c, 64 - len(got)), 10)
            assert got == req[::-1]
            with pytest.raises(BlockingIOError):
                os.read(efd, 8)
        c.close()
        assert await asyncio.wait_for(p.lost, 10) is None

    run(loop_kind, main)


@pytest.mark.parametrize("loop_pass", ["c"], indirect=True)  # the compiled round only
def test_a_round_whose_attributes_are_descriptors_is_left_to_python(loop_kind, loop_pass,
                                                                      no_leaks):
    """The compiled round reads its objects' per-pass attributes in place from their slots;
    where a subclass puts something else in front of one (here a property on the transport's
    state), it must read what Python reads: the property says paused, so that round goes to
    Python (FALLBACK)."""

    class Viewed(protocol.TransportState):
        @property  # type: ignore[override]
        def paused(self) -> bool:
            return True

    async def main() -> None:
        c, s = await tcp_pair()
        p = Frames()
        tr = aio.start_protocol(s, p, **SMALL)
        assert tr.write.__self__ is tr._fast  # the compiled write, its common case in C
        await asyncio.sleep(0)  # the start's pass: the receive is armed
        st = object.__new__(Viewed)
        for name in ("closing", "eof", "failed", "fd", "held", "waiting_release", "wbuf"):
            setattr(st, name, getattr(tr.st, name))
        v = object.__new__(aio.ZcTransport)
        v.__dict__.update(tr.__dict__)
        v.protocol, v.st = tr.protocol, st
        viewed = shared.compiled_round(v, v.rx, None, shared.TransportCalls(
            v._round_failed, v._put_back, v._send_failed, v._buffer_rest))
        accel = shared.loop_accel()
        assert tr._fast.run() == accel.DONE  # nothing has arrived: the compiled round is done
        assert viewed.run() == accel.FALLBACK
        del v, st, viewed
        await asyncio.get_running_loop().sock_sendall(c, bytes(64))
        got = b""
        while len(got) < 64:
            got += await asyncio.get_running_loop().sock_recv(c, 64)
        assert got == bytes(64)
        c.close()
        assert await asyncio.wait_for(p.lost, 10) is None

    run(loop_kind, main)
