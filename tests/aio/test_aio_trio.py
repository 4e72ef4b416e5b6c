"""zcnet.aio under trio, directly (trio.run) and as anyio's trio backend: the loop-neutral
receive/send logic on zcnet.aio.backend's TrioLoop, on real loopback sockets.

(Streams through receiver and sender and cancel scopes are in test_aio_anyio.py, which runs
on trio too.)"""

from __future__ import annotations

import asyncio
import gc
import queue
import socket
import threading
import time
import warnings
from typing import Any

import anyio
import pytest
import trio

from aio_util import StreamCheck, loop_pass, misuse_from_thread, pattern, release_held_after_close
from anyio_util import RUNNERS, TRIO_RUNS, receive_checked, sendall, tcp_pair
from zcnet import aio
from zcnet.aio.backend import TrioLoop
from zcnet.errors import ZcnetError

trio_runs = pytest.mark.parametrize("runner", TRIO_RUNS)

SMALL = {"area_size": 256 << 10, "buf_size": 16 << 10}
__all__ = ["loop_pass"]  # the fixture, imported for the tests that take it


@trio_runs
@pytest.mark.parametrize("shared_ring", [True, False])
def test_stream_every_byte_verified(runner, shared_ring, loop_pass, no_leaks):
    """A 4 MiB stream into `async for` on the loop's shared ring (both passes) and on a ring
    of the receiver's own, checked byte by byte by stream offset."""
    size = 4 << 20
    data = pattern(11, size)

    async def main() -> tuple[bool, dict, bool]:
        [(c, s)] = tcp_pair()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sendall, c, data)
            async with aio.open_receiver(s, own_socket=True, shared_ring=shared_ring) as rx:
                on_trio = isinstance(rx._owner.loop, TrioLoop)
                check = await receive_checked(rx, data)
                return check.complete, rx.stats_dict(), on_trio

    complete, st, on_trio = RUNNERS[runner](main)
    assert on_trio and complete
    assert st["delivered_bytes"] == size and st["in_flight"] == 0


@trio_runs
def test_fifty_connections_on_one_run(runner, no_leaks):
    """50 concurrent connections, each its own 256 KiB stream, every byte checked; they share
    the run's io_uring."""
    n_conn, size = 50, 256 << 10

    async def main() -> list[dict]:
        pairs = tcp_pair(n_conn)
        stats: list[dict] = []
        rings = set()

        async def consume(i: int, s: Any) -> None:
            async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
                rings.add(id(rx.rx.provider.member.lr))
                check = await receive_checked(rx, pattern(i, size))
                assert check.complete, i
                stats.append(rx.stats_dict())

        async with anyio.create_task_group() as tg:
            for i, (c, s) in enumerate(pairs):
                tg.start_soon(consume, i, s)
                tg.start_soon(sendall, c, pattern(i, size))
        assert len(rings) == 1
        return stats

    stats = RUNNERS[runner](main)
    assert len(stats) == n_conn
    assert all(st["delivered_bytes"] == size and st["in_flight"] == 0 for st in stats)


@trio_runs
def test_cancel_between_chunks_keeps_the_rest(runner, no_leaks):
    """A consumer is cancelled (trio.move_on_after's scope, cancelled by hand) after taking one
    chunk of a round that held many: the next consumer gets the rest first, in order."""
    size = 512 << 10
    data = pattern(12, size)

    async def main() -> tuple[bool, bool, dict]:
        [(c, s)] = tcp_pair()
        await sendall(c, data)
        check = StreamCheck(data)
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            with trio.CancelScope() as scope:
                async for chunk in rx:
                    check.add(chunk.data, chunk.stream_offset)
                    chunk.release()
                    scope.cancel()
                    await trio.sleep_forever()
            held_more = bool(rx._pending)
            async for chunk in rx:
                check.add(chunk.data, chunk.stream_offset)
                chunk.release()
            return held_more, check.complete, rx.stats_dict()

    held_more, complete, st = RUNNERS[runner](main)
    assert complete and st["in_flight"] == 0 and st["delivered"] == st["released"]
    assert held_more, "the first round should have held more than one chunk"


