"""The compiled per-message paths of zcnet.aio (zcnet.aio._loopaccel): a receiver's ``__anext__``
(Anext) and a copy sender's ``sendall`` (CopySend), against the Python code they stand in
for. The cases marked ``both_passes`` run on both: with ZCNET_PURE the Python code runs alone,
and both must give the same chunks, counts and errors."""

from __future__ import annotations

import asyncio
import collections
import errno
import itertools
import socket
import struct
from typing import Any

import numpy as np
import pytest

from aio_util import (
    LOOPS,
    Recorder,
    StreamCheck,
    loop_pass,
    pattern,
    refused_in_thread,
    run,
    tcp_pair,
)
from zcnet import aio
from zcnet.aio import shared
from zcnet.aio.loop import ResourceState
from zcnet.errors import ClosedError, UsageError
from zcnet.rx.zc.core import Phase
from zcnet.rx.zc.receiver import Receiver

pytestmark = pytest.mark.parametrize("loop_kind", list(LOOPS))
both_passes = pytest.mark.usefixtures("loop_pass")
__all__ = ["loop_pass"]  # the fixture, imported for pytest

SMALL = {"area_size": 256 << 10, "buf_size": 16 << 10}


@both_passes
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


@both_passes
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
            await check.drain(rx)
            assert check.complete
            return rx.stats_dict()

    st = run(loop_kind, main)
    assert st["backpressure"] >= 1 and st["in_flight"] == 0 and st["delivered"] == st["released"]


@both_passes
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


@both_passes
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


@both_passes
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


@both_passes
def test_receiving_from_another_thread_is_refused(loop_kind, no_leaks):
    async def main() -> str:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            err = await refused_in_thread(lambda: anext(aiter(rx)))
        c.close()
        return err

    assert "another thread" in run(loop_kind, main)


@both_passes
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


@both_passes
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


@both_passes
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


@both_passes
def test_a_step_behaves_as_a_coroutine_does_on_misuse(loop_kind, no_leaks):
    """What the C step and the Python coroutine both do: a value sent to a fresh one, an
    exception thrown into one (instance, or class and value), reuse once over, one awaiter."""

    async def main() -> None:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            step = rx.__anext__()
            with pytest.raises(TypeError, match="non-None value"):
                step.send(1)
            step.close()
            step = rx.__anext__()
            with pytest.raises(KeyError, match="k"):
                step.throw(KeyError("k"))
            with pytest.raises(RuntimeError, match="cannot reuse already awaited"):
                step.send(None)
            step = rx.__anext__()
            with pytest.raises(KeyError):
                step.throw(KeyError, "k")
            first = asyncio.ensure_future(rx.__anext__())
            await asyncio.sleep(0.02)
            step = rx.__anext__()

            async def second() -> None:
                await step
            with pytest.raises(UsageError, match="already awaited by another task"):
                await second()  # another step while the first waits: the one-waiter rule
            step.close()
            c.send(b"x")
            (await asyncio.wait_for(first, 10)).release()
        c.close()

    run(loop_kind, main)


@both_passes
def test_one_step_awaited_by_two_tasks_is_refused(loop_kind, no_leaks):
    """The same step awaited a second time while it waits: RuntimeError, as for a coroutine;
    cancelling the first awaiter leaves the receiver usable."""

    async def main() -> None:
        c, s = await tcp_pair()
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            step = rx.__anext__()

            async def wait_on() -> Any:
                return await step
            t1 = asyncio.create_task(wait_on())
            await asyncio.sleep(0.02)
            with pytest.raises(RuntimeError, match="being awaited already"):
                await wait_on()
            t1.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t1
            c.send(b"y")
            chunk = await asyncio.wait_for(anext(aiter(rx)), 10)
            assert bytes(chunk.data) == b"y"
            chunk.release()
        c.close()

    run(loop_kind, main)


