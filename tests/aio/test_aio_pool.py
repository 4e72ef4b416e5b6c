"""The buffer group one event loop's pooled receivers share (zcnet.aio.pool)."""

from __future__ import annotations

import asyncio
import socket
import threading

import numpy as np
import pytest

from aio_util import LOOPS, Recorder, StreamCheck, loop_pass, pattern, run, tcp_pair
from zcnet import aio
from zcnet.aio import shared
from zcnet.aio.pool import PooledSoftProvider
from zcnet.aio.shared import loop_ring
from zcnet.errors import UsageError
from zcnet.rx.zc.core import RxCore
from zcnet.rx.zc.provider import Delivery

pytestmark = [pytest.mark.parametrize("loop_kind", list(LOOPS)),
              pytest.mark.usefixtures("loop_pass")]
__all__ = ["loop_pass"]  # the fixture, imported for pytest

#: Eight 4 KiB buffers for every stream: the pool runs dry all the time.
POOL = {"pool": 32 << 10, "buf_size": 4096}


def sender(c: socket.socket, data: np.ndarray, reset: bool = False) -> threading.Thread:
    """Send ``data`` on ``c`` from a thread, then close it (with an RST when ``reset``)."""
    def send() -> None:
        c.setblocking(True)
        c.sendall(data.tobytes())
        if reset:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01" + b"\x00" * 7)
        c.close()
    t = threading.Thread(target=send)
    t.start()
    return t


def whole(pool) -> bool:
    """Every buffer is back in the pool and no receiver waits for one."""
    return pool.buf.in_ring == pool.buf.entries and not pool.waiting and not pool.receivers


async def receive_streams(style: str, data: list[np.ndarray], **opts: object) -> list:
    """One connection per item of ``data``, sent from threads, received on pooled receivers
    (``style`` "task": ``async for``; "callback": ZcProtocol) with ``opts``: every byte checked
    in order and the ending seen. Returns each receiver's stats."""
    pairs = [await tcp_pair() for _ in data]
    threads = [sender(c, d) for (c, _), d in zip(pairs, data, strict=True)]
    if style == "task":
        rxs = [aio.open_receiver(s, own_socket=True, **opts) for _, s in pairs]
        assert all(type(rx.rx.provider) is PooledSoftProvider for rx in rxs)
        checks = [StreamCheck(d) for d in data]
        await asyncio.gather(*(ck.drain(rx) for ck, rx in zip(checks, rxs, strict=True)))
        assert all(ck.complete for ck in checks)
        stats = [rx.stats for rx in rxs]
        for rx in rxs:
            rx.close()
    else:
        recs = [Recorder(d) for d in data]
        trs = [aio.start_protocol(s, r, **opts) for (_, s), r in zip(pairs, recs, strict=True)]
        await asyncio.gather(*(r.lost for r in recs))
        assert all(r.eof and r.check.complete for r in recs)
        stats = [tr.stats for tr in trs]
    for t in threads:
        await asyncio.get_running_loop().run_in_executor(None, t.join)
    return stats


@pytest.mark.parametrize("style", ["task", "callback"])
def test_many_streams_share_a_pool_that_runs_dry_and_lose_no_byte(loop_kind, style, no_leaks):
    """20 streams of 200 KiB through a 32 KiB pool: every byte arrives in order, the pool ran
    dry (receives ended and waited their turn), and at the end every buffer is back."""
    n, size = 20, 200_000

    async def main() -> int:
        async with aio.keep_ring():
            stats = await receive_streams(style, [pattern(i, size) for i in range(n)], **POOL)
            pool = loop_ring(asyncio.get_running_loop()).pool
            assert whole(pool) and pool.holders == 0
            area = pool.area
        assert area.closed  # with the ring, the keeper gone
        return sum(st.exhausted for st in stats)

    assert run(loop_kind, main) > 0


