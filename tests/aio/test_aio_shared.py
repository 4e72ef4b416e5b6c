"""The io_uring one event loop shares among its soft receivers (zcnet.aio.shared)."""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time
import warnings

import numpy as np
import pytest

from aio_util import LOOPS, StreamCheck, loop_pass, pattern, run, tcp_pair
from zcnet import aio
from zcnet.aio import shared
from zcnet.aio.loop_soft import SharedSoftProvider
from zcnet.errors import UsageError, ZcnetError
from zcnet.rx.zc.soft import SoftProvider

pytestmark = [pytest.mark.parametrize("loop_kind", list(LOOPS)),
              pytest.mark.usefixtures("loop_pass")]
__all__ = ["loop_pass"]  # the fixture, imported for pytest

SMALL = {"area_size": 256 << 10, "buf_size": 16 << 10}


def test_receivers_share_one_ring_until_the_last_closes(loop_kind, no_leaks):
    async def main() -> None:
        pairs = [await tcp_pair() for _ in range(3)]
        rxs = [aio.open_receiver(s, own_socket=True, **SMALL) for _, s in pairs]
        providers = [rx.rx.provider for rx in rxs]
        assert all(type(p) is SharedSoftProvider for p in providers)
        lr = providers[0].member.lr
        assert all(p.member.lr is lr for p in providers)
        assert len({p.member.bgid for p in providers}) == 3
        own = aio.open_receiver(pairs[0][0], shared_ring=False, **SMALL)
        assert type(own.rx.provider) is SoftProvider  # a ring of its own
        own.close()
        for rx in rxs[:2]:
            rx.close()
        assert not lr.ring.closed  # the third still uses it
        for c, _ in pairs[1:]:
            c.sendall(b"still here")
            c.close()
        pairs[0][0].close()
        got = b"".join([bytes(ch.data) for ch in await rxs[2].recv()])
        assert got == b"still here"[:len(got)] and got
        rxs[2].close()
        assert lr.ring.closed and lr.efd == -1  # closed with its last member

    run(loop_kind, main)


def test_a_closed_receivers_group_id_goes_to_the_next(loop_kind, no_leaks):
    """Buffer group ids are 16 bits: a connection-churning server must get them back."""
    async def main() -> None:
        pairs = [await tcp_pair() for _ in range(3)]
        a, b = (aio.open_receiver(s, own_socket=True, **SMALL) for _, s in pairs[:2])
        a_gid = a.rx.provider.member.bgid
        a.close()  # never armed: nothing to cancel
        c = aio.open_receiver(pairs[2][1], own_socket=True, **SMALL)
        assert c.rx.provider.member.bgid == a_gid
        pairs[1][0].sendall(b"abc")
        got = await b.recv()  # arms b's receive on the ring
        b.rx.release_many(got)
        b_gid = b.rx.provider.member.bgid
        b.close()  # cancels the armed receive, and sees it end
        d_client, d_sock = await tcp_pair()
        pairs.append((d_client, d_sock))
        d = aio.open_receiver(d_sock, own_socket=True, **SMALL)
        assert d.rx.provider.member.bgid == b_gid
        for x in (c, d):
            x.close()
        for cl, _ in pairs:
            cl.close()

    run(loop_kind, main)


