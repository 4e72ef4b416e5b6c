"""zcnet.aio on zcrx (zcnet.aio.loop_zcrx): receivers and transports of one loop sharing its
thread's zcrx queue. Here the real ZcrxQueue, ZcrxProvider and Receiver run over the faked
kernel side (tests/fake_zcrx_kernel.py, with its eventfd) on real loopback TCP sockets whose
bytes the fake takes from a pattern stream per socket; a chunk routed to the wrong connection
fails its check. Against a real 7.x kernel in copy mode: test_aio_zcrx_vm.py. The host's own
kernel has no copy mode and no zcrx device here: a clear refusal, tested last."""

from __future__ import annotations

import asyncio

import pytest

from aio_util import LOOPS, run, tcp_pair
from fake_zcrx_kernel import FakeKernel, Stream, install_copy_mode
from zc_helpers import PAT
from zcnet import aio
from zcnet.aio.loop_zcrx import ZCRX_OPTIONS
from zcnet.errors import ClosedError, Unsupported, UsageError
from zcnet.rx.zc import zcrx
from zcnet.rx.zc.zcrx_queue import find_open, queue_key

N = 16
AREA = 2 << 20  # 512 buffers: 32 per connection, a 128 KiB share each


@pytest.fixture
def fake(monkeypatch, no_leaks):
    k = install_copy_mode(monkeypatch)
    yield k
    k.stream = None
    k.streams.clear()
    assert not k.rejections, k.rejections


async def pairs(fake: FakeKernel, n: int, total: int) -> list:
    """``n`` loopback pairs; the fake delivers to receiving socket ``i`` the pattern stream at
    offset i MiB (``total`` bytes, then EOF)."""
    out = [await tcp_pair() for _ in range(n)]
    for i, (_, s) in enumerate(out):
        fake.streams[s.fileno()] = Stream(PAT.expected(i << 20, total).tobytes(), segment=3000,
                                          per_wait=8, end=0)
    return out


def check(i: int, chunk) -> int:  # type: ignore[no-untyped-def]
    assert PAT.matches((i << 20) + chunk.stream_offset, chunk.array), f"conn {i} mixed up"
    return chunk.length


async def drain(i: int, rx: aio.AsyncReceiver) -> int:
    """``async for`` to the end of connection ``i``'s stream, each chunk checked and released;
    returns its bytes."""
    got = 0
    async for c in rx:
        got += check(i, c)
        c.release()
    return got


def close_all(fake: FakeKernel, rxs: list, ps: list) -> None:
    """Close the receivers and the sending ends; then the queue must be gone."""
    for rx in rxs:
        rx.close()
    for c, _ in ps:
        c.close()
    queue_gone(fake)


def queue_gone(fake: FakeKernel) -> None:
    """The loop let go of the queue: unregistered from this thread, its ring (and ifq) closed."""
    assert find_open(queue_key(0, 0)) is None
    assert all(r.closed for r in fake.rings)


@pytest.mark.parametrize("loop_kind", list(LOOPS))
def test_receivers_share_the_threads_queue_each_verified(fake, loop_kind):
    """16 ``async for`` receivers on one copy-mode queue (one ring, one registration), each
    stream larger than its share (capped receives re-armed), every byte checked; the queue
    closes with the last receiver."""
    total = 300_000

    async def main() -> None:
        ps = await pairs(fake, N, total)
        rxs = [aio.open_receiver(s, "zcrx", area_size=AREA, own_socket=True) for _, s in ps]
        zq = rxs[0].rx.provider.zq
        assert all(r.rx.provider.zq is zq for r in rxs) and len(fake.rings) == 1
        assert "copy mode" in rxs[0].rx.why and zq.share_bytes() == 128 << 10

        got = await asyncio.gather(*(drain(i, rx) for i, rx in enumerate(rxs)))
        assert got == [total] * N
        assert sum(r.rx.provider.cap_stops for r in rxs) > 0  # the share capped them
        close_all(fake, rxs, ps)

    run(loop_kind, main)


class Count(aio.ZcProtocol):
    def __init__(self, i: int, lost: asyncio.Future) -> None:
        self.i, self.got, self.lost = i, 0, lost

    def chunk_received(self, chunk) -> None:  # type: ignore[no-untyped-def]
        self.got += check(self.i, chunk)
        chunk.release()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.set_result(exc)


def test_transports_on_the_queue_each_verified(fake):
    total = 200_000

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ps = await pairs(fake, N, total)
        protos = [Count(i, loop.create_future()) for i in range(N)]
        trs = [aio.start_protocol(s, p, provider="zcrx", area_size=AREA)
               for (_, s), p in zip(ps, protos, strict=True)]
        assert len({id(t.rx.provider.zq) for t in trs}) == 1
        assert await asyncio.gather(*(p.lost for p in protos)) == [None] * N  # EOF: closed
        assert [p.got for p in protos] == [total] * N
        for c, _ in ps:
            c.close()
        queue_gone(fake)

    run("asyncio", main)