@pytest.mark.parametrize("style", ["task", "callback"])
def test_pooled_rounds_run_compiled_when_it_is_built(loop_kind, loop_pass, style, monkeypatch,
                                                     no_leaks):
    """Four 8 MiB streams on the default pool: with the compiled pass most buffers come through
    the compiled round (the Python round re-arms ended receives and takes each stream's last
    round, whose EOF comes with data); with the pure pass all of them through Python. Every
    byte arrives either way. (A dry pool's -ENOBUFS: the many-streams test above.)"""
    n, size = 4, 8 << 20
    by_python = [0]

    def counting(name: str) -> None:
        python_round = getattr(RxCore, name)

        def counted(self: RxCore, d: Delivery) -> object:
            by_python[0] += len(d.tokens)
            return python_round(self, d)

        monkeypatch.setattr(RxCore, name, counted)

    counting("deliver")
    counting("deliver_batch")

    async def main() -> int:
        stats = await receive_streams(style, [pattern(20 + i, size) for i in range(n)],
                                      pool=True)
        return sum(st.delivered for st in stats)

    delivered = run(loop_kind, main)
    assert delivered >= n * size // (64 << 10)
    if loop_pass == "c":
        assert by_python[0] < delivered // 4, (by_python[0], delivered)
    else:
        assert by_python[0] == delivered


def test_a_flush_wakes_a_receiver_waiting_for_the_pool(loop_kind, loop_pass, no_leaks):
    """A holds the whole pool and B waits for it. A's releases go back through A's round's
    flush (the compiled round's, or the Python one's PooledSoftProvider.recycle), which asks
    for a pass at once (Pool.released): B need not wait for the dry pool's retry timer."""

    async def main() -> tuple[tuple[int, int, bool], tuple[int, bool]]:
        (ca, sa), (cb, sb) = await tcp_pair(), await tcp_pair()
        a = aio.open_receiver(sa, own_socket=True, max_held=1.0, **POOL)
        b = aio.open_receiver(sb, own_socket=True, **POOL)
        assert (a._take is not None) == (loop_pass == "c")
        ca.sendall(pattern(1, 32 << 10).tobytes())
        held = []
        while sum(ch.length for ch in held) < 32 << 10:
            held += await a.recv()
        cb.sendall(pattern(2, 20000).tobytes())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.recv(), 0.1)
        lr = loop_ring(asyncio.get_running_loop())
        before = (len(lr.pool.waiting), lr.pool.free(), lr._scheduled)
        for ch in held:
            ch.release()  # into A's queue: nothing is back yet
        if a._take is not None:
            # A's compiled round: the flush, then FALLBACK (A's receive ended: its re-arm
            # waits for the pool's turn in Python) or DONE
            assert a._take() in (shared.ROUND_FALLBACK, shared.ROUND_DONE)
        else:
            a.flush()  # the Python round's flush, on its own
        after = (lr.pool.free(), lr._scheduled)
        for x in (a, b, ca, cb):
            x.close()
        return before, after

    before, after = run(loop_kind, main)
    assert before == (1, 0, False)
    assert after == (8, True)


def test_chunks_held_past_close_stay_valid_and_go_back_to_the_pool(loop_kind, no_leaks):
    """A receiver closed with chunks held: they still read the stream; released on the loop
    they refill the pool at once, released from another thread at the loop's next turn; the
    area outlives the ring while one is held."""
    async def main() -> None:
        keeper = aio.keep_ring()
        c, s = await tcp_pair()
        data = pattern(3, 12 << 10)
        c.sendall(data.tobytes())
        c.close()
        rx = aio.open_receiver(s, own_socket=True, **POOL)
        held = []
        async for chunk in rx:
            held.append(chunk)
        rx.close()
        pool = loop_ring(asyncio.get_running_loop()).pool
        assert pool.buf.in_ring == pool.buf.entries - len(held)
        got = np.concatenate([np.frombuffer(ch.data, np.uint8) for ch in held])
        assert np.array_equal(got, data)
        held.pop().release()  # on the loop: back now
        assert pool.buf.in_ring == pool.buf.entries - len(held)
        other = held.pop()
        t = threading.Thread(target=other.release)
        t.start()
        t.join()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert pool.buf.in_ring == pool.buf.entries - len(held)
        keeper.close()  # the ring and the pool's group go; the area stays while held
        assert pool.closed and not pool.area.closed
        assert bytes(held[0].data) == data[:held[0].length].tobytes()
        for ch in held:
            ch.release()
        assert pool.area.closed

    run(loop_kind, main)


