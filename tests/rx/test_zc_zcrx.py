"""zcrx provider: registration against this kernel up to the device check, error translation,
CQE32 parsing, and the real ZcrxProvider (arm, reap, recycle, close, refill-ring mapping, queue
discovery) against a faithfully faked kernel side (tests/fake_zcrx_kernel.py). The same provider
runs against a real 7.x kernel in copy mode in test_zcrx_vm."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct

import numpy as np
import pytest

from fake_zcrx_kernel import KERNEL_LAYOUTS, FakeKernel, Stream
from zc_helpers import PAT, open_asking_for_hugetlb
from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError
from zcnet.rx.zc import Receiver, netqueue, open_receiver, zcrx, zcrx_queue, zcrx_reg, zcrx_rings
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.zcrx import RING_FLAGS, open_zcrx, parse_completions
from zcnet.rx.zc.zcrx_reg import (
    Offers,
    Registration,
    StatsLayout,
    explain,
    kernel_offers,
    memlock_error,
    refill_region_size,
    register_ifq,
)
from zcnet.uapi import io_uring as u
from zcnet.uapi import netdev as nd
from zcnet.uring.ring import Completions, Ring
from zcnet.uring.syscall import io_uring_register

AREA_ID = 3  # a non-zero area id, so a lost token would show
TOKEN = AREA_ID << u.IORING_ZCRX_AREA_SHIFT


# --- registration against the real kernel ----------------------------------------------------

@pytest.fixture
def lab(no_leaks):
    from zcnet.lab import Lab
    from zcnet.netns import in_netns

    with Lab() as lab, in_netns(lab.ns_a):
        yield lab


@pytest.mark.root
@pytest.mark.parametrize("user_region", [True, False], ids=["user-region", "kernel-region"])
def test_veth_registration_reaches_device_check(lab, user_region):
    with pytest.raises(Unsupported, match="lacks queue management ops or header-data split") as ei:
        open_zcrx(-1, 1 << 20, ifname=lab.if_a, queue=0, user_region=user_region)
    assert ei.value.errno == errno.EOPNOTSUPP  # type: ignore[attr-defined]
    if not kernel_offers().copy_mode:  # 6.18: nothing to fall back to, and the message says so
        assert "no zcrx copy mode to fall back to" in ei.value.message


def _register(area: Area, ifindex: int, ring_flags: int, mutate=None, ifname="?") -> None:
    reg = Registration.build(area, ifindex, 0, 64)
    if mutate:
        mutate(reg)
    ring = Ring(8, flags=ring_flags)
    try:
        register_ifq(ring, reg, ifname=ifname)
    finally:
        ring.close()
        reg.release()


MALFORMED = {
    "ifq-flags": lambda r: setattr(r.ifq, "flags", 1),
    "ifq-reserved": lambda r: r.ifq.__resv.__setitem__(0, 1),
    "zcrx-id-set": lambda r: setattr(r.ifq, "zcrx_id", 7),
    "zero-entries": lambda r: setattr(r.ifq, "rq_entries", 0),
    "region-reserved": lambda r: r.region.__resv.__setitem__(1, 1),
}


@pytest.mark.root
@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_registration_is_einval(lab, name):
    with Area(1 << 20) as area, pytest.raises(ZcnetError, match="invalid") as ei:
        _register(area, socket.if_nametoindex(lab.if_a), RING_FLAGS, MALFORMED[name],
                  lab.if_a)
    assert ei.value.errno == errno.EINVAL  # type: ignore[attr-defined]


@pytest.mark.root
@pytest.mark.parametrize("drop", [u.IORING_SETUP_DEFER_TASKRUN, u.IORING_SETUP_CQE32],
                         ids=["no-defer-taskrun", "no-cqe32"])
def test_ring_without_required_flags_is_einval(lab, drop):
    flags = RING_FLAGS & ~drop
    with Area(1 << 20) as area, pytest.raises(ZcnetError) as ei:
        _register(area, socket.if_nametoindex(lab.if_a), flags)
    assert ei.value.errno == errno.EINVAL  # type: ignore[attr-defined]


@pytest.mark.root
def test_unknown_ifindex_is_enodev(lab):
    with Area(1 << 20) as area, pytest.raises(UsageError, match="no interface with index") as ei:
        _register(area, 0x7FFFFFF0, RING_FLAGS)
    assert ei.value.errno == errno.ENODEV  # type: ignore[attr-defined]


def test_registration_structs_match_what_the_kernel_reads():
    with Area(1 << 20) as area:
        reg = Registration.build(area, 5, 2, 100)
        try:
            assert reg.ifq.rq_entries == 128  # rounded up to a power of two, as the kernel does
            assert reg.ifq.area_ptr == ctypes.addressof(reg.area)
            assert reg.ifq.region_ptr == ctypes.addressof(reg.region)
            assert (reg.ifq.if_idx, reg.ifq.if_rxq) == (5, 2)
            assert reg.area.addr == area.addr and reg.area.len == area.size
            assert reg.area.addr % PAGE_SIZE == 0 and reg.area.len % PAGE_SIZE == 0
            assert reg.region.flags == u.IORING_MEM_REGION_TYPE_USER
            assert reg.region.size == refill_region_size(128) >= 128 * 16 + PAGE_SIZE
            assert reg.region.user_addr % PAGE_SIZE == 0
        finally:
            reg.release()


def test_bad_queue_and_entries_rejected_before_the_kernel():
    with Area(1 << 20) as area:
        with pytest.raises(UsageError):
            Registration.build(area, 1, -1, 64)
        with pytest.raises(UsageError):
            Registration.build(area, 1, 0, 65536)


# --- error translation ---------------------------------------------------------------------

def _explained(err: int) -> ZcnetError:
    return explain(OSError(err, "x"), ifname="eth9", ifindex=9, queue=3, locked=1 << 20)


def test_eexist_is_explained():
    e = _explained(errno.EEXIST)
    assert e.message.startswith("queue 3 of eth9 already has a memory provider: a zcrx or "
                                "devmem binding of another process or program")
    assert e.hint and "close the earlier receiver" in e.hint


@pytest.mark.parametrize("err,text", [
    (errno.EOPNOTSUPP, "lacks queue management ops or header-data split"),
    (errno.ERANGE, "has no rx queue 3"),
    (errno.EPERM, "CAP_NET_ADMIN"),
    (errno.EBUSY, "AF_XDP"),
    (errno.EINVAL, "tcp-data-split"),
])
def test_each_errno_names_the_problem(err, text):
    e = _explained(err)
    assert text in e.message and e.errno == err  # type: ignore[attr-defined]


def test_memlock_error_names_limit_and_size():
    e = memlock_error(10 << 20, limit=8 << 20, privileged=False)
    assert e is not None
    assert f"RLIMIT_MEMLOCK is {8 << 20} bytes" in e.message and str(10 << 20) in e.message
    assert e.hint and "10240 KiB" in e.hint
    assert memlock_error(10 << 20, limit=8 << 20, privileged=True) is None
    assert memlock_error(1 << 20, limit=8 << 20, privileged=False) is None


# --- CQE32 memory as the kernel writes it ------------------------------------------------------

# io_uring_cqe {user_data, res, flags} followed by io_uring_zcrx_cqe {off, __pad}
CQE32 = struct.Struct("<QiIQQ")
assert CQE32.size == ctypes.sizeof(u.io_uring_cqe) + ctypes.sizeof(u.io_uring_zcrx_cqe) == 32


def kernel_cqes(entries: list[tuple[int, int, int, int]]) -> Completions:
    """CQE32 slots written byte for byte as io_zcrx_queue_cqe does, read back through the
    same uint64/int32/uint32 views the ring uses."""
    mem = np.zeros(len(entries) * 32, dtype=np.uint8)
    for i, (ud, res, flags, off) in enumerate(entries):
        CQE32.pack_into(mem, i * 32, ud, res, flags, off, 0)
    u64 = mem.view(np.uint64).reshape(-1, 4)
    u32 = mem.view(np.uint32).reshape(-1, 8)
    return Completions(user_data=u64[:, 0].copy(), res=u32.view(np.int32)[:, 2].copy(),
                       flags=u32[:, 3].copy(), extra=u64[:, 2:4].copy())


MORE = u.IORING_CQE_F_MORE


def test_cqe32_data_offsets_lengths_tokens_other_requests_ignored():
    # CQEs of other requests carry data too, and the last one ends (no F_MORE): none is ours.
    c = kernel_cqes([(1, 4096, MORE, TOKEN | 0), (99, 4096, MORE, TOKEN | 4096),
                     (1, 1000, MORE, TOKEN | 8192 + 96), (98, 512, MORE, TOKEN | 16384),
                     (1, 1448, MORE, TOKEN | 12288), (99, 700, 0, TOKEN | 20480)])
    d = parse_completions(c)
    assert d.offsets == [0, 8192 + 96, 12288]
    assert d.lengths == [4096, 1000, 1448]
    assert d.tokens == [TOKEN, TOKEN | 8288, TOKEN | 12288]
    assert d.end is None and d.stopped is None


def test_a_round_of_only_our_data_parses_to_arrays():
    """The common round (every CQE ours, F_MORE on the last) takes the vectorized path: arrays,
    no Python object per buffer, the same values as the filtering path gives."""
    cqes = [(1, 4096 - i, MORE, TOKEN | i * 4096) for i in range(40)]
    d = parse_completions(kernel_cqes(cqes))
    assert all(type(x) is np.ndarray for x in (d.offsets, d.lengths, d.tokens))
    assert d.offsets.tolist() == [i * 4096 for i in range(40)]
    assert d.lengths.tolist() == [4096 - i for i in range(40)]
    assert d.tokens.tolist() == [TOKEN | i * 4096 for i in range(40)]
    assert d.end is None and d.stopped is None


@pytest.mark.parametrize("kind", [list, np.array])
def test_refill_ring_push_wraps_holds_and_keeps_order(kind):
    """Entries go in ring order across the end of the ring; what does not fit is held and
    sent first next time, for lists (the iterator) and arrays (batches) alike."""
    entries, rqes = 8, 128
    mem = np.zeros(rqes + entries * 16, dtype=np.uint8)
    rq = zcrx.RefillRing(mem, 0, 64, rqes, entries, TOKEN)
    khead = mem[0:4].view(np.uint32)
    rqe = mem[rqes:].view(np.uint64).reshape(entries, 2)
    sent: list[int] = []

    def push(offs: list[int]) -> int:
        return rq.push(kind([TOKEN | o for o in offs]), kind([o // 4096 + 1 for o in offs]))

    def kernel_takes(n: int) -> None:
        h = int(khead[0])
        for i in range(h, h + n):
            off, ln = int(rqe[i % entries, 0]), int(rqe[i % entries, 1]) & 0xFFFFFFFF
            assert off >> u.IORING_ZCRX_AREA_SHIFT == AREA_ID
            sent.append(off & zcrx.OFF_MASK)
            assert ln == sent[-1] // 4096 + 1
        khead[0] = h + n

    assert push([i * 4096 for i in range(6)]) == 6
    kernel_takes(4)
    assert push([i * 4096 for i in range(6, 12)]) == 6  # wraps past the ring's end
    assert push([i * 4096 for i in range(12, 15)]) == 0 and rq.held == 3
    kernel_takes(8)
    assert push([15 * 4096]) == 4 and rq.held == 0  # the held ones first
    kernel_takes(4)
    assert sent == [i * 4096 for i in range(16)]
    assert rq.produced == 16 and rq.full_events == 1


@pytest.mark.parametrize("res,end,stopped", [
    (0, 0, None), (-errno.ENOSPC, None, "rearm"), (-errno.ECONNRESET, -errno.ECONNRESET, None),
])
def test_final_cqe(res, end, stopped):
    d = parse_completions(kernel_cqes([(1, 100, MORE, TOKEN | 4096), (1, res, 0, 0)]))
    assert d.lengths == [100] and (d.end, d.stopped) == (end, stopped)


# --- the real provider against the faked kernel side ------------------------------------------

COPY_OFFERS = Offers(u.ZCRX_REG_IMPORT | u.ZCRX_REG_NODEV, u.ZCRX_FEATURE_RX_PAGE_SIZE, 3)


@pytest.fixture
def fake(monkeypatch, no_leaks):
    """A FakeKernel under the real provider (its Ring and the query); fails the test on any
    refill entry the kernel would reject."""
    k = FakeKernel()
    monkeypatch.setattr(zcrx_rings, "Ring", k.ring_class())  # queue_ring makes it
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: COPY_OFFERS)
    # A 7.x kernel's zcrx_stats layout, unless the test takes the stats away (k.stats False).
    monkeypatch.setattr(zcrx_queue, "kernel_stats_layout",
                        lambda: StatsLayout(16, 8) if k.stats else None)
    yield k
    k.stream = None  # the test's payload: freed before no_leaks counts anonymous memory
    assert not k.rejections, k.rejections


@pytest.fixture
def sock():
    a, b = socket.socketpair()
    yield a
    a.close()
    b.close()


def drain(rx: Receiver, *, hold: int = 0) -> list[tuple[int, bytes]]:
    """Receive to the end: (stream_offset, bytes) of each chunk; every ``hold``-th chunk is
    kept one round before release. Bounded: a stalled provider fails instead of hanging."""
    got: list[tuple[int, bytes]] = []
    kept: list = []
    idle = 0
    while not rx.eof:
        chunks = rx.recv(timeout=0.01)
        idle = 0 if chunks else idle + 1
        assert idle < 20, f"receiver stalled ({rx.stalled}) after {len(got)} chunks"
        rx.release_many(kept)
        kept = []
        for i, c in enumerate(chunks):
            got.append((c.stream_offset, bytes(c.data)))
            (kept.append(c) if hold and i % hold == 0 else c.release())
    rx.release_many(kept)
    rx.flush()
    return got


def assert_stream(got: list[tuple[int, bytes]], total: int) -> None:
    pos = 0
    for off, data in got:
        assert off == pos, f"chunk at stream offset {off}, expected {pos}"
        assert PAT.matches(off, np.frombuffer(data, np.uint8)), f"wrong bytes at {off}"
        pos += len(data)
    assert pos == total


MODES = {  # name: (open_zcrx keywords, area id the kernel hands out)
    "copy": ({"copy": True}, 0),
    "copy-kernel-region": ({"copy": True, "user_region": False}, 0),
    "device": ({"ifname": "lo", "queue": 0}, 0),
    "device-area-3": ({"ifname": "lo", "queue": 0}, 3),
}


@pytest.mark.parametrize("kernel", list(KERNEL_LAYOUTS))
@pytest.mark.parametrize("mode", list(MODES))
def test_provider_stream_through_a_small_area_and_ring(fake, sock, mode, kernel):
    """3 MiB through 16 buffers and an 8-entry refill ring: every buffer goes back with its
    token and length, the ring wraps hundreds of times, every byte lands in stream order; with
    each refill ring layout a real kernel returned."""
    kw, fake.area_id = MODES[mode]
    fake.layout = KERNEL_LAYOUTS[kernel]
    total = 3 << 20
    fake.stream = Stream(PAT.expected(0, total).tobytes(), segment=1000, per_wait=40, end=0)
    fake.foreign_every = 5
    prov = open_zcrx(sock.fileno(), 16 * PAGE_SIZE, rq_entries=8, **kw)
    ring = fake.ring
    assert prov.offsets == fake.layout and prov.mode == ("copy" if "copy" in mode else "device")
    with Receiver(sock, prov, max_held=1.0) as rx:
        got = drain(rx, hold=3)
        assert_stream(got, total)
        assert rx.stats.in_flight == 0
        if prov.copy:
            assert ring.flushes > 0 and prov.rq.held == 0
        while not prov.copy and (prov.rq.held or prov.rq.kernel_head() != prov.rq.tail):
            ring._consume_refill()  # the NAPI refills that follow the last releases
            rx.flush()
        assert prov.rq.produced == len(got) >= 100 * prov.rq.entries
    assert ring.free_count == 16, "buffers never came back to the kernel"
    assert ring.closed


def test_copy_mode_flushes_every_refill_write(fake, sock):
    fake.stream = Stream(PAT.expected(0, 64 << 10).tobytes(), segment=4096, end=0)
    prov = open_zcrx(sock.fileno(), 32 * PAGE_SIZE, rq_entries=4, copy=True)
    with Receiver(sock, prov, max_held=1.0) as rx:
        chunks = rx.recv(timeout=0)
        assert len(chunks) == 16 and fake.ring.free_count == 16
        rx.release_many(chunks)
        rx.flush()  # 16 returns through a 4-entry ring: write, flush, write ... nothing held
        assert prov.rq.held == 0 and fake.ring.flushes == 4 and fake.ring.free_count == 32
        assert prov.rq.kernel_head() == prov.rq.tail == 16


def test_exhausted_area_ends_multishot_and_rearms(fake, sock):
    fake.stream = Stream(PAT.expected(0, 40 * 4096).tobytes(), segment=4096, end=0)
    prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=True)
    with Receiver(sock, prov, max_held=1.0) as rx:
        held = rx.recv(timeout=0)
        assert len(held) == 4 and not rx.recv(timeout=0.01)
        assert rx.stalled == "exhausted" and not rx.core.armed and not prov.can_arm()
        got = [(c.stream_offset, bytes(c.data)) for c in held]
        rx.release_many(held)
        got += drain(rx)
        assert_stream(got, 40 * 4096)
        assert rx.stats.rearms >= 1 and rx.stats.exhausted >= 1


def test_cq_overflow_rearms_without_losing_data(fake, sock):
    fake.stream = Stream(PAT.expected(0, 8192).tobytes(), segment=4096, per_wait=1, end=0)
    prov = open_zcrx(sock.fileno(), 8 * PAGE_SIZE, copy=True)
    with Receiver(sock, prov) as rx:
        first = rx.recv(timeout=0)
        got = [(c.stream_offset, bytes(c.data)) for c in first]
        rx.release_many(first)
        fake.ring.cq.append((zcrx.RECV_UD, -errno.ENOSPC, 0, 0))
        fake.ring.armed = None
        assert rx.recv(timeout=0) == [] and not rx.core.armed and prov.can_arm()
        assert_stream(got + drain(rx), 8192)
        assert rx.stats.rearms == 1  # after the overflow; the EOF's final CQE ends the stream


def test_close_cancels_the_armed_multishot(fake, sock):
    fake.stream = Stream(PAT.expected(0, 8192).tobytes(), segment=4096)  # no end: stays armed
    prov = open_zcrx(sock.fileno(), 8 * PAGE_SIZE, copy=True)
    rx = Receiver(sock, prov)
    held = rx.recv(timeout=0)
    ring = fake.ring
    assert rx.core.armed and ring.armed == zcrx.RECV_UD and ring.sock_fd == sock.fileno()
    rx.close()
    assert ring.armed is None and ring.closed and not rx.core.armed
    assert not rx.area.closed  # chunks still held
    rx.release_many(held)
    assert rx.area.closed


def test_peer_error_after_data_is_raised_once(fake, sock):
    fake.stream = Stream(PAT.expected(0, 10000).tobytes(), end=-errno.ECONNRESET)
    prov = open_zcrx(sock.fileno(), 8 * PAGE_SIZE, copy=True)
    with Receiver(sock, prov) as rx:
        got = []
        with pytest.raises(ConnectionResetError):
            while True:
                for c in rx.recv(timeout=0):
                    got.append((c.stream_offset, bytes(c.data)))
                    c.release()
        assert_stream(got, 10000)


def test_rx_buf_len_device_buffers(fake, sock):
    fake.stream = Stream(PAT.expected(0, 64 << 10).tobytes(), segment=16384, end=0)
    prov = open_zcrx(sock.fileno(), 8 * 16384, ifname="lo", queue=0, rx_buf_len=16384)
    assert prov.buf_len == 16384 and "16384 bytes" in prov.note
    with Receiver(sock, prov) as rx:
        chunks = rx.recv(timeout=0)
        assert [c.offset for c in chunks] == [16384 * i for i in (7, 6, 5, 4)]
        got = [(c.stream_offset, bytes(c.data)) for c in chunks]
        rx.release_many(chunks)
        assert_stream(got + drain(rx), 64 << 10)


@pytest.mark.parametrize("rx_buf_len,copy,err,text", [
    (3 * PAGE_SIZE, None, UsageError, "power of two"),
    (PAGE_SIZE // 2, None, UsageError, "power of two"),
    (2 * PAGE_SIZE, True, Unsupported, "copy mode fills"),
])
def test_rx_buf_len_refused_before_the_kernel(fake, sock, rx_buf_len, copy, err, text):
    with pytest.raises(err, match=text):
        open_zcrx(sock.fileno(), 1 << 20, ifname="lo", queue=0, rx_buf_len=rx_buf_len,
                  copy=copy)
    assert not fake.rings


def test_rx_buf_len_needs_the_feature(monkeypatch, sock):
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: Offers())
    with pytest.raises(Unsupported, match="no rx_buf_len"):
        open_zcrx(sock.fileno(), 1 << 20, ifname="lo", queue=0, rx_buf_len=2 * PAGE_SIZE)


class FakeGenl:
    """The netdev family as a NIC whose NAPI 42 serves rx queue 3 and tx queue 7, listed as
    the kernel dumps them (rx queues first, then tx)."""

    def __enter__(self) -> FakeGenl:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def do(self, family, cmd, spec, attrs, what=""):
        assert cmd == nd.NETDEV_CMD_NAPI_GET and attrs == {"id": 42}
        return {"id": 42, "ifindex": socket.if_nametoindex("lo")}

    def dump(self, family, cmd, spec, attrs, what=""):
        assert cmd == nd.NETDEV_CMD_QUEUE_GET
        rx, tx = nd.NETDEV_QUEUE_TYPE_RX, nd.NETDEV_QUEUE_TYPE_TX
        return [{"id": 0, "type": rx, "napi-id": 40}, {"id": 3, "type": rx, "napi-id": 42},
                {"id": 0, "type": tx, "napi-id": 40}, {"id": 7, "type": tx, "napi-id": 42}]


def test_queue_discovery_registers_the_rx_queue_of_the_socket_napi(fake, sock, monkeypatch):
    from zcnet.nic import genl

    monkeypatch.setattr(netqueue, "incoming_napi_id", lambda fd: 42)
    monkeypatch.setattr(genl, "GenlSocket", FakeGenl)
    prov = open_zcrx(sock.fileno(), 1 << 20, copy=False)
    try:
        assert (prov.ifname, prov.queue) == ("lo", 3) and prov.mode == "device"
        assert prov.reg.ifq.if_rxq == 3 and prov.reg.ifq.flags == 0
    finally:
        prov.close()
        prov.area.close()


def test_no_napi_id_falls_back_to_copy_mode_and_says_why(fake, tcp_pair):
    sock = tcp_pair[1]  # open_receiver takes TCP sockets only; loopback has no NAPI id
    fake.stream = Stream(b"x" * 100, end=0)
    with open_receiver(sock, "zcrx", area_size=1 << 20) as rx:
        assert rx.provider.mode == "copy" and rx.provider.reg.ifq.flags == u.ZCRX_REG_NODEV
        assert "kernel copies every byte" in rx.why and "no NAPI id" in rx.why
        (c,) = rx.recv(timeout=0)
        assert bytes(c.data) == b"x" * 100
        c.release()


def test_auto_never_takes_copy_mode(fake, tcp_pair):
    sock = tcp_pair[1]  # open_receiver takes TCP sockets only; loopback has no NAPI id
    with open_receiver(sock, "auto", area_size=1 << 20) as rx:
        assert rx.name == "soft" and "no NAPI id" in rx.why
    assert not fake.rings


@pytest.mark.parametrize("kernel", list(KERNEL_LAYOUTS))
@pytest.mark.parametrize("bad", ["area-id", "offset", "length", "pad", "not-held", "overfull"])
def test_fake_kernel_rejects_what_the_kernel_would(fake, sock, bad, kernel):
    """The fake's checks are live: each hand-written bad entry is caught (the provider-driven
    tests above assert that the provider never writes one)."""
    fake.stream = Stream(PAT.expected(0, 8192).tobytes(), segment=4096)
    fake.layout = KERNEL_LAYOUTS[kernel]
    _, tail, rqes = fake.layout
    prov = open_zcrx(sock.fileno(), 8 * PAGE_SIZE, rq_entries=4, copy=True)
    try:
        prov.arm()
        d = prov.reap(0)
        ring = fake.ring
        tok, ln = d.tokens[0], d.lengths[0]
        entry = {"area-id": (tok | 1 << u.IORING_ZCRX_AREA_SHIFT, ln, 0),
                 "offset": (8 * PAGE_SIZE, ln, 0), "length": (tok, ln - 1, 0),
                 "pad": (tok, ln, 1), "not-held": (tok ^ PAGE_SIZE * 5, ln, 0),
                 "overfull": (tok, ln, 0)}[bad]
        n = 5 if bad == "overfull" else 1
        for i in range(n):
            struct.pack_into("<QII", ring.region, rqes + (i % 4) * 16, *entry)
        struct.pack_into("<I", ring.region, tail, n)
        ring.register(u.IORING_REGISTER_ZCRX_CTRL, prov.zq.flush_ctrl, 0)
        assert len(fake.rejections) >= 1
        fake.rejections.clear()
    finally:
        prov.close()
        prov.area.close()


# --- the query and the refusal on this kernel ---------------------------------------------------

def test_query_opcodes_from_this_kernel():
    """IORING_REGISTER_QUERY as zcnet lays it out: the opcode query answers (6.18+)."""
    q = (ctypes.c_uint8 * 48)()
    hdr = u.io_uring_query_hdr(query_data=ctypes.addressof(q), query_op=u.IO_URING_QUERY_OPCODES,
                               size=48)
    try:
        io_uring_register(-1, u.IORING_REGISTER_QUERY, hdr, 0)
    except OSError as e:
        pytest.skip(f"this kernel has no IORING_REGISTER_QUERY ({e.strerror})")
    assert hdr.result == 0 and hdr.size == 48
    nr_request_opcodes = int.from_bytes(bytes(q[:4]), "little")
    assert nr_request_opcodes > u.IORING_OP_RECV_ZC


@pytest.mark.root
def test_without_copy_mode_zcrx_refuses_clearly(no_leaks, tcp_pair):
    if kernel_offers().copy_mode:
        pytest.skip("this kernel has zcrx copy mode (test_zcrx_vm covers it)")
    _, server = tcp_pair
    with pytest.raises(Unsupported, match="no NAPI id"):
        open_receiver(server, "zcrx", area_size=1 << 20)

# --- RLIMIT_MEMLOCK against the real kernel ---------------------------------------------------

MEMLOCK_CHILD = r'''
import ctypes, resource, socket
libc = ctypes.CDLL(None, use_errno=True)
class Hdr(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))
class Data(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32))
hdr, data = Hdr(0x20080522, 0), (Data * 2)()          # _LINUX_CAPABILITY_VERSION_3
assert libc.syscall(125, ctypes.byref(hdr), data) == 0  # capget
data[0].effective &= ~(1 << 14)                        # drop CAP_IPC_LOCK: limits apply
assert libc.syscall(126, ctypes.byref(hdr), data) == 0  # capset
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
from zcnet.errors import ZcnetError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.zcrx import RING_FLAGS, Registration, open_zcrx, register_ifq
from zcnet.uring.ring import Ring
try:
    open_zcrx(-1, 1 << 20, ifname="lo", queue=0)
except ZcnetError as e:
    print("preflight", e.message)
area = Area(1 << 20)
reg = Registration.build(area, socket.if_nametoindex("lo"), 0, 32768)
ring = Ring(8, flags=RING_FLAGS)
try:
    register_ifq(ring, reg, ifname="lo")  # the kernel accounts the refill region: ENOMEM
except ZcnetError as e:
    print("kernel", e.errno, e.message)
'''


@pytest.mark.root
def test_memlock_limit_names_limit_and_size(no_leaks):
    """Without CAP_IPC_LOCK and with a 64 KiB limit: our check refuses before registering, and
    the kernel's own ENOMEM (refill region accounting) is translated the same way."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MEMLOCK_CHILD], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    pre = next(line for line in out if line.startswith("preflight"))
    kern = next(line for line in out if line.startswith("kernel"))
    assert "RLIMIT_MEMLOCK is 65536 bytes but zcrx must lock" in pre
    assert kern.startswith(f"kernel {errno.ENOMEM} RLIMIT_MEMLOCK is 65536 bytes")
    size = refill_region_size(32768) + (1 << 20)
    assert f"must lock {size} bytes" in kern