@trio_runs
def test_release_from_another_thread_resumes_delivery(runner, no_leaks):
    """Chunks go to a thread that keeps them until it holds more than max_held of the area and
    the receiver has paused (its ``stalled`` says so), then releases them: the release wakes
    the waiting task through the run's token (run_sync_soon). The stream arrives intact."""
    size = 2 << 20
    data = pattern(13, size)
    limit = SMALL["area_size"] // 2
    handed: queue.Queue = queue.Queue()

    def releaser(rx: aio.AsyncReceiver) -> None:
        held: list = []
        while (chunk := handed.get()) is not None:
            held.append(chunk)
            if sum(map(len, held)) > limit:
                # Delivery must pause now (nothing is released until then); wait until the
                # receiver says so, unless the stream ended first (then the test fails below).
                while rx.rx.stalled is None and handed.empty():
                    time.sleep(0.001)
                for ch in held:
                    ch.release()
                held.clear()
        for ch in held:
            ch.release()

    async def main() -> tuple[bool, dict]:
        [(c, s)] = tcp_pair()
        check = StreamCheck(data)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sendall, c, data)
            async with aio.open_receiver(s, own_socket=True, max_held=0.5, **SMALL) as rx:
                t = threading.Thread(target=releaser, args=(rx,))
                t.start()
                try:
                    async for chunk in rx:
                        check.add(chunk.data, chunk.stream_offset)
                        handed.put(chunk)
                finally:
                    handed.put(None)
                    await anyio.to_thread.run_sync(t.join)
                rx.flush()
                return check.complete, rx.stats_dict()

    complete, st = RUNNERS[runner](main)
    assert complete and st["backpressure"] >= 1 and st["in_flight"] == 0


@trio_runs
def test_use_from_another_thread_or_run_is_a_clear_error(runner, no_leaks):
    """Receiving or closing from a trio run in another thread: ZcnetError; releasing from that
    thread is allowed. A receiver kept past its run and used from the next run: ZcnetError."""
    errors: list[str] = []
    kept: dict = {}

    async def main() -> None:
        [(c, s)] = tcp_pair()
        await sendall(c, b"x" * 1000, close=False)
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            chunks = await rx.recv()
            t, errs = misuse_from_thread(rx, chunks, trio.run)
            await anyio.to_thread.run_sync(t.join)
            errors.extend(errs)
            rx.flush()
            assert rx.stats.in_flight == 0
        c.close()
        [(c, s)] = tcp_pair()
        kept["c"] = c
        kept["rx"] = aio.open_receiver(s, own_socket=True, **SMALL)  # left open

    async def later() -> None:
        await kept["rx"].recv()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RUNNERS[runner](main)
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    with pytest.raises(ZcnetError, match="another trio run") as next_run:
        RUNNERS[runner](later)
    kept["c"].close()
    use_err, close_err = errors
    assert "another thread" in use_err and "fix:" in use_err
    assert "another thread" in close_err
    assert "fix:" in str(next_run.value)


@trio_runs
def test_run_ends_with_receiver_and_sender_open(runner, no_leaks):
    """The run ends while a receiver (chunks held) and a sendzc sender are open: both are
    closed by the run's guard with a ResourceWarning, no traceback; the held chunks stay
    valid until released, and the area goes with the last."""
    size = 96 << 10
    state: dict = {}

    async def main() -> list:
        (c, s), (c2, s2) = tcp_pair(2)
        await sendall(c, pattern(14, size))
        state["c2"], state["s2"] = c2, s2
        state["tx"] = tx = aio.open_sender(c2, "sendzc", own_socket=True)
        await tx.sendall(b"y" * 5000)
        state["rx"] = rx = aio.open_receiver(s, own_socket=True, **SMALL)
        return [chunk async for chunk in rx]  # neither closed nor released

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        held = RUNNERS[runner](main)
        gc.collect()
    msgs = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert sum("still open when its trio run ended" in m for m in msgs) == 2, msgs
    assert state["rx"].rx.ring is None and state["tx"].ring is None
    release_held_after_close(held, pattern(14, size), state["rx"].rx.area)
    state["s2"].close()