def test_a_receiver_holding_its_share_does_not_stop_the_others(loop_kind, no_leaks):
    """One receiver keeps every chunk it gets (up to max_held of the pool); another streams
    more than the whole pool through the rest, then the first releases and finishes."""
    async def main() -> None:
        async with aio.keep_ring():
            (ca, sa), (cb, sb) = await tcp_pair(), await tcp_pair()
            da, db = pattern(1, 64 << 10), pattern(2, 400 << 10)
            ta, tb = sender(ca, da), sender(cb, db)
            a = aio.open_receiver(sa, own_socket=True, max_held=0.5, **POOL)
            b = aio.open_receiver(sb, own_socket=True, **POOL)
            held = []
            while a.stats.in_flight_bytes <= 16 << 10:
                held += await a.recv()
            check = StreamCheck(db)
            await check.drain(b)  # 400 KiB through the 16 KiB the first leaves
            assert check.complete
            assert a.stats.in_flight_bytes > 16 << 10 and not a.eof
            first = StreamCheck(da)
            for ch in held:
                first.take(ch)
            await first.drain(a)
            assert first.complete
            for rx in (a, b):
                rx.close()
            for t in (ta, tb):
                t.join()
            assert whole(loop_ring(asyncio.get_running_loop()).pool)

    run(loop_kind, main)



def test_a_pool_held_dry_resumes_the_others_on_a_release_from_another_thread(loop_kind,
                                                                             no_leaks):
    """One receiver may hold the whole pool (max_held=1.0) while another waits for a buffer.
    Its releases, from a thread and with no round of its own to return them, reach the waiting
    one through the dry pool's retry."""
    async def main() -> None:
        async with aio.keep_ring():
            (ca, sa), (cb, sb) = await tcp_pair(), await tcp_pair()
            a = aio.open_receiver(sa, own_socket=True, max_held=1.0, **POOL)
            b = aio.open_receiver(sb, own_socket=True, **POOL)
            ta = sender(ca, pattern(1, 32 << 10))  # exactly the pool
            held = []
            while sum(ch.length for ch in held) < 32 << 10:
                held += await a.recv()
            pool = loop_ring(asyncio.get_running_loop()).pool
            assert pool.buf.in_ring == 0
            tb = sender(cb, pattern(2, 100_000))
            waiting = asyncio.ensure_future(b.recv())
            await asyncio.sleep(0.05)
            assert not waiting.done() and pool.waiting  # nothing to take
            t = threading.Thread(target=lambda: [ch.release() for ch in held])
            t.start()
            t.join()
            check = StreamCheck(pattern(2, 100_000))
            for ch in await asyncio.wait_for(waiting, 5):
                check.take(ch)
            await check.drain(b)
            assert check.complete and await a.recv() == []
            for rx in (a, b):
                rx.close()
            ta.join()
            tb.join()
            assert whole(pool)

    run(loop_kind, main)


def test_receivers_that_stop_reading_leave_the_free_buffers_to_the_others(loop_kind, no_leaks):
    """Two receivers read once and then not at all while their receives stay armed: the
    buffers the kernel fills for them wait in completions no round reads. A third receiver
    still gets the buffers that are free, and once it holds them waiting does not spin the
    loop (the pool counts what the kernel can still take, not its own book)."""
    async def main() -> None:
        async with aio.keep_ring():
            pairs = [await tcp_pair() for _ in range(3)]
            idle = [aio.open_receiver(s, own_socket=True, **POOL) for _, s in pairs[:2]]
            for (c, _), rx in zip(pairs[:2], idle, strict=True):
                c.send(bytes(4096))
                for ch in await rx.recv():
                    ch.release()
                c.send(bytes(8192))  # two more buffers, taken while nobody reads
            await asyncio.sleep(0.1)
            pool = loop_ring(asyncio.get_running_loop()).pool
            unread = sum(len(part) for r in idle for part in r._member.inbox)
            free = pool.free()
            assert unread and free and free == pool.buf.in_ring - unread  # the book counts them
            rx = aio.open_receiver(pairs[2][1], own_socket=True, **POOL)
            t = sender(pairs[2][0], pattern(5, 100_000))
            check = StreamCheck(pattern(5, 100_000))
            got = []
            while sum(ch.length for ch in got) < free * 4096:  # every free buffer, held
                got += await asyncio.wait_for(rx.recv(), 5)
            assert pool.free() == 0
            waiter = asyncio.ensure_future(rx.recv())
            await asyncio.sleep(0.2)  # nothing to take: no receive armed to fail at once
            assert rx.stats.rearms <= 4  # before: a re-arm per pass, each failing at once
            for ch in got:
                check.take(ch)
            for ch in await asyncio.wait_for(waiter, 5):
                check.take(ch)
            for (c, _), r in zip(pairs[:2], idle, strict=True):
                c.close()
                async for ch in r:
                    ch.release()
            await asyncio.wait_for(check.drain(rx), 5)
            assert check.complete
            for r in (*idle, rx):
                r.close()
            t.join()
            assert whole(pool)

    run(loop_kind, main)


