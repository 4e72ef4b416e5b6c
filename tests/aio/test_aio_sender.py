"""zcnet.aio sender: SEND_ZC completions resolve futures, slots come back, back-pressure waits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aio_util import LOOPS, StreamCheck, pattern, run, tcp_pair
from smaps import field, smaps_entry
from zcnet import aio
from zcnet.errors import ClosedError, ZcnetError

pytestmark = pytest.mark.parametrize("loop_kind", list(LOOPS))


async def _receive(s, check: StreamCheck) -> None:
    """Everything the peer sends, checked against the expected stream, each chunk released."""
    async with aio.open_receiver(s, own_socket=True) as rx:
        async for chunk in rx:
            check.add(chunk.data, chunk.stream_offset)
            chunk.release()


@pytest.mark.parametrize("kind", ["sendzc", "copy"])
def test_stream_arrives_intact_and_every_completion_resolves(loop_kind, kind, no_leaks):
    size, slot = 3 << 20, 128 << 10
    data = pattern(9, size)

    async def main() -> tuple[list, dict]:
        c, s = await tcp_pair()
        check = StreamCheck(data)
        r = asyncio.create_task(_receive(s, check))
        futs = []
        async with aio.open_sender(c, kind, slots=4, slot_size=slot, own_socket=True) as tx:
            for off in range(0, size, slot):
                sl = await tx.acquire()
                sl.view[:] = data[off:off + slot]
                futs.append(await tx.send(sl, slot))
            await tx.flush()
            stats = tx.stats().as_dict()
        await r
        assert check.complete
        return [f.result() for f in futs], stats

    results, st = run(loop_kind, main)
    assert len(results) == 24 and all(isinstance(x, bool) for x in results)
    assert st["bytes"] == size and st["pending"] == 0
    if st["path"] == "sendzc":
        assert st["zerocopy"] + st["copied"] == st["sends"] == 24
        assert all(results) == (st["copied"] == 24)  # loopback copies: future says so


# Larger than loopback's socket buffers (tcp_wmem/tcp_rmem maxima, a few MiB) together: a
# send of a whole slot stays in flight until the peer reads. (Shrinking SO_RCVBUF after the
# connection opened instead makes the kernel drop and clamp the window to a crawl.)
BIG_SLOT = 32 << 20


def test_acquire_waits_for_a_free_slot_and_cancellation_loses_none(loop_kind, no_leaks):
    """The only slot is in flight (the peer is not reading): acquire waits. Cancelling the
    waiting acquire and the task whose send is in flight loses no slot and no byte order:
    once the peer reads, the slot comes back and the next send follows the first."""
    slot = BIG_SLOT
    data = pattern(11, slot)

    async def main() -> None:
        c, s = await tcp_pair()
        loop = asyncio.get_running_loop()
        async with aio.open_sender(c, "sendzc", slots=1, slot_size=slot, own_socket=True) as tx:
            if tx.kind != "sendzc":
                pytest.skip(tx.stats().note)

            async def first() -> None:
                sl = await tx.acquire()
                sl.view[:] = data
                await tx.send(sl, slot)

            sending = asyncio.create_task(first())
            waiter = asyncio.create_task(tx.acquire())
            await asyncio.sleep(0.2)
            assert not sending.done() and not waiter.done()  # back-pressure
            waiter.cancel()
            sending.cancel()
            await asyncio.gather(waiter, sending, return_exceptions=True)
            check = StreamCheck(np.concatenate([data, np.frombuffer(b"next", np.uint8)]))

            async def drain() -> None:
                while not check.complete:
                    got = await loop.sock_recv(s, 1 << 20)
                    assert got, "EOF before the whole stream"
                    check.add(got)

            reader = asyncio.create_task(drain())
            sl = await asyncio.wait_for(tx.acquire(), 10)
            sl.view[:4] = b"next"
            await tx.send(sl, 4)
            await tx.flush(timeout=10)
            await asyncio.wait_for(reader, 10)
            assert tx.outstanding == 0 and len(tx._free) == 1
        s.close()

    run(loop_kind, main)


def test_flush_gives_up_after_its_timeout(loop_kind, no_leaks):
    slot = BIG_SLOT

    async def main() -> str:
        c, s = await tcp_pair()
        async with aio.open_sender(c, "sendzc", slots=1, slot_size=slot, own_socket=True) as tx:
            if tx.kind != "sendzc":
                pytest.skip(tx.stats().note)
            sl = await tx.acquire()
            t = asyncio.create_task(tx.send(sl, slot))
            await asyncio.sleep(0.05)
            with pytest.raises(ZcnetError) as ei:
                await tx.flush(timeout=0.2)
            msg = str(ei.value)
            del ei  # its traceback holds this frame: a cycle keeping the 32 MiB buffer alive
            s.close()  # the peer goes: the send in flight fails and the slot comes back
            with pytest.raises(OSError):
                await t
            del t  # the task holds the error, whose traceback now holds this frame
        return msg

    assert "unacknowledged" in run(loop_kind, main)


def test_send_error_reaches_the_caller(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        s.close()
        await asyncio.sleep(0.05)
        async with aio.open_sender(c, "sendzc", slots=2, slot_size=1 << 16, own_socket=True) as tx:
            with pytest.raises(OSError):
                for _ in range(64):  # the first sends may still be accepted before the RST
                    sl = await tx.acquire()
                    await tx.send(sl, 1 << 16)
                    await asyncio.sleep(0.01)
            await tx.flush(timeout=5)
            assert len(tx._free) == 2

    run(loop_kind, main)


def test_copy_sendall_error_reaches_the_caller(loop_kind, no_leaks):
    """A reset peer: the copy path's direct send raises the socket's error to the caller."""
    async def main() -> None:
        c, s = await tcp_pair()
        s.close()
        await asyncio.sleep(0.05)
        async with aio.open_sender(c, "copy", own_socket=True) as tx:
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                for _ in range(64):  # the first sends may still be accepted before the RST
                    await tx.sendall(bytes(1 << 16))
                    await asyncio.sleep(0.01)

    run(loop_kind, main)


def test_sendall_copies_any_bytes_like(loop_kind, no_leaks):
    async def main() -> bytes:
        c, s = await tcp_pair()
        loop = asyncio.get_running_loop()
        async with aio.open_sender(c, "sendzc", slots=2, slot_size=1000, own_socket=True) as tx:
            await tx.sendall(np.arange(2500, dtype=np.uint8))
            await tx.flush()
        out = b""
        while len(out) < 2500:
            out += await loop.sock_recv(s, 4096)
        s.close()
        return out

    assert run(loop_kind, main) == np.arange(2500, dtype=np.uint8).tobytes()


def test_copy_sendall_beyond_the_socket_buffers_arrives_whole(loop_kind, no_leaks):
    """The copy path sends what the socket takes at once and leaves only the rest to the
    loop: more than loopback's send and receive buffers together (a few MiB each), so the
    first send is partial, and every byte arrives in order."""
    size = 24 << 20
    data = pattern(5, size)

    async def main() -> dict:
        c, s = await tcp_pair()
        check = StreamCheck(data)
        r = asyncio.create_task(_receive(s, check))
        async with aio.open_sender(c, "copy", own_socket=True) as tx:
            await tx.sendall(data)
            stats = tx.stats().as_dict()
        await asyncio.wait_for(r, 30)
        assert check.complete
        return stats

    st = run(loop_kind, main)
    assert st["bytes"] == size and st["sends"] == 1 and st["path"] == "copy"


def test_the_registered_buffer_is_never_a_transparent_huge_page(loop_kind, no_leaks):
    """The memory the sender registers for SEND_ZC is marked VM_NOHUGEPAGE: from inside a huge
    page a send can need more than a small SO_SNDBUF and park (zcnet.tx.sendzc)."""

    async def main() -> list[str]:
        c, s = await tcp_pair()
        try:
            async with aio.open_sender(c, "sendzc", slots=4, slot_size=1 << 20) as tx:
                return field(smaps_entry(tx._buf.ctypes.data), "VmFlags")
        finally:
            c.close()
            s.close()

    assert "nh" in run(loop_kind, main)


async def _drain(s, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while len(out) < n:
        part = await loop.sock_recv(s, 1 << 20)
        if not part:
            break
        out += part
    return bytes(out)


@pytest.mark.parametrize("kind", ["sendzc", "copy"])
def test_concurrent_sendalls_go_one_after_the_other_and_both_finish(loop_kind, kind, no_leaks):
    """Two tasks send more than the socket buffers hold while the peer is not reading: both
    finish and every byte arrives; copy sends wait their turn as SEND_ZC's do, so each copy
    message arrives whole."""
    a, b = bytes([65]) * (24 << 20), bytes([66]) * (24 << 20)

    async def main() -> bytes:
        c, s = await tcp_pair()
        async with aio.open_sender(c, kind, slots=4, slot_size=1 << 20, own_socket=True) as tx:
            t1 = asyncio.create_task(tx.sendall(a))
            t2 = asyncio.create_task(tx.sendall(b))
            await asyncio.sleep(0.1)  # both under way, the socket full
            got = asyncio.create_task(_drain(s, len(a) + len(b)))
            await asyncio.wait_for(asyncio.gather(t1, t2), 30)
            await tx.flush()
        s_out = await asyncio.wait_for(got, 30)
        s.close()
        return s_out

    out = run(loop_kind, main)
    assert out.count(65) == len(a) and out.count(66) == len(b)
    if kind == "copy":  # one send per sendall: whole messages (sendzc's go slot by slot)
        assert out in (a + b, b + a)


def test_a_cancelled_copy_send_still_sends_its_whole_slot(loop_kind, no_leaks):
    """Cancelled while the socket is full, a copy send leaves the rest to finish (as a SEND_ZC
    send does): the peer gets the whole message, then the next one; the slot comes back."""
    size = 32 << 20

    async def main() -> tuple[bytes, int]:
        c, s = await tcp_pair()
        async with aio.open_sender(c, "copy", slots=2, slot_size=size, own_socket=True) as tx:
            sl = await tx.acquire()
            sl.view[:] = bytes([65]) * size
            t = asyncio.create_task(tx.send(sl, size))
            await asyncio.sleep(0.1)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            got = asyncio.create_task(_drain(s, size + 4))
            await tx.sendall(b"next")
            await tx.flush()
            free = len(tx._free)
        out = await asyncio.wait_for(got, 30)
        s.close()
        return out, free

    out, free = run(loop_kind, main)
    assert out == bytes([65]) * size + b"next" and free == 2


@pytest.mark.parametrize("kind", ["sendzc", "copy"])
def test_a_send_cancelled_before_its_turn_gives_its_slot_back(loop_kind, kind, no_leaks):
    async def main() -> int:
        c, s = await tcp_pair()
        got = None
        async with aio.open_sender(c, kind, slots=2, slot_size=BIG_SLOT, own_socket=True) as tx:
            a = await tx.acquire()
            first = asyncio.create_task(tx.send(a, BIG_SLOT))  # in flight: the peer is idle
            await asyncio.sleep(0.1)
            b = await tx.acquire()
            second = asyncio.create_task(tx.send(b, 4))  # waits for the first
            await asyncio.sleep(0.05)
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            got = asyncio.create_task(_drain(s, BIG_SLOT))
            await asyncio.wait_for(first, 30)
            await tx.flush()
            slots = [await asyncio.wait_for(tx.acquire(), 5) for _ in range(2)]
        await asyncio.wait_for(got, 30)
        s.close()
        return len(slots)

    assert run(loop_kind, main) == 2


@pytest.mark.parametrize("kind", ["sendzc", "copy"])
def test_a_cancelled_aclose_still_frees_everything(loop_kind, kind, no_leaks):
    """aclose waits (bounded) for sends in flight; cancelled meanwhile, it still frees the
    ring, its eventfd and the owned socket (no_leaks checks them)."""
    async def main() -> None:
        c, s = await tcp_pair()
        tx = aio.open_sender(c, kind, slots=2, slot_size=BIG_SLOT, own_socket=True)
        sl = await tx.acquire()
        sender = asyncio.create_task(tx.send(sl, BIG_SLOT))
        await asyncio.sleep(0.1)
        closing = asyncio.create_task(tx.aclose())
        await asyncio.sleep(0.1)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert c.fileno() == -1 and tx.ring is None
        r = (await asyncio.gather(sender, return_exceptions=True))[0]
        assert isinstance(r, ClosedError), r  # the reason, not a bare cancel
        s.close()

    run(loop_kind, main)
