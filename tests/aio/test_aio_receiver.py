"""zcnet.aio receiver on real loopback sockets, on the default asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import warnings

import numpy as np
import pytest

from aio_util import LOOPS, StreamCheck, pattern, release_held_after_close, run, tcp_pair
from zcnet import aio

pytestmark = pytest.mark.parametrize("loop_kind", list(LOOPS))

SMALL = {"area_size": 256 << 10, "buf_size": 16 << 10}


async def send_and_close(sock: socket.socket, data: np.ndarray) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, memoryview(data))
    sock.close()


def test_many_connections_every_byte_verified(loop_kind, no_leaks):
    """250 concurrent connections on one loop, each a different 192 KiB stream, checked byte
    by byte against its own pattern by stream offset."""
    n_conn, size = 250, 192 << 10

    async def main() -> list[dict]:
        pairs = [await tcp_pair() for _ in range(n_conn)]

        async def consume(i: int, s: socket.socket) -> dict:
            check = StreamCheck(pattern(i, size))
            async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
                async for chunk in rx:
                    check.add(chunk.data, chunk.stream_offset)
                    chunk.release()
                assert check.complete
                return rx.stats_dict()

        senders = [send_and_close(c, pattern(i, size)) for i, (c, _) in enumerate(pairs)]
        got = await asyncio.gather(*(consume(i, s) for i, (_, s) in enumerate(pairs)),
                                   *senders)
        return got[:n_conn]

    stats = run(loop_kind, main)
    assert all(st["delivered_bytes"] == size and st["in_flight"] == 0 for st in stats)


def test_recv_batch_and_numpy_consumer(loop_kind, no_leaks):
    size = 3 << 20

    async def main() -> int:
        c, s = await tcp_pair()
        check = StreamCheck(pattern(5, size))
        total = 0
        sender = asyncio.create_task(send_and_close(c, pattern(5, size)))
        async with aio.open_receiver(s, own_socket=True) as rx:
            while (batch := await rx.recv_batch()) is not None:
                for arr in batch.arrays(coalesce=True):
                    total += int(arr.sum(dtype=np.uint64))
                    check.add(arr)
                batch.release()
            assert await rx.recv_batch() is None  # EOF stays EOF
        await sender
        assert check.complete
        return total

    assert run(loop_kind, main) == int(pattern(5, size).sum(dtype=np.uint64))


def test_cancel_task_awaiting_a_chunk_loses_nothing(loop_kind, no_leaks):
    """A task parked in `anext(rx)` is cancelled; the data sent afterwards all arrives in the
    next reader, and every buffer comes back."""
    size = 1 << 20

    async def main() -> dict:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            waiter = asyncio.create_task(anext(aiter(rx)))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            check = StreamCheck(pattern(1, size))
            sender = asyncio.create_task(send_and_close(c, pattern(1, size)))
            async for chunk in rx:
                check.add(chunk.data, chunk.stream_offset)
                chunk.release()
            await sender
            assert check.complete
            return rx.stats_dict()

    st = run(loop_kind, main)
    assert st["in_flight"] == 0 and st["delivered"] == st["released"]


def test_cancel_between_chunks_keeps_the_rest(loop_kind, no_leaks):
    """Chunks reaped in one round but not yet handed out survive the consumer's cancellation:
    the next consumer gets them first, in order; closing releases any left."""
    size = 512 << 10

    async def main() -> dict:
        c, s = await tcp_pair()
        await send_and_close(c, pattern(2, size))
        await asyncio.sleep(0.05)  # let it all queue, so one round holds many chunks
        check = StreamCheck(pattern(2, size))
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            got_one = asyncio.Event()

            async def take_one_then_hang() -> None:
                async for chunk in rx:
                    check.add(chunk.data, chunk.stream_offset)
                    chunk.release()
                    got_one.set()
                    await asyncio.sleep(3600)

            t = asyncio.create_task(take_one_then_hang())
            await got_one.wait()
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
            assert rx._pending, "the round should have held more than one chunk"
            async for chunk in rx:
                check.add(chunk.data, chunk.stream_offset)
                chunk.release()
            assert check.complete
            return rx.stats_dict()

    st = run(loop_kind, main)
    assert st["in_flight"] == 0


def test_timeouts_and_ordinary_tasks_share_the_loop(loop_kind, no_leaks):
    """wait_for on a receive times out without breaking the receiver, and other tasks keep
    running while it waits (the loop never blocks in the kernel)."""

    async def main() -> tuple[int, bytes]:
        c, s = await tcp_pair()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        t = asyncio.create_task(ticker())
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(rx.recv(), 0.2)
            assert ticks >= 5
            asyncio.get_running_loop().call_later(0.05, c.send, b"hello")
            chunks = await asyncio.wait_for(rx.recv(), 5)
            data = b"".join(bytes(ch) for ch in chunks)
            rx.rx.release_many(chunks)
        t.cancel()
        c.close()
        return ticks, data

    _, data = run(loop_kind, main)
    assert data == b"hello"


def test_backpressure_resumes_on_release_from_another_task(loop_kind, no_leaks):
    """Holding more than max_held of the area pauses delivery (TCP's window closes, nothing is
    dropped); releasing from another task wakes the receiver without polling."""
    size = 2 << 20

    async def main() -> dict:
        c, s = await tcp_pair()
        sender = asyncio.create_task(send_and_close(c, pattern(3, size)))
        check = StreamCheck(pattern(3, size))
        held: asyncio.Queue = asyncio.Queue()

        async def releaser() -> None:
            while True:
                chunk = await held.get()
                await asyncio.sleep(0.001)
                chunk.release()
                held.task_done()

        r = asyncio.create_task(releaser())
        async with aio.open_receiver(s, own_socket=True, max_held=0.5, **SMALL) as rx:
            async for chunk in rx:
                check.add(chunk.data, chunk.stream_offset)
                held.put_nowait(chunk)
            await held.join()
            rx.flush()
            stats = rx.stats_dict()
        r.cancel()
        await sender
        assert check.complete
        return stats

    st = run(loop_kind, main)
    assert st["backpressure"] >= 1 and st["in_flight"] == 0


def test_peer_reset_ends_async_for_with_the_error(loop_kind, no_leaks):
    """The peer resets after sending: `async for` yields the data, then raises
    ConnectionResetError; chunks still held stay readable until released."""
    size = 64 << 10

    async def main() -> None:
        c, s = await tcp_pair()
        data = pattern(4, size)
        await asyncio.get_running_loop().sock_sendall(c, memoryview(data))
        await asyncio.sleep(0.05)
        held = []
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            with pytest.raises(ConnectionResetError):
                async for chunk in rx:
                    held.append(chunk)
                    if sum(map(len, held)) == size:
                        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     struct.pack("ii", 1, 0))
                        c.close()  # linger 0: RST
        got = np.concatenate([np.frombuffer(ch.data, np.uint8) for ch in held])
        assert np.array_equal(got, data)  # after close, before release: still valid
        for ch in held:
            ch.release()

    run(loop_kind, main)


def test_loop_shutdown_with_receiver_open_and_chunks_held(loop_kind, no_leaks):
    """The loop ends while a receiver is open and chunks are held: the receiver is closed with
    a ResourceWarning (no traceback, no leaked ring); the chunks stay valid until released."""
    size = 96 << 10
    state: dict = {}

    async def main() -> list:
        c, s = await tcp_pair()
        await send_and_close(c, pattern(6, size))
        rx = aio.open_receiver(s, own_socket=True, **SMALL)
        state["rx"] = rx
        held = []
        async for chunk in rx:
            held.append(chunk)
        return held  # neither closed nor released

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        held = run(loop_kind, main)
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "still open" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert state["rx"].rx.ring is None  # the provider's ring is gone
    release_held_after_close(held, pattern(6, size), state["rx"].rx.area)


def test_loop_closed_without_asyncio_run(loop_kind, no_leaks, caplog):
    """A loop closed by hand (no task cancellation) with a receiver open: the receiver goes with
    the guard task when it is collected, and nothing is logged as a traceback."""
    loop = LOOPS[loop_kind]()

    async def main() -> aio.AsyncReceiver:
        c, s = await tcp_pair()
        c.close()
        return aio.open_receiver(s, own_socket=True, **SMALL)

    rx = loop.run_until_complete(main())
    loop.run_until_complete(asyncio.sleep(0))
    # What a careful program does: cancel what is left, then close.
    pending = asyncio.all_tasks(loop)
    for t in pending:
        t.cancel()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
    assert rx.closed and rx.rx.ring is None
    assert "Traceback" not in caplog.text


def test_close_from_another_task_while_a_receive_waits(loop_kind, no_leaks):
    """Another task closes the receiver under a waiting receive: the waiter gets an error (or
    is cancelled), never touches the freed ring."""

    async def main() -> None:
        c, s = await tcp_pair()
        rx = aio.open_receiver(s, own_socket=True, **SMALL)
        waiter = asyncio.create_task(rx.recv())
        await asyncio.sleep(0.02)
        c.send(b"wake it")  # the eventfd fires; close before the waiter runs again
        await asyncio.sleep(0)
        rx.close()
        with pytest.raises((ValueError, asyncio.CancelledError)):
            await waiter
        c.close()

    run(loop_kind, main)


@pytest.mark.parametrize("shared_ring", [True, False], ids=["shared", "own-ring"])
def test_a_second_task_awaiting_the_same_receiver_is_refused(loop_kind, shared_ring, no_leaks):
    """One waiter at a time: a second would replace the first, which would then never wake
    (not by data, not by close). The second gets a UsageError; the first still gets the data."""
    from zcnet.errors import UsageError

    async def main() -> None:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, shared_ring=shared_ring,
                                     **SMALL) as rx:
            first = asyncio.create_task(rx.recv())
            await asyncio.sleep(0.05)
            with pytest.raises(UsageError, match="already awaited by another task") as e:
                await rx.recv()
            assert "hand chunks to others" in str(e.value)
            await asyncio.get_running_loop().sock_sendall(c, b"x" * 1000)
            chunks = await asyncio.wait_for(first, 10)
            assert sum(ch.length for ch in chunks) > 0
            for ch in chunks:
                ch.release()
        c.close()

    run(loop_kind, main)