@trio_runs
def test_keep_ring_holds_the_runs_ring_between_connections(runner, no_leaks):
    """keep_ring under trio, as on asyncio: connections one after another share the run's
    ring and the area the first left behind, bytes intact; freed when the holder closes."""

    async def main() -> None:
        async with aio.keep_ring():
            seen = []
            for i, (c, s) in enumerate(tcp_pair(2)):
                data = pattern(50 + i, 300 << 10)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sendall, c, data)
                    async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
                        seen.append((rx.rx.provider.member.lr, rx.rx.area))
                        assert (await receive_checked(rx, data)).complete
            (lr, area), (lr2, area2) = seen
            assert lr2 is lr and area2 is area and not lr.ring.closed
        assert lr.ring.closed and area.closed


class _Echo(aio.ZcProtocol):
    """Writes every chunk back, releases it, records the ending."""

    def __init__(self) -> None:
        self.lost = trio.Event()
        self.exc: BaseException | None = None

    def connection_made(self, transport: aio.ZcTransport) -> None:
        self.transport = transport

    def chunk_received(self, chunk: Any) -> None:
        self.transport.write(chunk.data)
        chunk.release()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.exc = exc
        self.lost.set()


@trio_runs
def test_protocol_echo(runner, no_leaks):
    """A ZcProtocol echo server: the callbacks run from the run's fd watch. The client sends
    all 16 MiB before reading any (more than loopback's socket buffers hold), so the server's
    writes go to its write buffer and out when the socket is writable (the run's add_writer);
    everything comes back intact."""
    size = 16 << 20
    data = pattern(15, size)

    async def main() -> tuple[bool, BaseException | None]:
        [(c, s)] = tcp_pair()
        proto = _Echo()
        aio.start_protocol(s, proto, **SMALL)
        check = StreamCheck(data)

        async def read_back() -> None:
            while not check.complete:
                try:
                    got = c.recv(1 << 20)
                except BlockingIOError:
                    await anyio.wait_readable(c)
                    continue
                assert got, "the echo ended early"
                check.add(got)

        await sendall(c, data, close=False)
        await read_back()
        c.shutdown(2)  # SHUT_RDWR: the server sees EOF and closes
        await proto.lost.wait()
        c.close()
        return check.complete, proto.exc

    complete, exc = RUNNERS[runner](main)
    assert complete and exc is None




@trio_runs
def test_trio_server_hands_its_socket_over(runner, no_leaks):
    """A trio server's accepted stream becomes a zcnet receiver through
    ``socket.socket(fileno=stream.socket.detach())`` (what docs/aio.md tells trio users)."""
    data = pattern(18, 1 << 20)

    async def main() -> bool:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listener.socket.getsockname()[1]

        async def client() -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(data.tobytes())
            await stream.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            stream = await listener.accept()
            await listener.aclose()
            sock = socket.socket(fileno=stream.socket.detach())
            async with aio.open_receiver(sock, own_socket=True) as rx:
                return (await receive_checked(rx, data)).complete

    assert RUNNERS[runner](main)