def test_a_receiver_that_keeps_its_chunks_stalls_alone(fake):
    """Connection 0 keeps every chunk: it stops at its share (paused "exhausted") while the
    others finish. Its task is cancelled there (nothing lost); once its chunks are released it
    resumes and finishes too."""
    total = 300_000

    async def main() -> None:
        ps = await pairs(fake, 4, total)
        rxs = [aio.open_receiver(s, "zcrx", area_size=AREA // 4, own_socket=True)
               for _, s in ps]
        zq = rxs[0].rx.provider.zq
        kept: list = []

        async def keeper() -> None:
            async for c in rxs[0]:
                check(0, c)
                kept.append(c)

        k = asyncio.ensure_future(keeper())
        assert await asyncio.gather(*(drain(i, rxs[i]) for i in (1, 2, 3))) == [total] * 3
        held = sum(c.length for c in kept)
        assert 0 < held <= zq.share_bytes() < total and not k.done()
        assert rxs[0].rx.stalled == "exhausted"
        k.cancel()
        await asyncio.gather(k, return_exceptions=True)
        for c in kept:
            c.release()
        assert held + await drain(0, rxs[0]) == total
        close_all(fake, rxs, ps)

    run("asyncio", main)


def test_closing_one_receiver_leaves_the_others_streaming(fake):
    total = 200_000

    async def main() -> None:
        ps = await pairs(fake, 4, total)
        rxs = [aio.open_receiver(s, "zcrx", area_size=AREA // 4, own_socket=True)
               for _, s in ps]
        first = await rxs[0].recv()
        assert first
        rxs[0].close()  # its chunks stay valid until released
        for c in first:
            check(0, c)
            c.release()

        assert await asyncio.gather(*(drain(i, rxs[i]) for i in (1, 2, 3))) == [total] * 3
        zq = rxs[1].rx.provider.zq
        assert len(zq.members) == 3
        close_all(fake, rxs[1:], ps)

    run("asyncio", main)


def test_a_queue_closed_under_waiting_receivers_ends_each_clearly(fake):
    async def main() -> None:
        ps = await pairs(fake, 3, 0)
        for _, s in ps:
            fake.streams[s.fileno()].end = None  # open, idle streams: the tasks wait
        rxs = [aio.open_receiver(s, "zcrx", area_size=AREA // 4, own_socket=True)
               for _, s in ps]
        c4, s4 = await tcp_pair()
        fake.streams[s4.fileno()] = Stream(b"", end=None)
        proto = Count(0, asyncio.get_running_loop().create_future())
        aio.start_protocol(s4, proto, provider="zcrx")
        tasks = [asyncio.ensure_future(rx.recv()) for rx in rxs]
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in tasks) and not proto.lost.done()
        rxs[0].rx.provider.zq.close()
        for t in tasks:
            with pytest.raises(ClosedError, match="zcrx queue copy mode was closed"):
                await t
        assert isinstance(await proto.lost, ClosedError)
        c4.close()
        close_all(fake, rxs, ps)

    run("asyncio", main)


def test_options_that_zcrx_does_not_take_are_refused_by_name(fake):
    async def main() -> None:
        c, s = await tcp_pair()
        with c, s:
            with pytest.raises(UsageError, match="does not take incremental") as ei:
                aio.open_receiver(s, "zcrx", incremental=True)
            assert ei.value.hint == f"it takes area_size, {', '.join(sorted(ZCRX_OPTIONS))}"
            with pytest.raises(UsageError, match="pool= and shared_ring=False are for soft"):
                aio.open_receiver(s, "zcrx", pool=True)
            with pytest.raises(UsageError, match="cannot drive callbacks"):
                aio.start_protocol(s, aio.ZcProtocol(), provider="devmem")
            with pytest.raises(UsageError, match="max_held must be in"):
                aio.open_receiver(s, "zcrx", max_held=2.0)  # refused after the join: undone
            queue_gone(fake)
            with pytest.raises(UsageError, match="fewer than 16 buffers"):
                # 64 KiB: 16 buffers, enough for one connection, not two
                a = aio.open_receiver(s, "zcrx", area_size=64 << 10)
                try:
                    c2, s2 = await tcp_pair()
                    with c2, s2:
                        aio.open_receiver(s2, "zcrx")
                finally:
                    assert list(a.rx.provider.zq.members) == [0]  # the first stays
                    a.close()
        queue_gone(fake)

    run("asyncio", main)


def test_trio_receivers_on_the_queue(fake):
    trio = pytest.importorskip("trio")
    total = 100_000

    async def main() -> None:
        import socket

        socks = []
        ls = socket.create_server(("127.0.0.1", 0))
        with ls:
            for i in range(4):
                c = socket.create_connection(ls.getsockname())
                s, _ = ls.accept()
                socks.append((c, s))
                fake.streams[s.fileno()] = Stream(PAT.expected(i << 20, total).tobytes(),
                                                  segment=3000, per_wait=8, end=0)
        rxs = [aio.open_receiver(s, "zcrx", area_size=AREA // 4, own_socket=True)
               for _, s in socks]
        got = [0] * 4

        async def each(i: int) -> None:
            got[i] = await drain(i, rxs[i])

        async with trio.open_nursery() as n:
            for i in range(4):
                n.start_soon(each, i)
        assert got == [total] * 4
        for rx in rxs:
            rx.close()
        for c, _ in socks:
            c.close()
        queue_gone(fake)

    trio.run(main)


def test_this_kernel_refuses_zcrx_on_loopback_with_the_reason(no_leaks):
    if zcrx.kernel_offers().copy_mode:
        pytest.skip("this kernel has zcrx copy mode: test_aio_zcrx_vm.py covers it")

    async def main() -> None:
        c, s = await tcp_pair()
        with c, s:
            with pytest.raises(Unsupported, match="no zcrx copy mode"):
                aio.open_receiver(s, "zcrx")
            with pytest.raises(Unsupported, match="no zcrx copy mode"):
                aio.start_protocol(s, aio.ZcProtocol(), provider="zcrx")
        assert find_open(queue_key(0, 0)) is None

    run("asyncio", main)