def test_permission_hint_is_true_for_the_user_who_reads_it():
    """EPERM at registration: root is told to grant the capability, anyone else to run as root."""
    hint = zcrx_reg.REGISTER_ERRORS[errno.EPERM][2]
    assert "CAP_NET_ADMIN" in hint
    assert ("run as root" in hint) == (os.geteuid() != 0)


# --- behaviour that mutation testing found unchecked (scripts/mutation.sh) ---------------------

def _ring_memory(head: int, tail: int, rqes: int, entries: int, start: int = 0) -> np.ndarray:
    mem = np.zeros(rqes + 16 * entries, dtype=np.uint8)
    mem[head:head + 4].view(np.uint32)[0] = start
    mem[tail:tail + 4].view(np.uint32)[0] = start
    return mem


def _entries(mem: np.ndarray, rqes: int, entries: int) -> list[tuple[int, int, int]]:
    return [struct.unpack_from("<QII", mem, rqes + 16 * i) for i in range(entries)]


def test_refill_ring_fills_holds_and_counts_full_events_at_any_layout():
    """A layout with head, tail and entries all away from 0 (the ring uses what the kernel
    says): 6 buffers into 4 entries write 4 and hold 2; nothing more goes in until the kernel's
    head moves; each push that could not write everything counts one full event."""
    head, tail, rqes = 128, 192, 256
    mem = _ring_memory(head, tail, rqes, 4)
    rq = zcrx.RefillRing(mem, head, tail, rqes, 4, TOKEN)
    offs = [TOKEN | PAGE_SIZE * i for i in range(6)]
    assert rq.push(offs, [100 + i for i in range(6)]) == 4
    assert (rq.held, rq.full_events, rq.space(), rq.tail) == (2, 1, 0, 4)
    assert struct.unpack_from("<I", mem, tail)[0] == 4
    assert _entries(mem, rqes, 4) == [(TOKEN | PAGE_SIZE * i, 100 + i, 0) for i in range(4)]
    assert rq.push([], []) == 0 and (rq.held, rq.full_events) == (2, 2)
    struct.pack_into("<I", mem, head, 3)  # the kernel consumed three entries
    assert rq.kernel_head() == 3 and rq.space() == 3
    assert rq.push([], []) == 2 and (rq.held, rq.full_events, rq.space()) == (0, 2, 1)
    assert _entries(mem, rqes, 4)[:2] == [(TOKEN | PAGE_SIZE * 4, 104, 0),
                                          (TOKEN | PAGE_SIZE * 5, 105, 0)]
    assert rq.push([TOKEN], [7]) == 1 and (rq.full_events, rq.produced) == (2, 7)


