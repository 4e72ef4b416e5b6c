"""The compiled per-message paths of zcnet.aio (zcnet.aio._loopaccel): a receiver's ``__anext__``
(Anext) and a copy sender's ``sendall`` (CopySend), against the Python code they stand in
for. Each case runs on both passes: with ZCNET_PURE the Python code runs alone, and both must
give the same chunks, counts and errors."""

from __future__ import annotations

import asyncio
import socket
import struct

import numpy as np
import pytest

from aio_util import LOOPS, StreamCheck, loop_pass, pattern, refused_in_thread, run, tcp_pair
from zcnet import aio
from zcnet.errors import ClosedError, UsageError

pytestmark = [pytest.mark.parametrize("loop_kind", list(LOOPS)),
              pytest.mark.usefixtures("loop_pass")]
__all__ = ["loop_pass"]  # the fixture, imported for pytest

SMALL = {"area_size": 256 << 10, "buf_size": 16 << 10}


def test_the_compiled_anext_runs_when_built(loop_kind, loop_pass, no_leaks):
    """What each pass gives for ``__anext__``: the C awaitable, or the Python coroutine."""

    async def main() -> str:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            step = rx.__anext__()
            name = type(step).__name__
            step.close()
        c.close()
        return name

    assert run(loop_kind, main) == ("AnextOp" if loop_pass == "c" else "coroutine")


def test_async_for_under_backpressure_and_a_cancel_loses_nothing(loop_kind, no_leaks):
    """Held chunks past max_held stall the receiver (the compiled step hands it to the Python
    one, which waits for a release); a task cancelled there, and one cancelled while waiting
    for data, leave the receiver whole: every byte arrives once, every buffer comes back."""
    size = 1 << 20
    data = pattern(7, size)

    async def main() -> dict:
        c, s = await tcp_pair()
        check = StreamCheck(data)
        async with aio.open_receiver(s, own_socket=True, max_held=0.25, **SMALL) as rx:
            idle = asyncio.create_task(anext(aiter(rx)))  # waits for data
            await asyncio.sleep(0.02)
            idle.cancel()
            with pytest.raises(asyncio.CancelledError):
                await idle
            loop = asyncio.get_running_loop()
            sender = asyncio.create_task(loop.sock_sendall(c, memoryview(data)))
            held = []
            while True:  # hold every chunk until delivery stalls
                stalled = asyncio.create_task(anext(aiter(rx)))
                done, _ = await asyncio.wait({stalled}, timeout=0.05)
                if not done:
                    break
                chunk = stalled.result()
                check.add(chunk.data, chunk.stream_offset)
                held.append(chunk)
            assert rx.rx.stalled is not None  # waiting for a release, not for data
            stalled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stalled
            for chunk in held:
                chunk.release()
            await sender
            c.close()
            async for chunk in rx:
                check.add(chunk.data, chunk.stream_offset)
                chunk.release()
            assert check.complete
            return rx.stats_dict()

    st = run(loop_kind, main)
    assert st["backpressure"] >= 1 and st["in_flight"] == 0 and st["delivered"] == st["released"]


def test_a_second_async_for_while_one_waits_is_refused(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            first = asyncio.create_task(anext(aiter(rx)))
            await asyncio.sleep(0.02)
            with pytest.raises(UsageError, match="already awaited by another task"):
                await anext(aiter(rx))
            c.send(b"x" * 100)
            chunk = await asyncio.wait_for(first, 10)
            assert bytes(chunk.data).startswith(b"x")
            chunk.release()
        c.close()

    run(loop_kind, main)


def test_closing_under_a_waiting_async_for_raises_closed(loop_kind, no_leaks):
    async def main() -> str:
        c, s = await tcp_pair()
        rx = aio.open_receiver(s, own_socket=True, **SMALL)
        waiter = asyncio.create_task(anext(aiter(rx)))
        await asyncio.sleep(0.02)
        rx.close()
        with pytest.raises(ClosedError) as e:
            await asyncio.wait_for(waiter, 10)
        c.close()
        return str(e.value)

    assert "closed while a receive waited" in run(loop_kind, main)


def test_an_awaited_step_cannot_be_awaited_again(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        c.send(b"y" * 100)
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            step = rx.__anext__()
            chunk = await step
            chunk.release()
            with pytest.raises(RuntimeError, match="cannot reuse already awaited"):
                await step
        c.close()

    run(loop_kind, main)


def test_receiving_from_another_thread_is_refused(loop_kind, no_leaks):
    async def main() -> str:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            err = await refused_in_thread(lambda: anext(aiter(rx)))
        c.close()
        return err

    assert "another thread" in run(loop_kind, main)


def test_copy_sendall_counts_each_send_and_every_byte(loop_kind, no_leaks):
    msgs = [bytes([i]) * (1 + i * 37) for i in range(200)]

    async def main() -> tuple[dict, bytes]:
        c, s = await tcp_pair()
        loop = asyncio.get_running_loop()
        async with aio.open_sender(c, "copy", own_socket=True) as tx:
            for m in msgs:
                await tx.sendall(memoryview(m))
            await tx.sendall(np.frombuffer(b"end", np.uint8))
            stats = tx.stats().as_dict()
        out = b""
        while chunk := await loop.sock_recv(s, 1 << 16):
            out += chunk
        s.close()
        return stats, out

    st, out = run(loop_kind, main)
    assert out == b"".join(msgs) + b"end"
    assert st["sends"] == len(msgs) + 1 and st["bytes"] == len(out)


def test_copy_sendall_on_a_closed_socket_never_reaches_a_reused_fd(loop_kind, no_leaks):
    """The socket closed under the sender, its fd number taken by a new socket: sendall fails
    (the socket is closed) and the new socket's peer gets nothing."""

    async def main() -> bytes:
        c, s = await tcp_pair()
        async with aio.open_sender(c, "copy") as tx:
            fd = c.fileno()
            c.close()
            c2, s2 = await tcp_pair()
            assert c2.fileno() == fd or s2.fileno() == fd  # the number was given out again
            with pytest.raises(OSError):
                await tx.sendall(b"not for you")
        s2.setblocking(False)
        try:
            got = s2.recv(100)
        except BlockingIOError:
            got = b""
        for x in (s, c2, s2):
            x.close()
        return got

    assert run(loop_kind, main) == b""


def test_sendall_to_a_reset_peer_raises_the_socket_error(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        async with aio.open_sender(c, "copy", own_socket=True) as tx:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # linger 0: a reset
            await asyncio.sleep(0.05)
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                for _ in range(4):
                    await tx.sendall(b"x" * 100)

    run(loop_kind, main)