def test_more_waiting_receivers_than_one_enter_serves(loop_kind, no_leaks):
    """Ping-pong on 64 connections at once: each round the data for every receiver arrives
    while all of them sleep, more task work than one enter runs (the kernel caps it), so the
    rest must be picked up without a new arrival to signal it."""
    n_conn, rounds = 64, 20

    async def main() -> int:
        pairs = [await tcp_pair() for _ in range(n_conn)]
        rxs = [aio.open_receiver(s, own_socket=True, **SMALL) for _, s in pairs]
        done = 0
        try:
            for r in range(rounds):
                msgs = [bytes([r, i % 251]) * 32 for i in range(n_conn)]
                waits = [asyncio.ensure_future(rx.recv()) for rx in rxs]
                await asyncio.sleep(0)  # every receiver is asleep before the data comes
                for (c, _), m in zip(pairs, msgs, strict=True):
                    c.send(m)
                got = await asyncio.wait_for(asyncio.gather(*waits), 30)  # hang guard only
                for rx, chunks, m in zip(rxs, got, msgs, strict=True):
                    data = b"".join(bytes(ch.data) for ch in chunks)
                    rx.rx.release_many(chunks)
                    while len(data) < len(m):  # a message may come in two rounds
                        more = await asyncio.wait_for(rx.recv(), 30)
                        data += b"".join(bytes(ch.data) for ch in more)
                        rx.rx.release_many(more)
                    assert data == m
                    done += 1
        finally:
            for (c, _), rx in zip(pairs, rxs, strict=True):
                c.close()
                rx.close()
        return done

    assert run(loop_kind, main) == n_conn * rounds


@pytest.mark.parametrize("shared_ring", [True, False])
def test_streams_alongside_a_ring_of_its_own(loop_kind, shared_ring, no_leaks):
    """Shared and own-ring receivers on one loop at once, each stream checked byte by byte."""
    size = 2 << 20

    async def main() -> None:
        async def one(i: int, shared: bool) -> None:
            c, s = await tcp_pair()
            check = StreamCheck(pattern(i, size))

            async def send() -> None:
                await asyncio.get_running_loop().sock_sendall(c, memoryview(pattern(i, size)))
                c.close()

            sender = asyncio.create_task(send())
            async with aio.open_receiver(s, own_socket=True, shared_ring=shared, **SMALL) as rx:
                async for chunk in rx:
                    check.add(chunk.data, chunk.stream_offset)
                    chunk.release()
            await sender
            assert check.complete

        await asyncio.gather(*(one(i, shared_ring if i % 2 else not shared_ring)
                               for i in range(8)))

    run(loop_kind, main)


def test_peer_reset_ends_one_stream_and_not_its_neighbours(loop_kind, no_leaks):
    """A reset on one connection of the shared ring ends that receiver with the error; the
    others sharing the ring keep receiving."""
    async def main() -> list[int]:
        pairs = [await tcp_pair() for _ in range(4)]
        rxs = [aio.open_receiver(s, own_socket=True, **SMALL) for _, s in pairs]
        bad_c = pairs[0][0]
        bad_c.send(b"x" * 100)
        bad_c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        bad_c.close()  # RST
        with pytest.raises(ConnectionResetError):
            async for chunk in rxs[0]:
                chunk.release()
        got = []
        for (c, _), rx in zip(pairs[1:], rxs[1:], strict=True):
            c.sendall(np.arange(1000, dtype=np.uint8).tobytes())
            c.close()
            n = 0
            async for chunk in rx:
                n += chunk.length
                chunk.release()
            got.append(n)
        for rx in rxs:
            rx.close()
        return got

    assert run(loop_kind, main) == [1000] * 3


def test_backpressure_resumes_on_release_from_another_thread(loop_kind, no_leaks):
    """Delivery pauses while the application holds too much; a worker thread releasing the
    chunks wakes the receiver through the loop (no polling)."""
    size = 2 << 20

    async def main() -> dict:
        c, s = await tcp_pair()
        check = StreamCheck(pattern(6, size))
        held: queue.Queue = queue.Queue()

        def worker() -> None:
            while (chunk := held.get()) is not None:
                time.sleep(0.0005)
                chunk.release()

        t = threading.Thread(target=worker)
        t.start()

        async def send() -> None:
            await asyncio.get_running_loop().sock_sendall(c, memoryview(pattern(6, size)))
            c.close()

        sender = asyncio.create_task(send())
        try:
            async with aio.open_receiver(s, own_socket=True, max_held=0.5, **SMALL) as rx:
                async for chunk in rx:
                    check.add(chunk.data, chunk.stream_offset)
                    held.put(chunk)
                held.put(None)
                await asyncio.get_running_loop().run_in_executor(None, t.join)
                rx.flush()
                stats = rx.stats_dict()
        finally:
            held.put(None)
            t.join()
        await sender
        assert check.complete
        return stats

    st = run(loop_kind, main)
    assert st["backpressure"] >= 1 and st["in_flight"] == 0