def test_refill_ring_wraps_its_u32_indices():
    """Head and tail are free-running u32s: across 2**32 the ring is still full at `entries`."""
    head, tail, rqes = 0, 4, 64
    mem = _ring_memory(head, tail, rqes, 4, start=0xFFFFFFFE)
    rq = zcrx.RefillRing(mem, head, tail, rqes, 4, TOKEN)
    assert rq.push([TOKEN | PAGE_SIZE * i for i in range(5)], [1] * 5) == 4
    assert rq.tail == 2 and struct.unpack_from("<I", mem, tail)[0] == 2
    assert rq.space() == 0 and rq.held == 1
    assert [e[0] for e in _entries(mem, rqes, 4)] == [TOKEN | PAGE_SIZE * i for i in (2, 3, 0, 1)]


def test_refill_ring_entries_must_be_a_power_of_two():
    mem = _ring_memory(0, 4, 64, 8)
    assert zcrx.RefillRing(mem, 0, 4, 64, 1, TOKEN).entries == 1  # 2**0 is one
    with pytest.raises(ValueError, match=r"^refill ring entries must be a power of two$"):
        zcrx.RefillRing(mem, 0, 4, 64, 6, TOKEN)


def test_cqe_of_a_single_byte_is_data_and_cqe16_is_refused():
    d = parse_completions(kernel_cqes([(1, 1, MORE, TOKEN | 4096 + 17)]))
    assert (d.offsets, d.lengths, d.tokens) == ([4096 + 17], [1], [TOKEN | 4113])
    c = kernel_cqes([(1, 1, MORE, 0)])
    with pytest.raises(AssertionError, match=r"^zcrx needs a CQE32 ring$"):
        parse_completions(Completions(c.user_data, c.res, c.flags, None))


