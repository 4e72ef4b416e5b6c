"""zcnet.aio among ordinary asyncio code, written the way applications test it: pytest-asyncio
coroutines, on the default loop and on uvloop."""

from __future__ import annotations

import asyncio

import pytest

from aio_util import StreamCheck, pattern, tcp_pair
from zcnet import aio


@pytest.mark.asyncio(loop_factories=["asyncio", "uvloop"])  # see conftest's hook
async def test_receiver_beside_timers_queues_and_cancelled_tasks(no_leaks):
    """A receive under asyncio.wait_for, a producer/consumer queue, a timer and a task that is
    cancelled mid-receive all share one loop; every byte still arrives in order."""
    size = 1 << 20
    c, s = await tcp_pair()
    check = StreamCheck(pattern(8, size))
    q: asyncio.Queue = asyncio.Queue(maxsize=4)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    async def consumer() -> None:
        while (chunk := await q.get()) is not None:
            check.add(chunk.data, chunk.stream_offset)
            chunk.release()

    loop = asyncio.get_running_loop()
    tick = asyncio.create_task(ticker())
    cons = asyncio.create_task(consumer())
    async with aio.open_receiver(s, own_socket=True, area_size=256 << 10,
                                 buf_size=16 << 10) as rx:
        doomed = asyncio.create_task(rx.recv())
        await asyncio.sleep(0.01)
        doomed.cancel()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(rx.recv(), 0.05)
        sender = asyncio.create_task(loop.sock_sendall(c, memoryview(pattern(8, size))))
        while chunks := await asyncio.wait_for(rx.recv(), 10):
            for ch in chunks:
                await q.put(ch)
            if sender.done() and c.fileno() >= 0:
                c.close()
        await q.put(None)
        await cons
        rx.flush()
        assert rx.stats.in_flight == 0
    tick.cancel()
    await asyncio.gather(tick, doomed, return_exceptions=True)
    assert check.complete and ticks > 5