def test_completion_queue_overflow_loses_no_byte(loop_kind, no_leaks, monkeypatch):
    """More completions than the shared CQ holds arrive between two passes: the kernel keeps
    the overflow and ends the multishot receives it could not post for; every byte still
    arrives, in order (the receivers re-arm)."""
    monkeypatch.setattr(shared, "SQ_ENTRIES", 8)
    monkeypatch.setattr(shared, "CQ_ENTRIES", 16)
    n_conn, size = 16, 256 << 10

    async def main() -> None:
        pairs = [await tcp_pair() for _ in range(n_conn)]
        rxs = [aio.open_receiver(s, own_socket=True, area_size=256 << 10, buf_size=4096)
               for _, s in pairs]
        for rx in rxs:  # arm every receive before any data comes
            assert rx.rx.provider.member.lr.ring.cq_entries == 16
        first = [asyncio.ensure_future(rx.recv()) for rx in rxs]
        await asyncio.sleep(0)
        for i, (c, _) in enumerate(pairs):  # all of it lands before the loop runs a pass
            c.setblocking(True)
            c.sendall(pattern(i, size).tobytes())
            c.close()
        checks = [StreamCheck(pattern(i, size)) for i in range(n_conn)]
        for rx, check, fut in zip(rxs, checks, first, strict=True):
            for ch in await fut:
                check.add(ch.data, ch.stream_offset)
                ch.release()
            async for ch in rx:
                check.add(ch.data, ch.stream_offset)
                ch.release()
            assert check.complete
            stats = rx.stats_dict()
            rx.close()
        assert stats["rearms"] >= 1

    run(loop_kind, main)


# --- spare areas -----------------------------------------------------------------------------

def test_a_closed_receivers_area_is_populated_memory_for_the_next(loop_kind, no_leaks):
    """While the loop's ring lives (another receiver keeps it), a closed receiver's area goes
    to its spares and the next receiver of that size and kind takes it instead of populating
    a new one; bytes arrive intact through it. A debug receiver's area (poisoned on release)
    is not kept; the spares are unmapped with the ring (no_leaks)."""

    async def main() -> None:
        (kc, ks), (c1, s1), (c2, s2), (c3, s3), (c4, s4) = [await tcp_pair() for _ in range(5)]
        keeper = aio.open_receiver(ks, own_socket=True, **SMALL)
        lr = keeper.rx.provider.member.lr
        rx1 = aio.open_receiver(s1, own_socket=True, **SMALL)
        area = rx1.rx.area
        c1.sendall(b"first")
        for ch in await rx1.recv():
            ch.release()
        rx1.close()
        assert lr.spare == [area] and not area.closed
        rx2 = aio.open_receiver(s2, own_socket=True, area_size=512 << 10, buf_size=16 << 10)
        assert rx2.rx.area is not area and lr.spare == [area]  # another size: a new one
        rx3 = aio.open_receiver(s3, own_socket=True, **SMALL)
        assert rx3.rx.area is area and lr.spare == []
        await StreamCheck(pattern(3, 1 << 20)).through(rx3, c3)
        rx3.close()
        dbg = aio.open_receiver(s4, own_socket=True, debug=True, **SMALL)
        assert dbg.rx.area is area
        dbg.close()
        assert area.closed and lr.spare == []
        rx2.close()
        keeper.close()
        assert lr.ring.closed and lr.spare == []
        for c in (kc, c1, c2, c4):
            c.close()

    run(loop_kind, main)