def test_other_errno_and_enomem_are_explained(monkeypatch):
    e = explain(OSError(errno.ENOTTY, "not a tty"), ifname="eth9", ifindex=9, queue=3,
                locked=1 << 20)
    assert e.message == "zcrx registration on eth9 queue 3 failed: not a tty"
    assert e.errno == errno.ENOTTY  # type: ignore[attr-defined]
    monkeypatch.setattr(zcrx_reg, "has_caps", lambda *caps: True)  # CAP_IPC_LOCK: no limit applies
    e = _explained(errno.ENOMEM)
    assert e.message == f"zcrx registration ran out of memory pinning {1 << 20} bytes"
    assert e.hint is None and e.errno == errno.ENOMEM  # type: ignore[attr-defined]
    monkeypatch.setattr(zcrx_reg, "has_caps", lambda *caps: False)
    monkeypatch.setattr(zcrx_reg.resource, "getrlimit", lambda which: (64 << 10, 64 << 10))
    e = _explained(errno.ENOMEM)
    assert e.message.startswith(f"RLIMIT_MEMLOCK is 65536 bytes but zcrx must lock {1 << 20}")


def test_has_cap_reads_the_effective_set():
    with open("/proc/self/status") as f:
        eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    if not eff:
        pytest.skip("this process has no capability to look for")
    held = eff.bit_length() - 1
    assert zcrx_reg.has_caps(held)
    missing = [c for c in range(held) if not eff >> c & 1]
    assert all(not zcrx_reg.has_caps(c) for c in missing)