@pytest.mark.skipif(shared._loopaccel is None, reason="zcnet.aio._loopaccel is not built")
def test_a_step_re_entered_from_the_python_step_is_refused(loop_kind, monkeypatch, no_leaks):
    """A step driving the Python coroutine (here: the receiver seen closed, so it hands over)
    refuses send, throw and close from inside that coroutine (a finalizer or callback could
    do it), as a running coroutine refuses, and still ends with the coroutine's result."""
    monkeypatch.setenv("ZCNET_PURE", "0")

    async def main() -> list[str]:
        c, s = await tcp_pair()
        refused: list[str] = []
        async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
            box: dict[str, Any] = {}

            async def py_step() -> str:
                for attempt in (lambda: box["op"].send(None), box["op"].close,
                                lambda: box["op"].throw(KeyError)):
                    with pytest.raises(ValueError, match="already executing") as e:
                        attempt()
                    refused.append(str(e.value))
                return "done"

            closed = ResourceState()
            closed.closed = True  # the step hands every call to py_step
            owner = rx._owner
            anext_ = shared.loop_accel().Anext(
                shared.compiled_round(None, rx.rx), closed, rx._member, owner.thread,
                owner.is_running, owner.loop.create_future, collections.deque(), py_step,
                lambda: None, ClosedError)
            box["op"] = anext_()
            assert await box["op"] == "done"
        c.close()
        return refused

    assert len(run(loop_kind, main)) == 3



@both_passes
@pytest.mark.parametrize("receive", ["recv", "recv_batch"])
def test_no_round_is_taken_while_more_than_max_held_is_held(loop_kind, receive, no_leaks):
    """max_held bounds what a round may start from: a round (the compiled take, or the Python
    round) is taken only while the bytes held are at most the limit, so the held bytes never
    exceed the limit by more than the last round. The application holds every chunk of a
    stream 4x the limit, sent in small pieces (small rounds), until delivery pauses; then
    every byte still arrives once."""
    size = 1 << 20
    data = pattern(13, size)

    async def main() -> tuple[int, list[tuple[int, int]], str | None, dict]:
        c, s = await tcp_pair()
        loop = asyncio.get_running_loop()

        async def send() -> None:
            for off in range(0, size, 8 << 10):
                await loop.sock_sendall(c, memoryview(data)[off:off + (8 << 10)])
                await asyncio.sleep(0.0005)
            c.close()

        sender = asyncio.create_task(send())
        check = StreamCheck(data)
        async with aio.open_receiver(s, own_socket=True, max_held=0.25, area_size=1 << 20,
                                     buf_size=4096) as rx:
            held: list[Any] = []
            rounds = []  # (bytes held when the round was taken, the round's bytes)
            while True:
                before = rx.stats.in_flight_bytes
                step = asyncio.ensure_future(getattr(rx, receive)())
                done, _ = await asyncio.wait({step}, timeout=0.3)
                if not done:  # paused: waiting for a release
                    break
                got = step.result()
                pieces = got.views() if receive == "recv_batch" else [ch.data for ch in got]
                for v in pieces:
                    check.add(v)
                rounds.append((before, sum(map(len, pieces))))
                held.extend([got] if receive == "recv_batch" else got)
            stalled = rx.rx.stalled
            step.cancel()
            with pytest.raises(asyncio.CancelledError):
                await step
            for h in held:
                h.release()
            await check.drain(rx) if receive == "recv" else await _drain_batches(rx, check)
            await sender
            assert check.complete
            return rx.rx.core.limit, rounds, stalled, rx.stats_dict()

    limit, rounds, stalled, st = run(loop_kind, main)
    assert stalled == "backpressure" and sum(n for _, n in rounds) > limit
    assert all(before <= limit for before, _ in rounds), (limit, rounds)
    assert st["in_flight"] == 0 and st["delivered"] == st["released"]


async def _drain_batches(rx: aio.AsyncReceiver, check: StreamCheck) -> None:
    while (b := await rx.recv_batch()) is not None:
        for v in b.views():
            check.add(v)
        b.release()