def test_an_area_still_held_or_not_safe_to_reuse_is_unmapped_not_kept(loop_kind, monkeypatch,
                                                                        no_leaks):
    """The area of a receiver closed with a chunk held is kept only when that chunk is released
    on the loop's thread; released from another thread, or past SPARE_AREA_BYTES, or after a
    cancel the kernel did not confirm (a receive that may still write to it), it is unmapped."""
    monkeypatch.setattr(shared, "SPARE_AREA_BYTES", SMALL["area_size"])

    async def main() -> None:
        pairs = [await tcp_pair() for _ in range(5)]
        keeper = aio.open_receiver(pairs[0][1], own_socket=True, **SMALL)
        lr = keeper.rx.provider.member.lr
        rxs = [aio.open_receiver(s, own_socket=True, **SMALL) for _, s in pairs[1:]]
        held = []
        for (c, _), rx in zip(pairs[1:], rxs, strict=True):
            c.sendall(b"held")
            held.append(await rx.__anext__())
        areas = [rx.rx.area for rx in rxs]
        for rx in rxs:
            rx.close()
        assert lr.spare == [] and not any(a.closed for a in areas)  # chunks still held
        t = threading.Thread(target=held[0].release)  # last release from another thread
        t.start()
        t.join()
        assert areas[0].closed and lr.spare == []
        held[1].release()  # on the loop's thread: kept
        assert lr.spare == [areas[1]]
        held[2].release()  # no room left
        assert areas[2].closed and lr.spare == [areas[1]]
        prov = rxs[3].rx.provider
        prov._live = True  # as after a cancel the kernel did not confirm
        lr.spare.remove(areas[1])
        areas[1].close()
        held[3].release()
        assert areas[3].closed and lr.spare == []
        keeper.close()
        for c, _ in pairs:
            c.close()

    run(loop_kind, main)


def test_a_kept_area_is_handed_on_once_and_bad_sizes_are_still_refused(loop_kind, no_leaks):
    """A closed receiver gives its area away once: an empty release_many after close (which
    settles the accounting again) neither keeps it twice nor takes it back from the receiver
    now using it. A size that is not a whole number is refused as before, spare or not."""

    async def main() -> None:
        (kc, ks), (c1, s1), (c2, s2) = [await tcp_pair() for _ in range(3)]
        keeper = aio.open_receiver(ks, own_socket=True, **SMALL)
        lr = keeper.rx.provider.member.lr
        rx1 = aio.open_receiver(s1, own_socket=True, **SMALL)
        area = rx1.rx.area
        rx1.close()
        rx1.rx.release_many([])
        assert lr.spare == [area]
        with pytest.raises(UsageError, match="area size"):
            aio.open_receiver(s2, area_size=float(SMALL["area_size"]), buf_size=16 << 10)
        assert lr.spare == [area]
        rx2 = aio.open_receiver(s2, own_socket=True, **SMALL)
        assert rx2.rx.area is area
        rx1.rx.release_many([])
        assert lr.spare == [] and not area.closed
        rx2.close()
        keeper.close()
        for c in (kc, c1, c2):
            c.close()

    run(loop_kind, main)


# --- keep_ring -------------------------------------------------------------------------------