def test_loopback_socket_queue_is_unknown_and_the_hint_says_what_to_pass(tcp_pair):
    with pytest.raises(Unsupported) as ei:
        netqueue.find_queue(tcp_pair[1].fileno())
    assert ei.value.message == ("the socket has no NAPI id (loopback, or no packet received "
                                "yet), so its NIC queue is unknown")
    assert ei.value.hint == "pass ifname and queue"


class StrictGenl(FakeGenl):
    """FakeGenl that answers only what the kernel would: the netdev family, its NAPI and queue
    attribute sets, the queue dump filtered by ifindex; records what each request was for."""

    def __init__(self, tx_only: bool = False) -> None:
        self.tx_only = tx_only
        self.asked: list[str] = []

    def do(self, family, cmd, spec, attrs, what=""):
        from zcnet.nic import netdev
        assert family == netdev.FAMILY and spec is netdev.NAPI
        self.asked.append(what)
        return super().do(family, cmd, spec, attrs, what)

    def dump(self, family, cmd, spec, attrs, what=""):
        from zcnet.nic import netdev
        assert family == netdev.FAMILY and spec is netdev.QUEUE
        assert attrs == {"ifindex": socket.if_nametoindex("lo")}
        self.asked.append(what)
        rows = super().dump(family, cmd, spec, attrs, what)
        return [r for r in rows if r["type"] == nd.NETDEV_QUEUE_TYPE_TX] if self.tx_only else rows


def test_queue_of_napi_asks_the_netdev_family_for_the_rx_queue():
    g = StrictGenl()
    assert netqueue.queue_of_napi(g, 42) == ("lo", 3)
    assert g.asked == ["NAPI 42", "queues"]
    with pytest.raises(Unsupported) as ei:
        netqueue.queue_of_napi(StrictGenl(tx_only=True), 42)
    assert ei.value.message == "no rx queue of lo is served by NAPI 42"
    assert ei.value.hint == "pass the queue explicitly"


def test_provider_defaults_user_region_4096_entries_page_buffers(fake, sock):
    with Area(8 * PAGE_SIZE) as area:
        prov = zcrx.ZcrxProvider(sock.fileno(), area, None, None)
        try:
            assert prov.rq.entries == 4096 and prov.buf_len == PAGE_SIZE
            assert prov.reg.region_mem is not None and prov.reg.ifq.rx_buf_len == PAGE_SIZE
            assert prov.note == f"{zcrx.COPY_NOTE}, 4096 refill entries of {PAGE_SIZE} bytes"
        finally:
            prov.close()


def test_kernel_region_is_mapped_at_the_offset_the_kernel_returned(fake, sock):
    fake.stream = Stream(PAT.expected(0, 64 << 10).tobytes(), segment=4096, end=0)
    prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, rq_entries=4, copy=True, user_region=False)
    assert prov.reg.region.mmap_offset != 0
    with Receiver(sock, prov, max_held=1.0) as rx:
        assert_stream(drain(rx), 64 << 10)  # 16 buffers' worth through 4: refills were seen
    assert fake.ring.flushes > 0 and fake.ring.free_count == 4


def test_reap_waits_as_long_as_it_is_told(fake, sock):
    fake.stream = Stream(b"", segment=4096)  # armed, nothing arrives
    prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=True)
    try:
        prov.arm()
        assert not prov.reap(0.25).lengths and not prov.reap(None).lengths
        assert fake.ring.wait_timeouts == [0.25, None]
    finally:
        prov.close()
        prov.area.close()


