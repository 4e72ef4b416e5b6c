"""Many connections on one zcrx queue (zcnet.rx.zc.zcrx_queue): the real ZcrxQueue and
ZcrxProvider over the faked kernel side (tests/fake_zcrx_kernel.py: several RECV_ZCs on one
ifq, one refill ring, the byte cap, EEXIST on a bound queue). The same against a real 7.x kernel
in copy mode: tests/rx/test_zcrx_shared_vm.py."""

from __future__ import annotations

import errno
import platform
import socket
import threading

import numpy as np
import pytest

from fake_zcrx_kernel import FakeKernel, Stream
from zc_helpers import PAT
from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError
from zcnet.rx.zc import Receiver, zcrx, zcrx_export, zcrx_ifq, zcrx_queue, zcrx_rings
from zcnet.rx.zc.area import PAGE_SIZE
from zcnet.rx.zc.zcrx import open_zcrx, open_zcrx_queue
from zcnet.rx.zc.zcrx_reg import Offers, StatsLayout
from zcnet.uapi import io_uring as u

COPY_OFFERS = Offers(u.ZCRX_REG_IMPORT | u.ZCRX_REG_NODEV, u.ZCRX_FEATURE_RX_PAGE_SIZE, 3)


@pytest.fixture
def fake(monkeypatch, no_leaks):
    k = FakeKernel()
    monkeypatch.setattr(zcrx_rings, "Ring", k.ring_class())  # queue_ring makes it
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: COPY_OFFERS)
    monkeypatch.setattr(zcrx_queue, "kernel_stats_layout", lambda: StatsLayout(16, 8))
    yield k
    k.stream = None
    k.streams.clear()
    assert not k.rejections, k.rejections


@pytest.fixture
def socks():
    """16 sockets: only their fds matter to the fake kernel (each names its stream)."""
    pairs = [socket.socketpair() for _ in range(16)]
    yield [a for a, _ in pairs]
    for a, b in pairs:
        a.close()
        b.close()


def streams(fake: FakeKernel, socks: list[socket.socket], total: int) -> None:
    """A distinct pattern stream per socket: stream ``i`` starts at pattern offset i MiB, so a
    chunk routed to the wrong connection fails the check."""
    for i, s in enumerate(socks):
        fake.streams[s.fileno()] = Stream(PAT.expected(i << 20, total).tobytes(), segment=3000,
                                          per_wait=8, end=0)


def serve(zq, rxs: dict[int, Receiver], *, hold: frozenset[int] = frozenset(),
          rounds: int = 20_000) -> tuple[dict[int, int], list]:
    """A server's loop: ``ready()``, then ``recv(0)`` on each connection it names. Every
    byte is checked at its stream offset; connections in ``hold`` keep their chunks. Returns
    the bytes per connection and the held chunks; the most any connection held is checked
    against its share on every round."""
    by_member = {rx.provider.mid: (i, rx) for i, rx in rxs.items()}
    got = {i: rx.stats.delivered_bytes for i, rx in rxs.items()}
    kept: list = []
    for _ in range(rounds):
        if all(rx.eof or (i in hold and not rx.provider.armed and not rx.provider.due())
               for i, rx in rxs.items()):
            break
        for m in zq.ready(0):
            if m.mid not in by_member:
                continue  # not served here (ended, its releases not yet given back)
            i, rx = by_member[m.mid]
            for c in rx.recv(0):
                assert c.stream_offset == got[i]
                assert PAT.matches((i << 20) + c.stream_offset, c.array), f"conn {i} mixed up"
                got[i] += c.length
                (kept.append(c) if i in hold else c.release())
        for rx in rxs.values():
            assert rx.provider.held <= zq.share(), "a connection held more than its share"
            assert rx.stats.delivered_bytes - rx.stats.released_bytes <= zq.share_bytes()
    else:
        raise AssertionError(f"not done after {rounds} rounds: {got}")
    return got, kept