def test_peer_reset_ends_its_stream_and_its_buffers_go_back(loop_kind, no_leaks):
    async def main() -> None:
        async with aio.keep_ring():
            (c1, s1), (c2, s2) = await tcp_pair(), await tcp_pair()
            bad = aio.open_receiver(s1, own_socket=True, **POOL)
            good = aio.open_receiver(s2, own_socket=True, **POOL)
            t1 = sender(c1, pattern(1, 50_000), reset=True)  # a reset socket cannot be opened
            t2 = sender(c2, pattern(2, 150_000))
            with pytest.raises(ConnectionResetError):
                async for chunk in bad:
                    chunk.release()
            check = StreamCheck(pattern(2, 150_000))
            await check.drain(good)
            assert check.complete
            for rx in (bad, good):
                rx.close()
            t1.join()
            t2.join()
            assert whole(loop_ring(asyncio.get_running_loop()).pool)

    run(loop_kind, main)


def test_bad_pool_options_are_refused_by_name(loop_kind, no_leaks):
    async def main() -> list[str]:
        async with aio.keep_ring():
            c, s = await tcp_pair()
            errors = []
            for kw in ({"pool": True, "debug": True}, {"pool": True, "shared_ring": False},
                       {"pool": "big"}, {"pool": 0}, {"pool": True, "provider": "auto"}):
                with pytest.raises(UsageError) as e:
                    aio.open_receiver(s, **kw)
                errors.append(str(e.value))
            rx = aio.open_receiver(s, **POOL)
            with pytest.raises(UsageError) as e:  # another shape than the loop's pool
                aio.open_receiver(c, pool=32 << 10, buf_size=8192)
            errors.append(str(e.value))
            with pytest.raises(UsageError) as e:
                aio.start_protocol(c, aio.ZcProtocol(), hugetlb=True, **POOL)
            errors.append(str(e.value))
            rx.close()
            pool = loop_ring(asyncio.get_running_loop()).pool
            assert whole(pool) and pool.holders == 0
            c.close()
            s.close()
            return errors

    e = run(loop_kind, main)
    assert "with pool= does not take debug" in e[0]
    assert "pool= is for soft receivers on the loop's shared ring" in e[1] and e[4] == e[1]
    assert "pool must be True or a size in bytes, got 'big'" in e[2]
    assert "got 0" in e[3]
    assert "is 32768 bytes of 4096-byte buffers, not 32768 of 8192" in e[5]
    assert "with pool= does not take hugetlb" in e[6]


def test_the_default_pool_caps_each_receive_at_a_wake_ups_worth(loop_kind, no_leaks):
    """pool=True: 8 MiB, each receive capped at 1 MiB (the rcvlowat zcnet uses), eight armed
    per pass; a receiver's cap shrinks to what it may still take below max_held."""
    async def main() -> tuple[int, int, int, int]:
        c, s = await tcp_pair()
        rx = aio.open_receiver(s, own_socket=True, pool=True, max_held=0.0625)
        pool = rx.rx.provider.pool
        got = (pool.size, pool.quota, pool.pace, rx.rx.provider.quota())
        rx.close()
        c.close()
        return got

    assert run(loop_kind, main) == (8 << 20, 1 << 20, 8, 512 << 10)