def test_every_call_on_a_closed_provider_names_itself(fake, sock):
    prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=True)
    prov.close()
    prov.area.close()
    calls = {"can_arm": lambda: prov.can_arm(), "arm": lambda: prov.arm(),
             "reap": lambda: prov.reap(0), "recycle": lambda: prov.recycle([TOKEN], [1]),
             "attach": lambda: prov.attach(sock.fileno())}
    for name, call in calls.items():
        with pytest.raises(ClosedError) as ei:
            call()
        assert ei.value.message == f"{name}() on a closed ZcrxProvider"


def test_rx_buf_len_refusals_say_what_to_do():
    offers = Offers(u.ZCRX_REG_NODEV, u.ZCRX_FEATURE_RX_PAGE_SIZE, 3)
    zcrx.check_rx_buf_len(PAGE_SIZE, offers, copy=True)  # one page: what copy mode fills
    zcrx.check_rx_buf_len(0, Offers(), copy=False)       # 0: the kernel's default
    refusals = [
        ((3 * PAGE_SIZE, offers, False),
         f"rx_buf_len must be a power of two >= {PAGE_SIZE}, got {3 * PAGE_SIZE}", None),
        ((2 * PAGE_SIZE, Offers(), False),
         "this kernel's zcrx has no rx_buf_len (ZCRX_FEATURE_RX_PAGE_SIZE, 7.x kernels)",
         "leave rx_buf_len out: buffers are one page"),
        ((2 * PAGE_SIZE, offers, True),
         f"zcrx copy mode fills {PAGE_SIZE}-byte buffers only; rx_buf_len {2 * PAGE_SIZE} "
         "needs a NIC queue", "leave rx_buf_len out"),
    ]
    for args, message, hint in refusals:
        with pytest.raises(ZcnetError) as ei:
            zcrx.check_rx_buf_len(*args)
        assert (ei.value.message, ei.value.hint) == (message, hint)


def test_memlock_error_reads_the_soft_limit_and_rounds_the_hint_up(monkeypatch):
    monkeypatch.setattr(zcrx_reg.resource, "getrlimit", lambda which: (1 << 20, 1 << 30))
    e = memlock_error((2 << 20) + 1, privileged=False)  # soft limit 1 MiB, hard 1 GiB
    assert e is not None and e.errno == errno.ENOMEM  # type: ignore[attr-defined]
    assert e.message == (f"RLIMIT_MEMLOCK is {1 << 20} bytes but zcrx must lock "
                         f"{(2 << 20) + 1} bytes (area and refill ring)")
    assert e.hint == ("raise the limit to at least 2049 KiB (ulimit -l, LimitMEMLOCK=) or run "
                      "with CAP_IPC_LOCK")
    assert memlock_error(1 << 20, privileged=False) is None  # exactly the limit fits
    assert memlock_error(4 << 20, limit=2 << 20, privileged=False) is not None


def test_registration_bounds_rounding_and_release():
    with Area(1 << 20) as area:
        for asked, entries in [(1, 1), (3, 4), (IO_RQ_MAX, IO_RQ_MAX)]:
            reg = Registration.build(area, 1, 0, asked)
            assert reg.ifq.rq_entries == entries
            assert reg.locked_bytes() == refill_region_size(entries) + area.size
            mem = reg.region_mem
            assert mem is not None and not mem.closed
            reg.release()
            reg.release()  # twice is harmless
            assert reg.region_mem is None and mem.closed
        with pytest.raises(UsageError) as ei:
            Registration.build(area, 1, -1, 64)
        assert ei.value.message == "queue must be >= 0, got -1"
        for bad in (0, IO_RQ_MAX + 1):
            with pytest.raises(UsageError) as ei:
                Registration.build(area, 1, 0, bad)
            assert ei.value.message == f"refill ring entries must be 1..{IO_RQ_MAX}"


IO_RQ_MAX = zcrx_reg.IO_RQ_MAX_ENTRIES


class RefusingRing:
    """A ring whose registration the kernel answers with ``err``."""

    def __init__(self, err: int) -> None:
        self.err = err

    def register(self, opcode: int, arg: object, nr_args: int) -> int:
        raise OSError(self.err, os.strerror(self.err))


def test_register_ifq_names_the_interface_queue_index_and_locked_bytes(monkeypatch):
    monkeypatch.setattr(zcrx_reg, "has_caps", lambda *caps: True)
    with Area(1 << 20) as area:
        reg = Registration.build(area, 5, 3, 64)
        try:
            msgs = {}
            for err in (errno.ERANGE, errno.ENODEV, errno.ENOMEM):
                with pytest.raises(ZcnetError) as ei:
                    register_ifq(RefusingRing(err), reg, ifname="eth9")  # type: ignore[arg-type]
                msgs[err] = ei.value.message
            with pytest.raises(ZcnetError) as ei:
                register_ifq(RefusingRing(errno.ERANGE), reg)  # type: ignore[arg-type]
        finally:
            reg.release()
    assert msgs[errno.ERANGE] == "eth9 has no rx queue 3"
    assert msgs[errno.ENODEV] == "no interface with index 5 in this network namespace"
    assert msgs[errno.ENOMEM] == ("zcrx registration ran out of memory pinning "
                                  f"{refill_region_size(64) + (1 << 20)} bytes")
    assert ei.value.message == "? has no rx queue 3"


def test_copy_mode_refusal_names_no_device(fake, sock, monkeypatch):
    from fake_zcrx_kernel import FakeRing

    monkeypatch.setattr(FakeRing, "_register_ifq", lambda self, reg: RefusingRing(
        errno.EINVAL).register(0, reg, 1))
    with pytest.raises(ZcnetError) as ei:
        open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=True)
    assert ei.value.message.startswith("zcrx registration rejected as invalid (EINVAL): "
                                       "(no device, copy mode) has tcp-data-split off")
    assert fake.ring.closed


def test_provider_refuses_an_unknown_interface_and_a_memlock_shortfall(fake, sock, monkeypatch):
    with Area(4 * PAGE_SIZE) as area:
        with pytest.raises(UsageError) as ei:
            zcrx.ZcrxProvider(sock.fileno(), area, "nope0", 0)
        assert ei.value.message == "no interface named 'nope0' in this network namespace"
        monkeypatch.setattr(zcrx_reg, "has_caps", lambda *caps: False)
        monkeypatch.setattr(zcrx_reg.resource, "getrlimit", lambda which: (PAGE_SIZE, PAGE_SIZE))
        with pytest.raises(ZcnetError, match=r"^RLIMIT_MEMLOCK is 4096 bytes") as ei:
            zcrx.ZcrxProvider(sock.fileno(), area, None, None, rq_entries=8)
        assert f"must lock {refill_region_size(8) + area.size} bytes" in ei.value.message
    assert not fake.rings  # refused before any ring was made


def test_cq_is_twice_the_refill_ring_and_at_least_1024(fake, sock):
    for rq_entries, cq in [(8, 1024), (4096, 8192)]:
        prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, rq_entries=rq_entries, copy=True)
        try:
            assert fake.ring.cq_entries == cq
        finally:
            prov.close()
            prov.area.close()


def test_open_zcrx_defaults_and_notes(fake, sock):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no hugetlb fallback warning: normal pages by default
        prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=True)
    try:
        assert prov.area.kind == "anon" and prov.rq.entries == 4096
        assert prov.reg.region_mem is not None  # the refill ring in our own memory
        assert prov.note == f"{zcrx.COPY_NOTE}, 4096 refill entries of {PAGE_SIZE} bytes"
        assert prov.extra_stats() == {"refill_full": 0, "refill_held": 0, "refill_produced": 0,
                                      "refill_consumed": 0, "rq_entries": 4096,
                                      "rx_buf_len": PAGE_SIZE, "zcrx_copy": 1,
                                      "zcrx_flushes": 0, "zcrx_copy_count": 0,
                                      "zcrx_members": 1, "zcrx_share": 4, "zcrx_held": 0,
                                      "zcrx_cap_stops": 0}
    finally:
        prov.close()
        prov.close()  # twice is harmless
        prov.area.close()
    dev = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, ifname="lo", queue=0, rq_entries=8,
                    user_region=False)
    try:
        assert dev.note == f"lo queue 0, 8 refill entries of {PAGE_SIZE} bytes"
        assert dev.extra_stats()["zcrx_copy"] == 0
    finally:
        dev.close()
        dev.close()
        dev.area.close()