def test_sixteen_connections_on_one_queue_each_verified(fake, socks):
    total = 200_000
    streams(fake, socks, total)
    with open_zcrx_queue(256 * PAGE_SIZE, copy=True, rq_entries=64) as zq:
        rxs = {i: Receiver(s, zq.join(s.fileno()), max_held=1.0) for i, s in enumerate(socks)}
        assert zq.share() == 16 and len(fake.rings) == 1  # one ifq, one ring for all
        got, _ = serve(zq, rxs)
        assert got == dict.fromkeys(rxs, total)
        # Capped receives: each connection's receive ended at its cap and was armed again.
        assert all(rx.provider.cap_stops > 0 for rx in rxs.values())
        assert all(rx.stats.rearms >= rx.provider.cap_stops for rx in rxs.values())
        assert {rx.provider.ud >> zcrx_queue.MEMBER_BITS for rx in rxs.values()} == set(range(16))
        for rx in rxs.values():
            rx.close()
        assert zq.rq.produced == sum(rx.stats.delivered for rx in rxs.values())  # all back
    assert fake.ring.closed and fake.ring.free_count == 256


def test_a_connection_that_keeps_its_chunks_stalls_alone(fake, socks):
    total = 120_000
    streams(fake, socks[:4], total)
    with open_zcrx_queue(64 * PAGE_SIZE, copy=True, rq_entries=16) as zq:
        rxs = {i: Receiver(s, zq.join(s.fileno()), max_held=1.0)
               for i, s in enumerate(socks[:4])}
        got, kept = serve(zq, rxs, hold=frozenset({0}))
        assert got[1] == got[2] == got[3] == total  # the others finished
        hog = rxs[0]
        assert hog.recv(0) == [] and hog.stalled == "exhausted" and not hog.eof
        # Its receives' caps stopped it at its share of buffers exactly (the kernel caps
        # bytes: zcnet turns buffers into bytes by what the kernel put in each so far).
        assert hog.provider.held == zq.share() == len(kept) == 16
        assert hog.stats.delivered_bytes - hog.stats.released_bytes == got[0]
        assert got[0] <= zq.share_bytes()
        # Given back, it goes on to the end.
        hog.release_many(kept)
        got, _ = serve(zq, {0: hog})
        assert got[0] == total
        for rx in rxs.values():
            rx.close()


def test_closing_one_connection_leaves_the_others_streaming(fake, socks):
    total = 150_000
    streams(fake, socks[:3], total)
    with open_zcrx_queue(48 * PAGE_SIZE, copy=True, rq_entries=16) as zq:
        rxs = {i: Receiver(s, zq.join(s.fileno()), max_held=1.0)
               for i, s in enumerate(socks[:3])}
        early = []
        while not early:
            for m in zq.ready(0):
                if m is rxs[0].provider:
                    early = rxs[0].recv(0)
                else:
                    for rx in rxs.values():
                        if rx.provider is m:
                            rx.release_many(rx.recv(0))
        gone = rxs.pop(0)
        gone.close()  # holding `early`: its chunks stay readable
        assert len(zq.members) == 2 and zq.share() == 24
        got, _ = serve(zq, rxs)
        assert got == {1: total, 2: total}
        assert all(PAT.matches(c.stream_offset, c.array) for c in early)  # still readable
        gone.release_many(early)  # after close: back through the queue at its next enter
        zq.ready(0)
        assert not zq.mem.closed_tokens
        for rx in rxs.values():
            rx.close()
    assert fake.ring.free_count == 48, "a buffer never came back to the kernel"


def test_closing_the_queue_ends_every_open_connection_clearly(fake, socks):
    streams(fake, socks[:2], 1 << 20)
    zq = open_zcrx_queue(32 * PAGE_SIZE, copy=True, rq_entries=16)
    rxs = [Receiver(s, zq.join(s.fileno()), max_held=1.0) for s in socks[:2]]
    held = []
    while not held:
        zq.ready(0)
        held = rxs[0].recv(0)
    data = bytes(held[0].data)
    assert zq.close() and fake.ring.closed
    for rx in rxs:
        with pytest.raises(ClosedError) as ei:
            while True:
                rx.release_many(rx.recv(0))
        assert ei.value.message.endswith("the zcrx queue copy mode was closed with this "
                                         "connection open")
    assert bytes(held[0].data) == data  # still mapped while held
    for rx in rxs:
        rx.release_many(held if rx is rxs[0] else [])
        rx.close()
    assert zq.area.closed


