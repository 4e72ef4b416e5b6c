"""zcnet.aio servers on zcrx against a real 7.x kernel in copy mode (ZCRX_REG_NODEV, booted by
`zcnet vm run`): an echo server (start_protocol) and a stream server (open_receiver, ``async
for``) of 100 connections on the loop thread's one zcrx queue, every byte checked, and 1000
connections coming and going in waves without leaving fds, mappings, member ids or the ifq
behind. Small byte counts: the guest runs under TCG."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from aio_util import run
from zc_helpers import PAT, mapped
from zcnet import aio
from zcnet.rx.zc.zcrx import kernel_offers, open_zcrx_queue
from zcnet.rx.zc.zcrx_queue import find_open, queue_key

pytestmark = pytest.mark.vm

N = 100
AREA = 8 << 20  # 2048 buffers: 20 per connection (a 80 KiB share) with 100 open


@pytest.fixture
def copy_mode(no_leaks):
    if not kernel_offers().copy_mode:
        pytest.skip("this kernel has no zcrx copy mode (ZCRX_REG_NODEV, 7.x); run the vm tests "
                    "under `zcnet vm run`")


class Echo(aio.ZcProtocol):
    def __init__(self, errors: list) -> None:
        self.errors = errors

    def connection_lost(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.errors.append(exc)

    def connection_made(self, transport: aio.ZcTransport) -> None:
        self.transport = transport

    def chunk_received(self, chunk) -> None:  # type: ignore[no-untyped-def]
        self.transport.write(chunk.data)
        chunk.release()


class Server:
    """A listening socket whose connections are served on the loop's zcrx queue: echoed
    (start_protocol) or drained and checked (open_receiver, ``async for``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.ls = socket.create_server(("127.0.0.1", 0), backlog=N)
        self.ls.setblocking(False)
        self.queues: list = []    # every queue a connection was served on
        self.areas: list[int] = []  # the address of each one's area
        self.got: dict[int, int] = {}  # stream server: the bytes of connection (pattern) i
        self.tasks: set[asyncio.Task] = set()
        self.errors: list[BaseException] = []  # a transport's or receiver task's

    async def accept(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            s, _ = await loop.sock_accept(self.ls)
            if self.mode == "echo":
                tr = aio.start_protocol(s, Echo(self.errors), provider="zcrx", area_size=AREA)
                self.note(tr.rx.provider)
            else:
                rx = aio.open_receiver(s, "zcrx", area_size=AREA, own_socket=True)
                self.note(rx.rx.provider)
                t = asyncio.ensure_future(self.drain(rx))
                self.tasks.add(t)
                t.add_done_callback(self.done)

    def done(self, t: asyncio.Task) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self.errors.append(t.exception())  # type: ignore[arg-type]

    def note(self, p) -> None:  # type: ignore[no-untyped-def]
        assert p.copy and p.mid < N, (p.copy, p.mid)  # ids reused: never more than are open
        if not self.queues or self.queues[-1] is not p.zq:
            self.queues.append(p.zq)
            self.areas.append(p.zq.area.addr)

    async def drain(self, rx: aio.AsyncReceiver) -> None:
        """The stream server: the first 8 bytes name the connection i, stream byte o >= 8 is
        pattern byte (i << 20) + o."""
        got, base = 0, None
        async with rx:
            async for c in rx:
                o = c.stream_offset
                if base is None:
                    assert o == 0 and c.length >= 8, (o, c.length)
                    base = int.from_bytes(bytes(c.data[:8]), "little") << 20
                skip = max(0, 8 - o)
                assert PAT.matches(base + o + skip, c.array[skip:]), "stream mixed up"
                got += c.length
                c.release()
        assert base is not None
        self.got[base >> 20] = got - 8


async def echo_client(addr: tuple, i: int, size: int) -> None:
    loop = asyncio.get_running_loop()
    c = socket.socket()
    c.setblocking(False)
    with c:
        await loop.sock_connect(c, addr)
        want = PAT.expected(i << 20, size).tobytes()
        await loop.sock_sendall(c, want)
        got = bytearray()
        while len(got) < size:
            b = await loop.sock_recv(c, size - len(got))
            assert b, f"echo {i}: EOF after {len(got)} of {size}"
            got += b
        assert got == want, f"echo {i} mixed up"


async def stream_client(addr: tuple, i: int, size: int) -> None:
    loop = asyncio.get_running_loop()
    c = socket.socket()
    c.setblocking(False)
    with c:
        await loop.sock_connect(c, addr)
        await loop.sock_sendall(c, i.to_bytes(8, "little")
                                + PAT.expected((i << 20) + 8, size).tobytes())


async def wave(srv: Server, first: int, n: int, size: int) -> None:
    """``n`` connections at once, each sending ``size`` bytes; done when every one is served
    and closed (echo: by the peer's close, EOF; stream: its receiver's task ends)."""
    addr = srv.ls.getsockname()
    client = echo_client if srv.mode == "echo" else stream_client
    await asyncio.gather(srv.accept(n), *(client(addr, first + i, size) for i in range(n)))
    for _ in range(6000):  # echo transports close on their EOF, a moment after the client's
        if not (srv.tasks or any(q.members for q in srv.queues)):
            assert not srv.errors, srv.errors
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(srv.tasks)} receivers still open a minute after their EOF")


def queue_released(srv: Server) -> None:
    """Every queue served on is closed: no member left, the ifq unregistered, none open in
    this thread, its area unmapped."""
    assert find_open(queue_key(0, 0)) is None
    for q, addr in zip(srv.queues, srv.areas, strict=True):
        assert q.closed and not q.members and q.area.closed and not mapped(addr)


def test_echo_server_100_connections_verified(copy_mode):
    async def main() -> None:
        srv = Server("echo")
        with srv.ls:
            await wave(srv, 0, N, 16 << 10)
        assert len(srv.queues) == 1  # all 100 on one queue
        queue_released(srv)

    run("asyncio", main)


def test_stream_server_100_connections_verified(copy_mode):
    size = 64 << 10

    async def main() -> None:
        srv = Server("stream")
        with srv.ls:
            await wave(srv, 0, N, size)
        assert srv.got == {i: size for i in range(N)}
        assert len(srv.queues) == 1
        queue_released(srv)

    run("asyncio", main)


def io_uring_maps() -> int:
    return sum("io_uring" in line for line in Path("/proc/self/maps").read_text().splitlines())


def test_1000_connections_in_waves_leave_nothing(copy_mode):
    """10 waves of 100 (echo and stream in turn): after each, the fds and io_uring mappings of
    before, the queue closed with no member, and a new queue registers afterwards."""
    async def main() -> None:
        fds = len(os.listdir("/proc/self/fd"))
        maps = io_uring_maps()
        for w in range(10):
            srv = Server("echo" if w % 2 == 0 else "stream")
            with srv.ls:
                await wave(srv, w * N, N, 4 << 10)
            if srv.mode == "stream":
                assert srv.got == {w * N + i: 4 << 10 for i in range(N)}
            queue_released(srv)
            assert len(os.listdir("/proc/self/fd")) == fds, f"wave {w}: fds leaked"
            assert io_uring_maps() == maps, f"wave {w}: io_uring mappings left"
        with open_zcrx_queue(1 << 20, copy=True) as zq:
            assert not zq.members and not zq.closed

    run("asyncio", main)


@pytest.mark.parametrize("style", ["task", "protocol"])
def test_an_idle_zcrx_connection_is_woken_by_its_socket_where_the_signal_is_late(
        style: str, copy_mode: None) -> None:
    """zcrx needs DEFER_TASKRUN; where its eventfd signal comes late (zcnet.aio.taskrun; this
    VM's Debian 7.3.4 is such a kernel) a receiver that waits with its receive armed watches
    its socket, and stops watching when it closes. Every round trip of an idle connection is
    checked; the watch is what wakes it (the eventfd has not been raised when the pass runs)."""
    from zcnet.aio.loop_zcrx import ZcrxMember
    from zcnet.aio.taskrun import deferred_signal_is_prompt
    late = not deferred_signal_is_prompt()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ls = socket.create_server(("127.0.0.1", 0))
        ls.setblocking(False)
        peer = socket.create_connection(ls.getsockname()[:2])
        s, _ = await loop.sock_accept(ls)
        ls.close()
        fd = s.fileno()
        seen: list[bytes] = []
        watched: list[int] = []
        try:
            if style == "task":
                rx = aio.open_receiver(s, "zcrx", area_size=1 << 20, own_socket=True)
                member: ZcrxMember = rx._member  # type: ignore[assignment]
            else:
                got: asyncio.Queue[bytes] = asyncio.Queue()

                class Keep(aio.ZcProtocol):
                    def chunk_received(self, chunk) -> None:  # type: ignore[no-untyped-def]
                        got.put_nowait(bytes(chunk.data))
                        chunk.release()

                tr = aio.start_protocol(s, Keep(), provider="zcrx", area_size=1 << 20)
                member = tr._member
            for i in range(10):
                msg = b"idle %d" % i
                if style == "task":
                    t = asyncio.ensure_future(rx.recv())
                    await asyncio.sleep(0.05)  # the loop sleeps, the receive armed
                    watched.append(member.watching)
                    peer.send(msg)
                    data = b""
                    while len(data) < len(msg):
                        chunks = await asyncio.wait_for(t, 10)
                        data += b"".join(bytes(c.data) for c in chunks)
                        for c in chunks:
                            c.release()
                        if len(data) < len(msg):
                            t = asyncio.ensure_future(rx.recv())
                else:
                    await asyncio.sleep(0.05)
                    watched.append(member.watching)
                    peer.send(msg)
                    data = b""
                    while len(data) < len(msg):
                        data += await asyncio.wait_for(got.get(), 10)
                seen.append(data)
        finally:
            if style == "task":
                rx.close()
            else:
                tr.abort()  # its teardown runs in the next loop iteration
            peer.close()
        await asyncio.sleep(0.01)
        assert seen == [b"idle %d" % i for i in range(10)]
        assert member.watching == -1  # closed: no reader left on a reused fd
        assert watched == [fd if late else -1] * 10

    asyncio.run(main())