def test_keep_ring_holds_the_ring_and_its_spare_areas_between_connections(loop_kind, no_leaks):
    """One connection at a time under keep_ring: each closes with its area kept, the next
    gets the same ring and area, and bytes arrive intact through it. Let go with a receiver
    still open, the ring stays until that receiver closes; then it is freed (no_leaks)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with aio.keep_ring() as keeper:
            lr = shared._rings[loop]  # opened by keep_ring itself: the first connection is cheap
            assert not lr.ring.closed and not lr.members
            areas = []
            for i in range(3):
                c, s = await tcp_pair()
                async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
                    assert rx.rx.provider.member.lr is lr
                    areas.append(rx.rx.area)
                    # more than the area: buffers come back
                    await StreamCheck(pattern(40 + i, 600 << 10)).through(rx, c)
                assert not lr.ring.closed and lr.spare == [areas[0]]
            assert areas == [areas[0]] * 3
            c, s = await tcp_pair()
            rx = aio.open_receiver(s, own_socket=True, **SMALL)
            keeper.close()
            assert keeper.closed and not lr.ring.closed  # the receiver still uses it
            c.sendall(b"after")
            c.close()
            last = StreamCheck(np.frombuffer(b"after", dtype=np.uint8))
            await last.drain(rx)
            assert last.complete
            rx.close()
            assert lr.ring.closed and lr.spare == [] and areas[0].closed
        assert shared._rings.get(loop) is None

    run(loop_kind, main)


def test_keep_ring_left_open_is_closed_at_shutdown_and_misuse_is_refused(loop_kind, no_leaks):
    """A keeper still open when the loop shuts down is closed there with a ResourceWarning,
    like a forgotten receiver; opening one outside a loop, or closing it from another thread,
    is a clear error."""
    with pytest.raises(ZcnetError, match="needs a running asyncio event loop"):
        aio.keep_ring()
    state: dict = {}

    async def main() -> None:
        state["keeper"] = keeper = aio.keep_ring()
        errors: list[str] = []

        def other() -> None:
            try:
                keeper.close()
            except ZcnetError as e:
                errors.append(str(e))

        t = threading.Thread(target=other)
        t.start()
        await asyncio.get_running_loop().run_in_executor(None, t.join)
        assert errors and "another thread" in errors[0] and not keeper.closed
        state["lr"] = shared._rings[asyncio.get_running_loop()]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(loop_kind, main)
    assert any(issubclass(w.category, ResourceWarning) and "ring keeper" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert state["keeper"].closed and state["lr"].ring.closed


# --- kept buffer groups ----------------------------------------------------------------------

def test_a_settled_buffer_group_stays_registered_for_the_next_receiver(loop_kind, no_leaks):
    """A receiver closed with every buffer back in its group leaves the group registered with
    its area: the next receiver of that size takes both (no register, no unregister), and
    bytes arrive intact through them; its id is not handed to anyone else meanwhile. Another
    buffer size on that area gets a new group and the kept one is unregistered."""

    async def main() -> None:
        async with aio.keep_ring():
            lr = shared._rings[asyncio.get_running_loop()]
            c, s = await tcp_pair()
            rx1 = aio.open_receiver(s, own_socket=True, **SMALL)
            buf, bgid = rx1.rx.provider.group.buf, rx1.rx.provider.member.bgid
            await StreamCheck(pattern(60, 3 * SMALL["area_size"])).through(rx1, c)  # buffers cycle
            rx1.close()
            assert lr.groups == {id(rx1.rx.area): buf} and not buf.closed
            assert bgid not in lr._free_bgids
            c, s = await tcp_pair()
            rx2 = aio.open_receiver(s, own_socket=True, **SMALL)
            assert rx2.rx.provider.group.buf is buf and rx2.rx.provider.member.bgid == bgid
            assert rx2.rx.area is rx1.rx.area and lr.groups == {}
            await StreamCheck(pattern(61, 3 * SMALL["area_size"])).through(rx2, c)
            assert buf.kernel_head() == buf.head  # the kernel's ring and ours agree
            rx2.close()
            c, s = await tcp_pair()
            rx3 = aio.open_receiver(s, own_socket=True, area_size=SMALL["area_size"],
                                    buf_size=8 << 10)
            assert rx3.rx.area is rx1.rx.area and rx3.rx.provider.group.buf is not buf
            assert buf.closed and lr.groups == {}
            await StreamCheck(pattern(62, 1 << 20)).through(rx3, c)
            rx3.close()
        assert lr.ring.closed and lr.groups == {}

    run(loop_kind, main)


def test_a_group_not_known_settled_is_unregistered_not_kept(loop_kind, no_leaks, monkeypatch):
    """The group goes with its receiver when a chunk is still held at close, for a debug
    receiver, when the kernel's head is not ours (or cannot be read) and when the ring closes
    with the receiver; the area may still be kept on its own."""

    async def main() -> None:
        lr = None
        async with aio.keep_ring():
            lr = shared._rings[asyncio.get_running_loop()]
            c, s = await tcp_pair()
            rx = aio.open_receiver(s, own_socket=True, **SMALL)
            buf = rx.rx.provider.group.buf
            c.sendall(b"held")
            chunk = await rx.__anext__()
            rx.close()
            assert buf.closed and lr.groups == {}
            chunk.release()
            assert lr.spare == [rx.rx.area] and lr.groups == {}  # the area alone
            c.close()
            for kind in ("debug", "head", "status"):
                c, s = await tcp_pair()
                rx = aio.open_receiver(s, own_socket=True, debug=kind == "debug", **SMALL)
                buf = rx.rx.provider.group.buf
                await StreamCheck(pattern(63, 100_000)).through(rx, c)
                with monkeypatch.context() as m:
                    if kind == "head":
                        m.setattr(type(buf), "kernel_head", lambda self: (self.head + 1) & 0xFFFF)
                    elif kind == "status":
                        def refused(self: object) -> int:
                            raise OSError(22, "Invalid argument")
                        m.setattr(type(buf), "kernel_head", refused)
                    rx.close()
                assert buf.closed and lr.groups == {}, kind
        c, s = await tcp_pair()
        rx = aio.open_receiver(s, own_socket=True, **SMALL)  # the ring's only member
        lr, buf = rx.rx.provider.member.lr, rx.rx.provider.group.buf
        await StreamCheck(pattern(64, 100_000)).through(rx, c)
        rx.close()
        assert lr.ring.closed and buf.closed and rx.rx.area.closed

    run(loop_kind, main)


def test_kept_groups_survive_failed_opens_and_a_failing_unregister(loop_kind, no_leaks,
                                                                    monkeypatch):
    """Opens that fail after taking a kept area (a bad buffer size, a bad max_held) leave no
    group registered and no id lost; a provider closed twice frees its id once; a group whose
    unregister fails at ring close still lets the ring and its eventfd close."""

    async def main() -> None:
        keeper = aio.keep_ring()
        lr = shared._rings[asyncio.get_running_loop()]

        async def settle_one() -> tuple:
            c, s = await tcp_pair()
            rx = aio.open_receiver(s, own_socket=True, **SMALL)
            await StreamCheck(pattern(65, 100_000)).through(rx, c)
            rx.close()
            assert len(lr.groups) == 1
            return rx.rx.area, next(iter(lr.groups.values()))

        area, buf = await settle_one()
        c, s = await tcp_pair()
        with pytest.raises(UsageError):
            aio.open_receiver(s, area_size=SMALL["area_size"], buf_size=1 << 30)
        assert lr.spare == [area] and lr.groups == {}  # the area goes back; the group
        assert buf.closed and buf.bgid in lr._free_bgids  # (another buffer size) is freed
        with pytest.raises(UsageError, match="max_held"):
            aio.open_receiver(s, max_held=2.0, **SMALL)
        assert lr.spare == [] and lr.groups == {} and area.closed  # nothing left registered
        assert lr._free_bgids == [buf.bgid]  # taken by the failed open and given back once
        area, buf = await settle_one()
        rx = aio.open_receiver(s, own_socket=True, **SMALL)
        p = rx.rx.provider
        assert p.group.buf is buf
        rx.close()
        p.close()  # again: nothing more to free
        assert lr.groups == {id(area): buf} and buf.bgid not in lr._free_bgids
        c.close()
        with monkeypatch.context() as m:
            def refuses(self: object) -> None:
                raise OSError(16, "Device or resource busy")

            m.setattr(type(buf), "close", refuses)
            with pytest.raises(OSError, match="busy"):
                keeper.close()
        assert lr.ring.closed and lr.efd == -1 and shared._rings.get(lr.loop) is None
        buf.close()  # what the refusal left: unmapped here for no_leaks

    run(loop_kind, main)