def test_second_open_on_a_device_queue_joins_it_and_caps_the_first(fake, socks):
    a, b = socks[:2]
    fake.streams[a.fileno()] = Stream(b"a" * 50_000, segment=4096)
    fake.streams[b.fileno()] = Stream(b"b" * 50_000, segment=4096)
    first = open_zcrx(a.fileno(), 256 * PAGE_SIZE, ifname="lo", queue=0)
    ra = Receiver(a, first)
    ra.recv(0)  # armed with no cap: it has the queue to itself
    assert first.armed and first.cap == 0
    second = open_zcrx(b.fileno(), 1 << 20, ifname="lo", queue=0)  # no EEXIST: joined
    rb = Receiver(b, second)
    assert second.zq is first.zq and len(fake.rings) == 1 and second.area is first.area
    assert "shared by 2 connections" in second.note
    # The uncapped receive was cancelled so that it comes back capped to its share.
    for _ in range(5):
        ra.release_many(ra.recv(0))
        rb.release_many(rb.recv(0))
    assert first.cap and first.cap <= first.zq.share() * PAGE_SIZE
    ra.close()
    assert not fake.ring.closed  # the other connection still receives
    rb.close()
    assert fake.ring.closed


def test_a_full_queue_refuses_one_more_connection_and_says_how_to_fix_it(fake, socks):
    with open_zcrx_queue(32 * PAGE_SIZE, copy=True) as zq:
        zq.join(socks[0].fileno()).close()
        members = [zq.join(s.fileno()) for s in socks[:2]]
        with pytest.raises(UsageError) as ei:
            zq.join(socks[2].fileno())
        assert ei.value.message == ("copy mode: its 128 KiB zcrx area gives 3 connections "
                                    "fewer than 16 buffers of 4096 bytes each")
        assert ei.value.hint == ("open the queue with a larger area_size, or serve fewer "
                                 "connections on it")
        for m in members:
            m.close()
            m.area_done(m.area)


def test_another_thread_is_refused_with_the_reason(fake, socks):
    zq = open_zcrx_queue(32 * PAGE_SIZE, ifname="lo", queue=0)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            zq.join(socks[0].fileno())
        except ZcnetError as e:
            errors.append(e)
        try:  # its own registration of the same queue: the kernel's EEXIST, explained
            open_zcrx(socks[1].fileno(), 32 * PAGE_SIZE, ifname="lo", queue=0)
        except ZcnetError as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    zq.close()
    assert [type(e) for e in errors] == [ZcnetError, ZcnetError]
    assert errors[0].message == ("join() on lo queue 0's zcrx queue from a thread that did not "
                                 "open it (its ring is single-issuer)")
    assert errors[1].message.startswith("lo queue 0 is already received by another thread of "
                                        "this process")
    assert errors[1].__cause__.__cause__.errno == errno.EEXIST  # the kernel's, explained


def test_a_reached_cap_is_a_rearm_and_eof_still_ends(fake, socks):
    s = socks[0]
    fake.streams[s.fileno()] = Stream(PAT.expected(0, 100_000).tobytes(), segment=4096, end=0)
    with open_zcrx_queue(16 * PAGE_SIZE, copy=True) as zq:
        rx = Receiver(s, zq.join(s.fileno()), max_held=1.0)
        got = 0
        for _ in range(1000):
            if rx.eof:
                break
            zq.ready(0)
            for c in rx.recv(0):
                assert PAT.matches(c.stream_offset, c.array)
                got += c.length
                c.release()
        assert rx.eof and got == 100_000
        # 16 buffers of share: the first cap guesses a quarter buffer each (16 KiB), then the
        # 4096 bytes seen per buffer give 64 KiB; EOF comes during the third receive.
        assert rx.provider.cap_stops == 2 and rx.stats.rearms == 2
        rx.close()


def test_peer_error_ends_only_its_connection(fake, socks):
    streams(fake, socks[:3], 60_000)
    fake.streams[socks[1].fileno()].end = -errno.ECONNRESET
    with open_zcrx_queue(48 * PAGE_SIZE, copy=True, rq_entries=16) as zq:
        rxs = {i: Receiver(s, zq.join(s.fileno()), max_held=1.0)
               for i, s in enumerate(socks[:3])}
        by_member = {rx.provider.mid: i for i, rx in rxs.items()}
        got = dict.fromkeys(rxs, 0)
        reset = False
        for _ in range(5000):
            if rxs[0].eof and rxs[2].eof and reset:
                break
            for m in zq.ready(0):
                i = by_member[m.mid]
                try:
                    cs = rxs[i].recv(0)
                except ConnectionResetError:
                    reset = i == 1
                    continue
                got[i] += sum(c.length for c in cs)
                rxs[i].release_many(cs)
        assert reset and got == {0: 60_000, 1: 60_000, 2: 60_000}
        for rx in rxs.values():
            rx.close()


