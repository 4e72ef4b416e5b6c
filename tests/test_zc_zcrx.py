"""zcrx provider: registration against this kernel up to the device check, and CQE32 parsing and
refill-ring logic against memory laid out as the kernel lays it out."""

from __future__ import annotations

import ctypes
import errno
import socket
import struct

import numpy as np
import pytest

from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.rx.zc import Receiver
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.provider import Delivery
from zcnet.rx.zc.zcrx import (
    KERNEL_RQ_HEAD,
    KERNEL_RQ_TAIL,
    KERNEL_RQES,
    OFF_MASK,
    RING_FLAGS,
    RefillRing,
    Registration,
    explain,
    memlock_error,
    open_zcrx,
    parse_completions,
    refill_region_size,
    register_ifq,
)
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Completions, Ring

AREA_ID = 3  # a non-zero area id, so a lost token would show
TOKEN = AREA_ID << u.IORING_ZCRX_AREA_SHIFT


# --- registration against the real kernel ----------------------------------------------------

@pytest.fixture
def lab(no_leaks):
    from zcnet.lab import Lab
    from zcnet.lab.netns import in_netns

    with Lab() as lab, in_netns(lab.ns_a):
        yield lab


@pytest.mark.root
@pytest.mark.parametrize("user_region", [True, False], ids=["user-region", "kernel-region"])
def test_veth_registration_reaches_device_check(lab, user_region):
    with pytest.raises(Unsupported, match="lacks queue management ops or header-data split") as ei:
        open_zcrx(-1, 1 << 20, ifname=lab.if_a, queue=0, user_region=user_region)
    assert ei.value.errno == errno.EOPNOTSUPP  # type: ignore[attr-defined]


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
    assert "queue 3 of eth9 is still bound to an earlier memory provider" in e.message
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


def test_cqe32_data_offsets_lengths_tokens():
    c = kernel_cqes([(1, 4096, MORE, TOKEN | 0), (1, 1000, MORE, TOKEN | 8192 + 96),
                     (99, 0, 0, 0),  # an unrelated request's CQE is ignored
                     (1, 1448, MORE, TOKEN | 12288)])
    d = parse_completions(c)
    assert d.offsets == [0, 8192 + 96, 12288]
    assert d.lengths == [4096, 1000, 1448]
    assert d.tokens == [TOKEN, TOKEN | 8288, TOKEN | 12288]
    assert d.end is None and d.stopped is None


@pytest.mark.parametrize("res,end,stopped", [
    (0, 0, None), (-errno.ENOSPC, None, "rearm"), (-errno.ECONNRESET, -errno.ECONNRESET, None),
])
def test_final_cqe(res, end, stopped):
    d = parse_completions(kernel_cqes([(1, 100, MORE, TOKEN | 4096), (1, res, 0, 0)]))
    assert d.lengths == [100] and (d.end, d.stopped) == (end, stopped)


# --- the refill ring ---------------------------------------------------------------------------

class KernelRefill:
    """The kernel's side of a refill ring in a region laid out as io_allocate_rbuf_ring does."""

    def __init__(self, entries: int, start: int = 0) -> None:
        self.mem = np.zeros(refill_region_size(entries), dtype=np.uint8)
        self.entries = entries
        for at in (KERNEL_RQ_HEAD, KERNEL_RQ_TAIL):
            struct.pack_into("<I", self.mem, at, start)
        self.head = start

    def user(self) -> RefillRing:
        return RefillRing(self.mem, KERNEL_RQ_HEAD, KERNEL_RQ_TAIL, KERNEL_RQES, self.entries,
                          TOKEN)

    def consume(self, n: int | None = None) -> list[tuple[int, int, int]]:
        """Take up to n entries like io_zcrx_ring_refill: (area id, offset, len) each."""
        (tail,) = struct.unpack_from("<I", self.mem, KERNEL_RQ_TAIL)
        avail = (tail - self.head) & 0xFFFFFFFF
        n = avail if n is None else min(n, avail)
        out = []
        for i in range(n):
            slot = (self.head + i) & (self.entries - 1)
            off, ln, pad = struct.unpack_from("<QII", self.mem, KERNEL_RQES + slot * 16)
            assert pad == 0
            out.append((off >> u.IORING_ZCRX_AREA_SHIFT, off & OFF_MASK, ln))
        self.head = (self.head + n) & 0xFFFFFFFF
        struct.pack_into("<I", self.mem, KERNEL_RQ_HEAD, self.head)
        return out