def test_copy_mode_refusals_say_what_to_do(fake, sock, monkeypatch):
    with pytest.raises(UsageError) as ei:
        open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=True, dmabuf_fd=99)
    assert ei.value.message == ("zcrx copy mode cannot fill a dma-buf area (the kernel's copy "
                                "writes through the CPU)")
    assert ei.value.hint == "leave dmabuf_fd out in copy mode"
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: Offers())
    with pytest.raises(Unsupported) as ei:
        open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=True)
    assert ei.value.message == ("this kernel has no zcrx copy mode (ZCRX_REG_NODEV, 7.x "
                                "kernels) and no device queue was given")
    assert ei.value.hint == ("pass ifname and queue of a zcrx-capable NIC, or use provider "
                             "'soft'")
    assert not fake.rings


@pytest.mark.parametrize(("ifname", "queue", "want"), [
    ("lo", None, ("lo", 3)), (None, 5, ("lo", 5)), (None, None, ("lo", 3))])
def test_queue_discovery_fills_in_only_what_was_not_given(fake, sock, monkeypatch, ifname,
                                                          queue, want):
    from zcnet.nic import genl

    monkeypatch.setattr(netqueue, "incoming_napi_id", lambda fd: 42)
    monkeypatch.setattr(genl, "GenlSocket", FakeGenl)
    if want[1] != 3:  # given a queue the socket did not arrive on (its NAPI's is 3)
        with pytest.raises(zcrx.WrongQueue) as ei:
            open_zcrx(sock.fileno(), 4 * PAGE_SIZE, ifname=ifname, queue=queue, copy=False)
        assert (ei.value.ifname, ei.value.queue) == ("lo", 3)
        assert fake.rings[-1].closed  # the queue registered for it is gone again
        return
    prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, ifname=ifname, queue=queue, copy=False)
    try:
        assert (prov.ifname, prov.queue) == want and prov.reg.ifq.if_rxq == want[1]
    finally:
        prov.close()
        prov.area.close()


def test_attach_moves_the_next_arm_to_the_new_socket(fake, sock):
    fake.stream = Stream(b"y" * 10)
    prov = open_zcrx(-1, 4 * PAGE_SIZE, copy=True)  # registered before the socket exists
    try:
        prov.attach(sock.fileno())
        prov.arm()
        assert fake.ring.sock_fd == sock.fileno() and prov.reap(0).lengths == [10]
    finally:
        prov.close()
        prov.area.close()


def test_device_mode_recycle_after_exhaustion_allows_arming_again(fake, sock):
    fake.stream = Stream(PAT.expected(0, 8 * 4096).tobytes(), segment=4096, end=0)
    prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, ifname="lo", queue=0, rq_entries=8)
    try:
        prov.arm()
        tokens: list[int] = []
        lengths: list[int] = []
        d = prov.reap(0)
        while d.stopped is None:
            tokens, lengths = [*tokens, *d.tokens], [*lengths, *d.lengths]  # lists or arrays
            d = prov.reap(0)
        assert d.stopped == "exhausted" and not prov.can_arm() and len(tokens) == 4
        prov.recycle(tokens[:1], lengths[:1])  # one buffer back: the kernel can fill again
        assert prov.can_arm()
    finally:
        prov.close()
        prov.area.close()


@pytest.fixture
def dmabuf_stand_in():
    """A memfd where a dma-buf fd goes: the registration structs and the (fake) kernel see an
    fd with a size, which is all they take from a dma-buf."""
    fd = os.memfd_create("zcrx-dmabuf-stand-in", os.MFD_CLOEXEC)
    os.ftruncate(fd, 8 * PAGE_SIZE)
    yield fd
    os.close(fd)


def test_dmabuf_area_registers_by_fd_and_locks_only_the_ring(dmabuf_stand_in):
    with Area(8 * PAGE_SIZE, dmabuf_fd=dmabuf_stand_in) as area:
        reg = Registration.build(area, 1, 0, 64)
        try:
            assert reg.area.flags == u.IORING_ZCRX_AREA_DMABUF
            assert reg.area.dmabuf_fd == dmabuf_stand_in and reg.area.addr == 0
            assert reg.area.len == 8 * PAGE_SIZE
            assert reg.locked_bytes() == refill_region_size(64)  # the exporter pins the buffer
        finally:
            reg.release()


def test_device_mode_takes_a_dmabuf_area_and_a_kernel_region(fake, sock, dmabuf_stand_in):
    fake.stream = Stream(PAT.expected(0, 4 * 4096).tobytes(), segment=4096, end=0)
    prov = open_zcrx(sock.fileno(), 8 * PAGE_SIZE, ifname="lo", queue=0, rq_entries=8,
                     dmabuf_fd=dmabuf_stand_in)
    try:
        assert prov.area.kind == "dmabuf" and prov.reg.area.flags == u.IORING_ZCRX_AREA_DMABUF
        assert prov.reg.region_mem is not None  # user region by default in device mode too
        with Receiver(sock, prov) as rx:
            assert_stream(drain(rx), 4 * 4096)
    finally:
        prov.close()
        prov.area.close()


@pytest.mark.parametrize("where", [{"copy": True}, {"ifname": "lo", "queue": 0}],
                         ids=["copy", "device"])
def test_hugetlb_area_is_asked_for(fake, sock, where):
    """hugetlb=True reaches the area: 2 MiB pages, or the warning that there were none."""

    prov = open_asking_for_hugetlb(
        lambda: open_zcrx(sock.fileno(), 4 * PAGE_SIZE, hugetlb=True, **where))
    prov.close()
    prov.area.close()


_fresh_ud = iter(range(1, 1 << 16))


def _unseen_user_data() -> int:
    """A user_data no earlier parse in this process used (the parse keeps per-user_data state),
    with the top bit set: user_data is a u64."""
    return 1 << 63 | os.getpid() << 16 | next(_fresh_ud)


def test_rounds_of_another_user_data_and_of_more_than_1024_cqes_parse_to_arrays():
    """parse_completions serves any u64 user_data: a round of only that request's data takes
    the array path whatever was parsed before it, a few CQEs or more than 1024."""
    ud = _unseen_user_data()
    for n in (3, 1100, 2):
        cqes = [(ud, 100 + i % 900, MORE, TOKEN | i * PAGE_SIZE) for i in range(n)]
        d = parse_completions(kernel_cqes(cqes), user_data=ud)
        assert all(type(x) is np.ndarray for x in (d.offsets, d.lengths, d.tokens))
        assert d.offsets.tolist() == [i * PAGE_SIZE for i in range(n)]
        assert d.lengths.tolist() == [100 + i % 900 for i in range(n)]
        assert d.tokens.tolist() == [TOKEN | i * PAGE_SIZE for i in range(n)]
    # RECV_UD's rounds are not taken for that request's, nor the other way round.
    d = parse_completions(kernel_cqes([(1, 10, MORE, TOKEN), (1, 20, MORE, TOKEN | 4096)]),
                          user_data=ud)
    assert (d.offsets, d.lengths, d.tokens) == ([], [], [])