@both_passes
def test_batches_and_chunks_released_together_go_back_once(loop_kind, no_leaks):
    """Rounds alternate between recv() (chunks) and recv_batch() (one Batch, from the compiled
    round when built); each round is released with the one after it, so the releases a round
    flushes mix both kinds. Every byte arrives once, in order, and every buffer comes back."""
    size = 6 << 20
    data = pattern(11, size)

    async def send_slowly(c: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for off in range(0, size, 64 << 10):  # small rounds: two held stay far below max_held
            await loop.sock_sendall(c, memoryview(data)[off:off + (64 << 10)])
            await asyncio.sleep(0.001)
        c.close()

    async def receive(rx: aio.AsyncReceiver, check: StreamCheck) -> Any:
        older: list[Any] = []
        first = None
        for turn in itertools.count():
            got = await (rx.recv_batch() if turn % 2 else rx.recv())
            if not got:
                break
            if turn % 2:
                for v in got.views():
                    check.add(v)
                now = [got]
                first = first or got
            else:
                for ch in got:
                    check.add(ch.data, ch.stream_offset)
                now = list(got)
            if len(older) and turn % 2:  # release two rounds, a batch's and chunks, at once
                for h in older + now:
                    h.release()
                older = []
            else:
                older += now
        for h in older:
            h.release()
        return first

    async def main() -> dict:
        c, s = await tcp_pair()
        check = StreamCheck(data)
        sender = asyncio.create_task(send_slowly(c))
        async with aio.open_receiver(s, own_socket=True, area_size=4 << 20,
                                     buf_size=16 << 10) as rx:
            first = await asyncio.wait_for(receive(rx, check), 60)
            await sender
            with pytest.raises(ValueError, match="released twice"):
                first.release()
            rx.flush()
            assert check.complete
            return rx.stats_dict()

    st = run(loop_kind, main)
    assert st["in_flight"] == 0 and st["delivered"] == st["released"]


# --- a receive that ended with data ----------------------------------------------------------

#: 16 buffers: a wake-up with 64 KiB queued takes them all in one bundle, and that CQE (data,
#: no F_MORE) ends the multishot receive.
ENDING = {"area_size": 64 << 10, "buf_size": 4096}


def _count_python_rounds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of Receiver._round, the Python round (the compiled round never calls it)."""
    calls = [0]
    python_round = Receiver._round

    def counted(self: Receiver, *args: Any) -> Any:
        calls[0] += 1
        return python_round(self, *args)

    monkeypatch.setattr(Receiver, "_round", counted)
    return calls


async def _queued_pair(data: np.ndarray) -> tuple[socket.socket, Any]:
    """A pair whose client sends all of ``data`` from a thread and closes; returns the server
    side and the send's future. A receiver opened on it afterwards finds most of the stream
    queued at each wake-up."""
    c, s = await tcp_pair()
    c.setblocking(True)
    send = asyncio.get_running_loop().run_in_executor(
        None, lambda: (c.sendall(data.tobytes()), c.close()))
    await asyncio.sleep(0.05)
    return s, send


@both_passes
@pytest.mark.parametrize("style", ["recv_batch", "async for", "protocol"])
def test_a_receive_that_ended_with_data_is_re_armed_by_the_compiled_round(
        loop_kind, loop_pass, style, monkeypatch, no_leaks):
    """The stream is queued before the receiver reads, so the receive ends with data again and
    again. Through the compiled round that data is delivered and the receive re-armed without
    the Python round, which runs only for the first arm and at EOF; through the Python round
    it runs every time. Both: every byte once and in order, every re-arm counted."""
    size = 2 << 20
    data = pattern(5, size)
    calls = _count_python_rounds(monkeypatch)

    async def main() -> dict:
        s, send = await _queued_pair(data)
        check = StreamCheck(data)
        if style == "protocol":
            rec = Recorder(data)
            tr = aio.start_protocol(s, rec, **ENDING)
            assert await asyncio.wait_for(rec.lost, 60) is None
            await send
            assert rec.check.complete and rec.eof
            return {k: getattr(tr.stats, k) for k in ("in_flight", "delivered", "released",
                                                       "rearms")}
        async with aio.open_receiver(s, own_socket=True, **ENDING) as rx:
            if style == "recv_batch":
                while (b := await asyncio.wait_for(rx.recv_batch(), 60)) is not None:
                    check.take(b)
            else:
                await check.drain(rx)
            await send
            rx.flush()
            assert check.complete
            return rx.stats_dict()

    st = run(loop_kind, main)
    assert st["in_flight"] == 0 and st["delivered"] == st["released"]
    assert st["rearms"] >= 8, st
    if loop_pass == "c":  # the first arm, a first round of many CQEs, EOF, and on a busy
        # machine some pauses for releases (13 Python rounds for 32 re-arms seen in CI):
        # far fewer than the re-arms, where the Python round runs for every one of them
        assert calls[0] <= 3 + st["rearms"] // 2, (calls[0], st["rearms"])
    else:
        assert calls[0] > st["rearms"]


@both_passes
def test_a_re_arm_that_fails_raises_from_the_receive_and_the_next_one_goes_on(
        loop_kind, monkeypatch, no_leaks):
    """The provider's arm() raising at a re-arm (the compiled round calls it too) reaches the
    task awaiting recv_batch(); the next call re-arms and the stream goes on whole."""
    size = 1 << 20
    data = pattern(6, size)

    async def main() -> tuple[int, dict]:
        s, send = await _queued_pair(data)
        check = StreamCheck(data)
        failed = 0
        async with aio.open_receiver(s, own_socket=True, **ENDING) as rx:
            prov = rx.rx.provider
            arm = prov.arm
            left = [2]  # the first arm, then one re-arm, succeed; the next re-arm fails

            def arm_once_failing() -> None:
                left[0] -= 1
                if left[0] == 0:
                    raise OSError(errno.ENOMEM, "injected arm failure")
                arm()

            prov.arm = arm_once_failing
            while True:
                try:
                    b = await asyncio.wait_for(rx.recv_batch(), 60)
                except OSError as e:
                    assert "injected" in str(e)
                    failed += 1
                    continue
                if b is None:
                    break
                check.take(b)
            await send
            rx.flush()
            assert check.complete
            return failed, rx.stats_dict()

    failed, st = run(loop_kind, main)
    assert failed == 1
    assert st["in_flight"] == 0 and st["rearms"] >= 3


@both_passes
@pytest.mark.parametrize("step", ["recv_batch", "anext"])
def test_a_re_arm_that_closes_the_receiver_raises_closed_not_a_wait(loop_kind, step, no_leaks):
    """Python run by the re-arm (a GC pass inside arm(), here a wrapper around it) closes the
    receiver: the receive raises ClosedError on both passes instead of waiting for completions
    that will never come."""

    async def main() -> None:
        s, send = await _queued_pair(pattern(8, 256 << 10))
        rx = aio.open_receiver(s, own_socket=True, **ENDING)
        prov = rx.rx.provider
        while rx.rx.core.phase in (Phase.IDLE, Phase.ARMED):  # until a receive ended with data
            b = await asyncio.wait_for(rx.recv_batch(), 10)
            assert b is not None
            b.release()
        arm = prov.arm

        def arm_then_close() -> None:  # what a GC pass at the end of arm() could do
            arm()
            rx.close()

        prov.arm = arm_then_close
        # Not through wait_for: its timeout cancels the receive, whose ClosedError would then
        # pass for the answer. A receive that waits instead of raising is still pending here.
        task = asyncio.ensure_future(rx.recv_batch() if step == "recv_batch" else anext(rx))
        done, _ = await asyncio.wait({task}, timeout=10)
        assert task in done, "the receive waits for completions that will never come"
        with pytest.raises(ClosedError):
            task.result()
        assert rx.rx.closed
        await send

    run(loop_kind, main)