@pytest.mark.parametrize("start", [0, 0xFFFFFFF0], ids=["fresh", "u32-wrap"])
def test_refill_entries_carry_area_token(start):
    k = KernelRefill(8, start)
    rq = k.user()
    # CQE offs as the kernel reported them (area id bits set); the rqe must carry the token.
    offs = [TOKEN | (i * 4096 + 64) for i in range(6)]
    assert rq.push(offs, [100 + i for i in range(6)]) == 6
    assert k.consume() == [(AREA_ID, i * 4096 + 64, 100 + i) for i in range(6)]


def test_refill_ring_full_holds_and_retries_in_order():
    k = KernelRefill(8, 0xFFFFFFFC)
    rq = k.user()
    offs = [TOKEN | i * 4096 for i in range(13)]
    assert rq.push(offs, [1] * 13) == 8
    assert rq.held == 5 and rq.full_events == 1
    got = k.consume(3)
    assert rq.push([], []) == 3 and rq.held == 2 and rq.full_events == 2
    got += k.consume()
    assert rq.push([TOKEN | 99 * 4096], [1]) == 3 and rq.held == 0
    got += k.consume()
    assert [o for _, o, _ in got] == [i * 4096 for i in range(13)] + [99 * 4096]


# --- the Receiver over zcrx semantics, kernel simulated at the ring boundary ------------------

class SimulatedZcrx:
    """zcrx provider whose kernel is this test: CQE32 memory in, refill ring memory out."""

    name = "zcrx"

    def __init__(self, area: Area, script: list[list[tuple[int, int, int, int]]],
                 rq_entries: int) -> None:
        self.area = area
        self.note = "simulated"
        self.armed = False
        self.arms = 0
        self.kernel = KernelRefill(rq_entries)
        self.rq = self.kernel.user()
        self.script = script

    def can_arm(self) -> bool:
        return True

    def arm(self) -> None:
        self.armed = True
        self.arms += 1

    def reap(self, timeout: float | None) -> Delivery:
        d = parse_completions(kernel_cqes(self.script.pop(0)))
        if d.end is not None or d.stopped:
            self.armed = False
        return d

    def recycle(self, tokens: list[int], lengths: list[int]) -> None:
        self.rq.push(tokens, lengths)

    def held_back(self) -> int:
        return self.rq.held

    def extra_stats(self) -> dict[str, int]:
        return {"refill_full": self.rq.full_events}

    def close(self) -> None:
        self.armed = False


def test_receiver_rearms_after_enospc_and_never_drops_a_buffer():
    with Area(64 * 4096) as area:
        for i in range(10):
            area.array[i * 4096:i * 4096 + 100] = i
        frag = [(1, 100, MORE, TOKEN | i * 4096) for i in range(10)]
        script = [[*frag[:4], (1, -errno.ENOSPC, 0, 0)], frag[4:], [(1, 0, 0, 0)]]
        prov = SimulatedZcrx(area, script, rq_entries=4)
        rx = Receiver(-1, prov, max_held=1.0)  # type: ignore[arg-type]
        got = []
        for c in rx:
            assert (c.array == c.offset // 4096).all()
            got.append(c)
        assert prov.arms == 2 and rx.stats.rearms == 1
        assert [c.stream_offset for c in got] == [100 * i for i in range(10)]
        rx.release_many(got)
        rx.recv(timeout=0)  # flush: 10 returns into a 4-entry ring -> 6 held back
        assert prov.rq.held == 6 and rx.stats_dict()["refill_full"] >= 1
        back = prov.kernel.consume()
        while prov.rq.held:
            rx.recv(timeout=0)  # every owner pass retries what is held
            back += prov.kernel.consume()
        assert sorted(o for _, o, _ in back) == [i * 4096 for i in range(10)]
        assert {a for a, _, _ in back} == {AREA_ID}
        rx.close()


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