def test_trio_guest_run_inside_asyncio(no_leaks):
    """trio in guest mode on an asyncio loop: the same thread runs both. A receiver opened in
    a trio task uses the trio run (sniffio says so), one opened in an asyncio task the asyncio
    loop; both streams arrive intact."""
    sizes = {"trio": 2 << 20, "asyncio": 1 << 20}

    async def trio_side() -> tuple[str, bool]:
        [(c, s)] = tcp_pair()
        data = pattern(16, sizes["trio"])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sendall, c, data)
            async with aio.open_receiver(s, own_socket=True) as rx:
                kind = type(rx._owner.loop).__name__
                return kind, (await receive_checked(rx, data)).complete

    async def host() -> tuple[Any, tuple[str, bool]]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        trio.lowlevel.start_guest_run(trio_side, run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                                      done_callback=done.set_result)
        [(c, s)] = tcp_pair()
        data = pattern(17, sizes["asyncio"])

        async def send() -> None:
            await loop.sock_sendall(c, memoryview(data))
            c.close()

        sender = asyncio.create_task(send())
        async with aio.open_receiver(s, own_socket=True) as rx:
            mine = (type(rx._owner.loop).__name__, (await receive_checked(rx, data)).complete)
        await sender
        return (await done).unwrap(), mine

    guest, mine = asyncio.run(host())
    assert guest == ("TrioLoop", True)
    assert mine[1] and mine[0] != "TrioLoop"


@trio_runs
def test_a_pool_held_dry_resumes_under_trio(runner, no_leaks):
    """The dry pool's retry is a timer (TrioLoop.call_later): one receiver holds the whole
    pool, another waits; a release from a thread reaches it."""
    pool = {"pool": 32 << 10, "buf_size": 4096}

    async def main() -> bool:
        (ca, sa), (cb, sb) = tcp_pair(2)
        a = aio.open_receiver(sa, own_socket=True, max_held=1.0, **pool)
        b = aio.open_receiver(sb, own_socket=True, **pool)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sendall, ca, pattern(1, 32 << 10))
            held: list = []
            while sum(ch.length for ch in held) < 32 << 10:
                held += await a.recv()
            tg.start_soon(sendall, cb, pattern(2, 100_000))
            with anyio.move_on_after(0.2):
                held += await b.recv()  # nothing comes: the pool is dry
                raise AssertionError("a receive while the pool was held dry")
            t = threading.Thread(target=lambda: [ch.release() for ch in held])
            t.start()
            t.join()
            with anyio.fail_after(10):
                check = await receive_checked(b, pattern(2, 100_000))
        for rx in (a, b):
            rx.close()
        return check.complete

    assert RUNNERS[runner](main)


def test_a_run_ending_with_pooled_transports_waiting_closes_them_all(no_leaks):
    """One transport holds the whole pool, 200 others wait with data queued; the main task
    releases the held chunks and returns. At the run's end every pass runs at once: the
    buffers coming back must not wake receivers (a nesting chain of re-arms, then a timer on
    the ending run), so every transport is closed and nothing is left or logged."""
    pool = {"pool": 32 << 10, "buf_size": 4096}
    errors: list[object] = []

    class Keep(aio.ZcProtocol):
        def __init__(self) -> None:
            self.held: list = []

        def chunk_received(self, chunk) -> None:
            self.held.append(chunk)

    class Drop(aio.ZcProtocol):
        def chunk_received(self, chunk) -> None:
            chunk.release()

    clients: list[socket.socket] = []

    async def main() -> None:
        [(c, s)] = tcp_pair()
        clients.append(c)
        keep = Keep()
        aio.start_protocol(s, keep, max_held=1.0, **pool)
        c.setblocking(True)
        c.sendall(pattern(1, 32 << 10).tobytes())
        with trio.fail_after(5):
            while sum(ch.length for ch in keep.held) < 32 << 10:
                await trio.sleep(0.005)
        for i, (c2, s2) in enumerate(tcp_pair(200)):
            clients.append(c2)
            aio.start_protocol(s2, Drop(), **pool)
            c2.send(pattern(2 + i, 20000).tobytes())
        await trio.sleep(0.1)
        loop = aio.backend.current_loop()
        loop.call_exception_handler = lambda ctx: errors.append(ctx)  # type: ignore[method-assign]
        for ch in keep.held:
            ch.release()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the leftovers, closed by the guard
        trio.run(main)
    for c in clients:
        c.close()
    assert not errors