def test_kernel_copy_per_connection_is_known_only_where_it_can_be(fake, socks):
    streams(fake, socks[:2], 20_000)
    with open_zcrx_queue(32 * PAGE_SIZE, copy=True) as zq:
        rxs = {i: Receiver(s, zq.join(s.fileno()), max_held=1.0)
               for i, s in enumerate(socks[:2])}
        serve(zq, rxs)
        d = rxs[0].stats_dict()
        assert d["kernel_copied_bytes"] == 20_000 and d["zero_copy_share"] == 0.0
        assert d["kernel_copied_source"] == "zcrx copy mode: the kernel copies every byte"
        assert np.int64(d["zcrx_members"]) == 2
        for rx in rxs.values():
            rx.close()


def test_another_thread_needs_import_and_a_kernel_without_it_says_so(fake, socks):
    """Export on a kernel without ZCRX_REG_IMPORT (this host's answers: nothing offered) is
    refused naming the kernel needed; an export is refused outside the queue's thread."""
    with open_zcrx_queue(32 * PAGE_SIZE, copy=True) as zq:
        with pytest.raises(Unsupported) as ei:
            zcrx_export.export_queue(zq, Offers())
        assert ei.value.message == (
            "receiving copy mode in another thread needs ZCRX_CTRL_EXPORT and ZCRX_REG_IMPORT "
            f"(Linux 6.19+; this is {platform.release()})")
        assert ei.value.hint == "receive every connection of the queue in the thread that opened it"
        errors: list[BaseException] = []

        def other() -> None:
            try:
                zcrx_export.export_queue(zq, COPY_OFFERS)
            except UsageError as e:
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert errors[0].message.startswith("export() of copy mode's zcrx queue from a thread")


def test_device_reserve_and_the_registry_per_thread():
    """A device queue keeps its RX ring and the page pool's cache out of the shares (lo has no
    ethtool rings: the cache only); each thread sees its own queues, and which thread
    registered a device queue is known to every thread."""
    assert zcrx_ifq.device_reserve("lo") == zcrx_ifq.PP_ALLOC_CACHE_SIZE == 128
    reg: zcrx_ifq.QueueRegistry[str] = zcrx_ifq.QueueRegistry()
    key = zcrx_ifq.queue_key(1, 0)
    reg.add(key, "mine", own=True)
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.extend((reg.mine().get(key), reg.owners.get(key))))
    t.start()
    t.join()
    assert seen == [None, threading.get_ident()]
    reg.remove(key, "other")  # not this thread's queue for key: nothing changes
    assert reg.mine() == {key: "mine"}
    reg.remove(key, "mine")
    assert reg.mine() == {} and reg.owners == {}
    assert zcrx_ifq.queue_key(0, 5) == (0,)  # copy mode: no device, no namespace


def test_a_connection_from_another_queue_is_refused_before_its_first_arm(fake, socks,
                                                                         monkeypatch):
    """Where the socket's queue is known (its NAPI id) and is not the queue's, the join is a
    WrongQueue naming both and the fix; nothing of it stays in the queue. Unknown (no NAPI id
    yet): joined, as the kernel alone can tell then."""
    arrived = {socks[0].fileno(): ("lo", 3)}

    def find_queue(fd: int) -> tuple[str, int]:
        if fd not in arrived:
            raise Unsupported("the socket has no NAPI id")
        return arrived[fd]

    monkeypatch.setattr(zcrx, "find_queue", find_queue)
    with open_zcrx_queue(256 * PAGE_SIZE, ifname="lo", queue=0) as zq:
        with pytest.raises(zcrx.WrongQueue) as ei:
            zq.join(socks[0].fileno())
        assert ei.value.message == (f"the connection on fd {socks[0].fileno()} arrived on lo "
                                    "queue 3, not on lo queue 0, whose zcrx queue it joined")
        assert ei.value.hint == ("steer its port to lo queue 0 (`zcnet nic setup lo --queues 0 "
                                 "--port PORT`), or join the zcrx queue of lo queue 3")
        assert (ei.value.ifname, ei.value.queue) == ("lo", 3)
        assert not zq.members and zq.mem.members == 0
        arrived[socks[1].fileno()] = ("lo", 0)
        ok, unknown = zq.join(socks[1].fileno()), zq.join(socks[2].fileno())
        assert zq.mem.members == 2
        for m in (ok, unknown):
            m.close()
            m.area_done(m.area)