def test_a_one_byte_cqe_among_other_requests_is_data():
    """The filtering path (a foreign CQE in the round) keeps a 1-byte CQE as data."""
    d = parse_completions(kernel_cqes([(99, 50, MORE, TOKEN), (1, 1, MORE, TOKEN | 4096 + 5),
                                       (1, 2, MORE, TOKEN | 8192)]))
    assert (d.offsets, d.lengths, d.tokens) == ([4101, 8192], [1, 2],
                                                [TOKEN | 4101, TOKEN | 8192])


def test_buffers_released_before_a_stop_come_back_on_a_device_whose_pool_never_reads(
        fake, sock):
    """A device that copies (upstream netdevsim forwards the sender's pages) has a page pool
    that never allocates, so it never reads the refill ring: buffers the application released
    before the receive stopped for want of buffers (-ENOMEM) are flushed back when the stop is
    seen, and the stream goes on although the application holds nothing it could still
    release."""
    fake.pool_reads_ring = False
    fake.stream = Stream(PAT.expected(0, 12 * 4096).tobytes(), segment=4096, end=0)
    prov = open_zcrx(sock.fileno(), 4 * PAGE_SIZE, ifname="lo", queue=0, rq_entries=8)
    with Receiver(sock, prov, max_held=1.0) as rx:
        assert_stream(drain(rx), 12 * 4096)
        assert rx.stats.rearms >= 2 and fake.ring.flushes >= 2


def test_a_device_reads_returned_buffers_from_the_ring_without_a_flush(fake, sock):
    """A device's page pool takes the refill entries itself as it allocates: while the area has
    free buffers, recycling writes entries and makes no ZCRX_CTRL call."""
    fake.stream = Stream(PAT.expected(0, 64 * 4096).tobytes(), segment=4096, per_wait=4, end=0)
    prov = open_zcrx(sock.fileno(), 16 * PAGE_SIZE, ifname="lo", queue=0, rq_entries=16)
    with Receiver(sock, prov, max_held=1.0) as rx:
        assert_stream(drain(rx), 64 * 4096)
        assert rx.stats.exhausted == 0 and prov.rq.produced == 64
        assert fake.ring.flushes == 0


# --- the kernel's copy counters (zcrx_stats) ------------------------------------------------

@pytest.mark.parametrize("how", ["copy mode", "device that copies", "device"])
def test_copied_bytes_come_from_the_kernels_counter(fake, sock, how):
    """The receiver reports what the kernel's zcrx_stats counted: every byte in copy mode and
    on a device that copies, none on a device that DMAs (whose refill needs no flush)."""
    total = 40 * 4096
    fake.pool_reads_ring = how != "device that copies"
    fake.stream = Stream(PAT.expected(0, total).tobytes(), segment=4096, end=0)
    where = {"copy": True} if how == "copy mode" else {"ifname": "lo", "queue": 0}
    prov = open_zcrx(sock.fileno(), 8 * PAGE_SIZE, rq_entries=8, **where)
    with Receiver(sock, prov, max_held=1.0) as rx:
        assert_stream(drain(rx), total)
    st = rx.stats_dict()
    copied = 0 if how == "device" else total
    assert (st["kernel_copied_bytes"], st["kernel_copied_source"]) == (
        copied, "zcrx_stats.copy_bytes")
    assert st["zero_copy_share"] == (1.0 if how == "device" else 0.0)
    assert st["zcrx_copy_count"] == copied // 4096
    assert (st["zcrx_flushes"] == 0) == (how == "device")
    # Read back after close: the last values the kernel wrote in the (now unmapped) region.
    # Copy mode flushes after each write; a device reads the ring as it needs buffers, so the
    # last ones may still wait there (at most the area's 8).
    assert st["refill_produced"] == 40
    assert st["refill_consumed"] == 40 if how == "copy mode" else st["refill_consumed"] >= 32
    # The region holds the counter where the registration put it: past the ring's entries.
    assert prov.reg.stats_offset >= fake.ring.RQES + 16 * 8


def test_without_kernel_stats_the_copied_bytes_are_unknown_with_the_reason(fake, sock):
    fake.stats = False
    fake.stream = Stream(PAT.expected(0, 4 * 4096).tobytes(), segment=4096, end=0)
    prov = open_zcrx(sock.fileno(), 8 * PAGE_SIZE, copy=True, rq_entries=8)
    with Receiver(sock, prov, max_held=1.0) as rx:
        assert_stream(drain(rx), 4 * 4096)
    st = rx.stats_dict()
    assert prov.reg.ifq.event_desc == 0  # __resv[0] on such a kernel: left zero
    assert st["kernel_copied_bytes"] is None and st["zero_copy_share"] is None
    assert st["kernel_copied_source"] == (f"kernel {os.uname().release} lacks zcrx stats "
                                          "(ZCRX_FEATURE_EVENT, needs >= 7.2)")
    assert "zcrx_copy_count" not in st


NO_NAPI = ("the socket has no NAPI id (loopback, or no packet received yet), so its NIC queue "
           "is unknown")


def test_without_copy_mode_a_failed_discovery_says_there_is_no_fallback(fake, tcp_pair,
                                                                         monkeypatch):
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: Offers())
    sock = tcp_pair[1]
    with pytest.raises(Unsupported) as ei:
        open_zcrx(sock.fileno(), 4 * PAGE_SIZE)
    assert ei.value.message == (f"{NO_NAPI}; this kernel has no zcrx copy mode to fall back "
                                "to (7.x kernels)")
    with pytest.raises(Unsupported) as ei:  # no fallback asked for: nothing to say about one
        open_zcrx(sock.fileno(), 4 * PAGE_SIZE, copy=False)
    assert ei.value.message == NO_NAPI
    assert not fake.rings


def test_the_copy_mode_fallback_keeps_the_callers_choices_and_says_why(fake, tcp_pair):
    """Discovery fails on loopback: copy mode, with the area and region the caller asked for."""

    prov = open_asking_for_hugetlb(lambda: open_zcrx(
        tcp_pair[1].fileno(), 4 * PAGE_SIZE, hugetlb=True, rq_entries=8))
    try:
        assert prov.mode == "copy"
        assert prov.note == (f"{zcrx.COPY_NOTE} ({NO_NAPI}), 8 refill entries of "
                             f"{PAGE_SIZE} bytes")
        assert fake.ring.user_region  # the refill ring in our memory, the default
    finally:
        prov.close()
        prov.area.close()


def test_cap_ipc_lock_lifts_the_memlock_limit(monkeypatch):
    """Not told whether the process is privileged, memlock_error asks for CAP_IPC_LOCK."""
    asked: list[tuple] = []
    monkeypatch.setattr(zcrx_reg, "has_caps", lambda *caps: asked.append(caps) or True)
    assert memlock_error(10 << 20, limit=8 << 20) is None
    assert asked == [(zcrx_reg.CAP_IPC_LOCK,)]
    monkeypatch.setattr(zcrx_reg, "has_caps", lambda *caps: False)
    assert memlock_error(10 << 20, limit=8 << 20) is not None


def test_auto_takes_zcrx_on_a_device_that_supports_it(fake, tcp_pair, dmabuf_stand_in):
    """"auto" asks zcrx for the device queue first (never copy mode) with the caller's area."""
    fake.stream = Stream(b"z" * 100, end=0)
    with open_receiver(tcp_pair[1], "auto", area_size=8 * PAGE_SIZE, ifname="lo", queue=0,
                       dmabuf_fd=dmabuf_stand_in) as rx:
        assert rx.name == "zcrx" and rx.why == "zcrx: the socket's device supports it"
        assert rx.provider.mode == "device" and (rx.provider.ifname, rx.provider.queue) == (
            "lo", 0)
        assert rx.area.kind == "dmabuf" and rx.area.size == 8 * PAGE_SIZE
        (c,) = rx.recv(timeout=0)
        assert bytes(c.data) == b"z" * 100
        c.release()
