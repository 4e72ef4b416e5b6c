"""Provider "zcrx": io_uring zero-copy receive (IORING_REGISTER_ZCRX_IFQ + RECV_ZC).

Some facts about zcrx that shape this module:

- The ring must be SINGLE_ISSUER | DEFER_TASKRUN with 32-byte CQEs: each data CQE carries an
  ``io_uring_zcrx_cqe`` in its second half whose ``off`` is the byte offset in the area with the
  area id in the bits above IORING_ZCRX_AREA_SHIFT. The data is at ``area + (off & ~MASK)``.
- Registration takes the area (user memory or a dma-buf), and a "refill ring" region that is
  either our own page-aligned memory (IORING_MEM_REGION_TYPE_USER) or kernel memory we mmap at
  the ``mmap_offset`` the kernel returns. The kernel returns the ring layout in ``offsets``: a u32
  head, a u32 tail, then ``rq_entries`` 16-byte ``io_uring_zcrx_rqe``; we use what it returns.
- The kernel validates in this order: CAP_NET_ADMIN (EPERM), ring flags and reserved fields
  (EINVAL), the region, the interface (ENODEV), the device's DMA parent (EOPNOTSUPP: veth and lo
  have none), the area (pins pages, RLIMIT_MEMLOCK -> ENOMEM), then the queue API:
  EOPNOTSUPP without queue management ops, ERANGE past the last queue, EINVAL with
  tcp-data-split off or hds-thresh non-zero, EEXIST when the queue already has a memory provider
  (an earlier zcrx or devmem binding not yet torn down) or an XDP program, EBUSY under AF_XDP.
- Each data CQE grants the application one reference on a net_iov (a buffer of rx_buf_len
  bytes, one page by default; several CQEs may share one when a NIC packs it); giving it back
  is an rqe ``{off & ~MASK | area_token, len}`` at ``tail & mask`` followed by the release store
  of the tail. NAPI reads the ring on another CPU: x86 is TSO, so a plain store after the entry
  is the release. If the ring is full the buffer is held and retried, never dropped (a dropped
  reference is a page lost to the queue until the ifq dies).
- A final CQE (no F_MORE) with -ENOSPC means the CQ overflowed: the data is intact, re-arm.
  -ENOMEM means the area had no free buffer for the kernel's copy: re-arm once buffers are back.

Some facts about copy mode (7.x kernels; the host's 6.18 answers EINVAL):

- ``ZCRX_REG_NODEV`` registers without a device (if_idx and if_rxq must be 0): no queue is
  taken over and the kernel copies every received byte into the area, then posts the same
  CQE32s. The whole user-visible protocol runs (RECV_ZC multishot, area offsets, the refill
  ring); only the DMA into the area does not. A dma-buf area cannot be filled this way.
- Without a page pool nothing consumes the refill ring on its own: ``ZCRX_CTRL_FLUSH_RQ``
  (IORING_REGISTER_ZCRX_CTRL) returns its entries to the area's free list, so every refill
  write in copy mode is followed by a flush. The flush stops at the first malformed entry.
- ``rx_buf_len`` (ZCRX_FEATURE_RX_PAGE_SIZE) asks a device for larger buffers: a power of two
  >= PAGE_SIZE; copy mode takes only PAGE_SIZE (EOPNOTSUPP otherwise). The kernel writes back
  the size it uses.
- What a kernel offers is asked with IORING_REGISTER_QUERY (IO_URING_QUERY_ZCRX, no ring
  needed); kernels before 7.x answer with a negative result or an error, read as "nothing".
- The refill ring's layout is whatever ``offsets`` says, and it changes between releases:
  a 7.2.13 registration returned head 0, tail 4, entries at 64; a 7.3.4 one head 0, tail 64,
  entries at 128 (head and tail on their own cache lines).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import resource
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np

from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError, cap_hint
from zcnet.rx.zc.area import PAGE_SIZE, Area, align_up
from zcnet.rx.zc.provider import Delivery, cancel_multishot, note_final, reap_ready
from zcnet.uapi import io_uring as u
from zcnet.uapi import socket as usock
from zcnet.uring.mem import Mapping
from zcnet.uring.prep import prep_recv_zc
from zcnet.uring.ring import Completions, Ring
from zcnet.uring.syscall import io_uring_register

RECV_UD = 1
CANCEL_UD = 2
RING_FLAGS = (u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN
              | u.IORING_SETUP_CQE32 | u.IORING_SETUP_SUBMIT_ALL)
IO_RQ_MAX_ENTRIES = 32768
OFF_MASK = (1 << u.IORING_ZCRX_AREA_SHIFT) - 1  # offset bits of a zcrx cqe/rqe ``off``
# A final CQE's errno that does not end the stream: -ENOSPC is a CQ overflow (data intact).
# -ENOMEM: no free buffer in the area for the kernel's copy (the data waits in the socket).
STOPS = {errno.ENOSPC: "rearm", errno.ECANCELED: "rearm", errno.ENOMEM: "exhausted"}
CAP_IPC_LOCK = 14
MODES = ("device", "copy")
COPY_NOTE = ("copy mode: no device queue, the kernel copies every byte into the zcrx area "
             "(ZCRX_REG_NODEV); the zcrx protocol runs for real, zero copy does not")


@dataclass(frozen=True)
class Offers:
    """What this kernel's zcrx takes (IO_URING_QUERY_ZCRX); all zero before 7.x."""

    register_flags: int = 0
    features: int = 0
    nr_ctrl_opcodes: int = 0

    @property
    def copy_mode(self) -> bool:
        return bool(self.register_flags & u.ZCRX_REG_NODEV) and self.nr_ctrl_opcodes > 0

    @property
    def rx_buf_len(self) -> bool:
        return bool(self.features & u.ZCRX_FEATURE_RX_PAGE_SIZE)


@functools.cache
def kernel_offers() -> Offers:
    """Ask the running kernel (once per process) what its zcrx supports."""
    q = u.io_uring_query_zcrx()
    hdr = u.io_uring_query_hdr(query_data=ctypes.addressof(q), query_op=u.IO_URING_QUERY_ZCRX,
                               size=ctypes.sizeof(q))
    try:
        io_uring_register(-1, u.IORING_REGISTER_QUERY, hdr, 0)
    except OSError:  # no query opcode (before 6.18): no copy mode either
        return Offers()
    if hdr.result < 0:  # 6.18 knows the query but not its zcrx op (EOPNOTSUPP)
        return Offers()
    return Offers(int(q.register_flags), int(q.features), int(q.nr_ctrl_opcodes))


def check_rx_buf_len(rx_buf_len: int, offers: Offers, copy: bool) -> None:
    """UsageError/Unsupported for an rx_buf_len the kernel would refuse (0: its default)."""
    if not rx_buf_len:
        return
    if rx_buf_len < PAGE_SIZE or rx_buf_len & (rx_buf_len - 1):
        raise UsageError(f"rx_buf_len must be a power of two >= {PAGE_SIZE}, got {rx_buf_len}")
    if not offers.rx_buf_len:
        raise Unsupported("this kernel's zcrx has no rx_buf_len (ZCRX_FEATURE_RX_PAGE_SIZE, "
                          "7.x kernels)", "leave rx_buf_len out: buffers are one page")
    if copy and rx_buf_len != PAGE_SIZE:
        raise Unsupported(f"zcrx copy mode fills {PAGE_SIZE}-byte buffers only; rx_buf_len "
                          f"{rx_buf_len} needs a NIC queue", "leave rx_buf_len out")


def refill_region_size(rq_entries: int) -> int:
    """Bytes of the refill region: the rqes plus a page for head/tail (liburing's sizing)."""
    return align_up(rq_entries * ctypes.sizeof(u.io_uring_zcrx_rqe) + PAGE_SIZE, PAGE_SIZE)


class RefillRing:
    """Our side of the refill queue over its shared memory (``mem``: the whole region as uint8).

    We own ``ktail``; the kernel owns ``khead``. ``push`` writes as many entries as fit and holds
    the rest; later calls send the held ones first, so order and count are preserved.
    """

    def __init__(self, mem: np.ndarray, head: int, tail: int, rqes: int, entries: int,
                 area_token: int) -> None:
        if entries & (entries - 1):
            raise ValueError("refill ring entries must be a power of two")
        self.entries = entries
        self.mask = entries - 1
        self.area_token = area_token
        self._khead = mem[head:head + 4].view(np.uint32)
        self._ktail = mem[tail:tail + 4].view(np.uint32)
        ring = mem[rqes:rqes + entries * 16]
        self._rqe_off = ring.view(np.uint64).reshape(entries, 2)[:, 0]
        self._rqe_len = ring.view(np.uint32).reshape(entries, 4)[:, 2]
        self._rqe_pad = ring.view(np.uint32).reshape(entries, 4)[:, 3]
        self._tail = int(self._ktail[0])
        self._held_off: list[int] = []
        self._held_len: list[int] = []
        self.full_events = 0
        self.produced = 0  # entries written over the ring's life

    def _acquire_khead(self) -> int:
        # The kernel stores head with smp_store_release after reading the entries; on x86 a
        # plain load is an acquire (TSO). Weakly ordered CPUs would need a real one here.
        return int(self._khead[0])

    def _release_ktail(self) -> None:
        # Entries are written before this store and NAPI on another CPU reads them after its
        # smp_load_acquire of tail; on x86 program order is enough (TSO).
        self._ktail[0] = self._tail

    def space(self) -> int:
        used = (self._tail - self._acquire_khead()) & 0xFFFFFFFF
        return self.entries - used

    @property
    def tail(self) -> int:
        return self._tail

    def kernel_head(self) -> int:
        """The kernel's consumer index (for stats and tests)."""
        return self._acquire_khead()

    @property
    def held(self) -> int:
        return len(self._held_off)

    def push(self, offs: list[int], lens: list[int]) -> int:
        """Queue buffers (their CQE ``off`` values and lengths) for the kernel; returns how many
        were written now. The rest stay held and go first next time."""
        if self._held_off:
            offs = self._held_off + offs
            lens = self._held_len + lens
        n = min(self.space(), len(offs))
        if n < len(offs):
            self.full_events += 1
            self._held_off, self._held_len = offs[n:], lens[n:]
        else:
            self._held_off, self._held_len = [], []
        if n:
            slots = (self._tail + np.arange(n, dtype=np.uint64)) & np.uint64(self.mask)
            o = np.array(offs[:n], dtype=np.uint64)
            self._rqe_off[slots] = (o & np.uint64(OFF_MASK)) | np.uint64(self.area_token)
            self._rqe_len[slots] = lens[:n]
            self._rqe_pad[slots] = 0
            self._tail = (self._tail + n) & 0xFFFFFFFF
            self._release_ktail()
            self.produced += n
        return n


def parse_completions(c: Completions, user_data: int = RECV_UD) -> Delivery:
    """Data fragments and the stream's state from CQE32 completions of one RECV_ZC."""
    out = Delivery()
    if not len(c):
        return out
    assert c.extra is not None, "zcrx needs a CQE32 ring"
    keep = c.user_data == user_data
    res, flags, extra = c.res[keep], c.flags[keep], c.extra[keep]
    data = res > 0
    if data.any():
        off = extra[data, 0]
        out.tokens = off.tolist()
        out.offsets = (off & np.uint64(OFF_MASK)).tolist()
        out.lengths = res[data].tolist()
    if len(res) and not flags[-1] & u.IORING_CQE_F_MORE:
        note_final(out, int(res[-1]), STOPS)
    return out


# --- registration ----------------------------------------------------------------------------


@dataclass
class Registration:
    """The structs of one IORING_REGISTER_ZCRX_IFQ call, kept alive (the kernel writes back)."""

    ifq: u.io_uring_zcrx_ifq_reg
    area: u.io_uring_zcrx_area_reg
    region: u.io_uring_region_desc
    region_mem: Mapping | None  # our memory for a user region, None for a kernel one

    @classmethod
    def build(cls, area: Area, ifindex: int, queue: int, rq_entries: int,
              user_region: bool = True, *, nodev: bool = False,
              rx_buf_len: int = 0) -> Registration:
        """``nodev``: copy mode (ifindex and queue must be 0, the kernel insists)."""
        if queue < 0:
            raise UsageError(f"queue must be >= 0, got {queue}")
        if not 0 < rq_entries <= IO_RQ_MAX_ENTRIES:
            raise UsageError(f"refill ring entries must be 1..{IO_RQ_MAX_ENTRIES}")
        entries = 1 << (rq_entries - 1).bit_length()  # the kernel rounds up the same way
        size = refill_region_size(entries)
        areg = u.io_uring_zcrx_area_reg(len=area.size)
        if area.dmabuf_fd is not None:
            areg.flags = u.IORING_ZCRX_AREA_DMABUF
            areg.dmabuf_fd = area.dmabuf_fd  # addr is the offset into the dma-buf: 0
        else:
            areg.addr = area.addr
        rd = u.io_uring_region_desc(size=size)
        mem = None
        if user_region:
            mem = Mapping.anonymous(size)
            rd.user_addr = mem.addr
            rd.flags = u.IORING_MEM_REGION_TYPE_USER
        ifq = u.io_uring_zcrx_ifq_reg(if_idx=ifindex, if_rxq=queue, rq_entries=entries,
                                      area_ptr=ctypes.addressof(areg),
                                      region_ptr=ctypes.addressof(rd), rx_buf_len=rx_buf_len,
                                      flags=u.ZCRX_REG_NODEV if nodev else 0)
        return cls(ifq, areg, rd, mem)

    def locked_bytes(self) -> int:
        return int(self.region.size) + (0 if self.area.flags else int(self.area.len))

    def release(self) -> None:
        if self.region_mem is not None:
            self.region_mem.close()
            self.region_mem = None


# errno -> (message, hint); {ifname}, {queue}, {ifindex} are filled in.
REGISTER_ERRORS: dict[int, tuple[type[ZcnetError], str, str]] = {
    errno.EPERM: (ZcnetError, "zcrx registration needs CAP_NET_ADMIN",
                  cap_hint("CAP_NET_ADMIN")),
    errno.EOPNOTSUPP: (Unsupported,
                       "device {ifname} lacks queue management ops or header-data split, "
                       "so zcrx cannot take over its queue {queue}",
                       "use a NIC whose driver supports zcrx (queue API and tcp-data-split), "
                       "or provider 'soft'"),
    errno.EEXIST: (ZcnetError,
                   "queue {queue} of {ifname} is still bound to an earlier memory provider (a "
                   "zcrx or devmem binding not yet released) or the device runs an XDP program",
                   "close the earlier receiver and its ring (the kernel unbinds when the ring "
                   "is freed), or detach XDP"),
    errno.EBUSY: (ZcnetError, "queue {queue} of {ifname} is in use by an AF_XDP socket",
                  "close the AF_XDP socket or pick another queue"),
    errno.ERANGE: (UsageError, "{ifname} has no rx queue {queue}",
                   "pick a queue below the channel count (ethtool -l {ifname})"),
    errno.ENODEV: (UsageError, "no interface with index {ifindex} in this network namespace",
                   "register from the namespace that holds the NIC"),
    errno.EINVAL: (ZcnetError,
                   "zcrx registration rejected as invalid (EINVAL): {ifname} has "
                   "tcp-data-split off or hds-thresh above 0, or the request is malformed",
                   "ethtool -G {ifname} tcp-data-split on hds-thresh 0"),
}


def explain(err: OSError, *, ifname: str, ifindex: int, queue: int, locked: int) -> ZcnetError:
    """The user-facing error for a failed registration; errno kept on ``.errno``."""
    if err.errno == errno.ENOMEM:
        exc = memlock_error(locked) or ZcnetError(
            f"zcrx registration ran out of memory pinning {locked} bytes", None)
    elif err.errno in REGISTER_ERRORS:
        cls, msg, hint = REGISTER_ERRORS[err.errno]
        fill = {"ifname": ifname, "queue": queue, "ifindex": ifindex}
        exc = cls(msg.format(**fill), hint.format(**fill))
    else:
        exc = ZcnetError(f"zcrx registration on {ifname} queue {queue} failed: {err.strerror}")
    exc.errno = err.errno  # type: ignore[attr-defined]
    return exc


def has_cap(cap: int) -> bool:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def memlock_error(needed: int, limit: int | None = None,
                  privileged: bool | None = None) -> ZcnetError | None:
    """The error when ``needed`` locked bytes exceed RLIMIT_MEMLOCK (CAP_IPC_LOCK lifts it)."""
    if privileged is None:
        privileged = has_cap(CAP_IPC_LOCK)
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if privileged or limit == resource.RLIM_INFINITY or needed <= limit:
        return None
    e = ZcnetError(f"RLIMIT_MEMLOCK is {limit} bytes but zcrx must lock {needed} bytes "
                   "(area and refill ring)",
                   f"raise the limit to at least {-(-needed // 1024)} KiB (ulimit -l, "
                   "LimitMEMLOCK=) or run with CAP_IPC_LOCK")
    e.errno = errno.ENOMEM  # type: ignore[attr-defined]
    return e


def register_ifq(ring: Ring, reg: Registration, *, ifname: str = "?") -> None:
    """IORING_REGISTER_ZCRX_IFQ with errors translated (see REGISTER_ERRORS)."""
    try:
        ring.register(u.IORING_REGISTER_ZCRX_IFQ, reg.ifq, 1)
    except OSError as e:
        raise explain(e, ifname=ifname, ifindex=reg.ifq.if_idx, queue=reg.ifq.if_rxq,
                      locked=reg.locked_bytes()) from e


def find_queue(fd: int) -> tuple[str, int]:
    """(ifname, rx queue) that delivered this socket's packets, from SO_INCOMING_NAPI_ID and the
    netdev family's NAPI and queue listings."""
    from zcnet.nic.genl import GenlSocket

    napi_id = incoming_napi_id(fd)
    if not napi_id:
        raise Unsupported("the socket has no NAPI id (loopback, or no packet received yet), so "
                          "its NIC queue is unknown", "pass ifname and queue")
    with GenlSocket() as g:
        return queue_of_napi(g, napi_id)


def incoming_napi_id(fd: int) -> int:
    sk = socket.socket(fileno=os.dup(fd))
    try:
        return int(sk.getsockopt(usock.SOL_SOCKET, usock.SO_INCOMING_NAPI_ID))
    finally:
        sk.close()


def queue_of_napi(g: Any, napi_id: int) -> tuple[str, int]:
    """(ifname, rx queue) served by NAPI ``napi_id``, asked over the netdev family (``g``: a
    GenlSocket). A NAPI also serves TX queues, often with other ids: only RX counts."""
    from zcnet.nic import netdev
    from zcnet.uapi import netdev as nd

    napi = g.do(netdev.FAMILY, nd.NETDEV_CMD_NAPI_GET, netdev.NAPI, {"id": napi_id},
                what=f"NAPI {napi_id}") or {}
    ifindex = int(napi.get("ifindex", 0))
    rows = g.dump(netdev.FAMILY, nd.NETDEV_CMD_QUEUE_GET, netdev.QUEUE, {"ifindex": ifindex},
                  what="queues")
    ifname = socket.if_indextoname(ifindex)
    for q in rows:
        if q.get("napi-id") == napi_id and q.get("type") == nd.NETDEV_QUEUE_TYPE_RX:
            return ifname, int(q["id"])
    raise Unsupported(f"no rx queue of {ifname} is served by NAPI {napi_id}",
                      "pass the queue explicitly")


# --- provider --------------------------------------------------------------------------------


class ZcrxProvider:
    """One zcrx interface queue and its ring. ``ifname`` None: copy mode (ZCRX_REG_NODEV)."""

    name = "zcrx"

    def __init__(self, fd: int, area: Area, ifname: str | None, queue: int | None, *,
                 rq_entries: int = 4096, user_region: bool = True, rx_buf_len: int = 0,
                 why_copy: str = "") -> None:
        self.fd = fd
        self.area = area
        self.copy = ifname is None
        self.mode = "copy" if self.copy else "device"
        self.ifname = ifname
        self.queue = queue
        self.armed = False
        self._starved = False  # the last stop was -ENOMEM: arm again only after a recycle
        if ifname is None:
            ifindex = 0
        else:
            try:
                ifindex = socket.if_nametoindex(ifname)
            except OSError:
                raise UsageError(f"no interface named {ifname!r} in this network namespace"
                                 ) from None
        self._reg = Registration.build(area, ifindex, queue or 0, rq_entries, user_region,
                                       nodev=self.copy, rx_buf_len=rx_buf_len)
        self._region_map: Mapping | None = None
        self._ring: Ring | None = None
        with contextlib.ExitStack() as undo:
            undo.callback(self.close)
            if err := memlock_error(self._reg.locked_bytes()):
                raise err
            self._ring = Ring(64, flags=RING_FLAGS, cq_entries=max(1024, 2 * rq_entries))
            register_ifq(self._ring, self._reg, ifname=ifname or "(no device, copy mode)")
            self.rq = self._map_refill_ring()
            undo.pop_all()
        self.ifq_id = int(self._reg.ifq.zcrx_id)
        # 7.x writes back the buffer size; older kernels leave our 0 (one page).
        self.buf_len = int(self._reg.ifq.rx_buf_len) or PAGE_SIZE
        self._flush = u.zcrx_ctrl(zcrx_id=self.ifq_id, op=u.ZCRX_CTRL_FLUSH_RQ)
        where = (f"{COPY_NOTE}" + (f" ({why_copy})" if why_copy else "") if self.copy
                 else f"{ifname} queue {queue}")
        self.note = f"{where}, {self.rq.entries} refill entries of {self.buf_len} bytes"

    def _map_refill_ring(self) -> RefillRing:
        reg = self._reg
        size = int(reg.region.size)
        if reg.region_mem is not None:
            mem = reg.region_mem.view(np.uint8, 0, size)
        else:
            assert self._ring is not None
            self._region_map = Mapping(size, fd=self._ring.fd, offset=int(reg.region.mmap_offset))
            mem = self._region_map.view(np.uint8, 0, size)
        o = reg.ifq.offsets
        return RefillRing(mem, o.head, o.tail, o.rqes, int(reg.ifq.rq_entries),
                          int(reg.area.rq_area_token))

    @property
    def offsets(self) -> tuple[int, int, int]:
        """(head, tail, rqes): the refill ring layout the kernel returned."""
        o = self._reg.ifq.offsets
        return int(o.head), int(o.tail), int(o.rqes)

    def attach(self, fd: int) -> None:
        """Receive from ``fd`` (registration does not need the socket, so it can come first)."""
        if self._ring is None:
            raise ClosedError.of(self, "attach")
        self.fd = fd

    # --- Provider protocol ------------------------------------------------------------------
    def can_arm(self) -> bool:
        if self._ring is None:
            raise ClosedError.of(self, "can_arm")
        return not self._starved

    def arm(self) -> None:
        if self._ring is None:
            raise ClosedError.of(self, "arm")
        prep_recv_zc(self._ring, self.fd, self.ifq_id, RECV_UD)
        self._ring.submit()
        self.armed = True

    def reap(self, timeout: float | None) -> Delivery:
        ring = self._ring
        if ring is None:
            raise ClosedError.of(self, "reap")
        out = parse_completions(reap_ready(ring, timeout))
        if out.end is not None or out.stopped:
            self.armed = False
            self._starved = out.stopped == "exhausted"
            if self._starved and not self.copy and (self.rq.held
                                                    or self.rq.space() < self.rq.entries):
                self._flush_all()  # buffers released before the stop wait unread in the ring
        return out

    def recycle(self, tokens: list[int], lengths: list[int]) -> None:
        if self._ring is None:  # closed: the refill ring is unmapped
            raise ClosedError.of(self, "recycle")
        n = self.rq.push(tokens, lengths)
        if (self.copy and n) or (not self.copy and self._starved):
            self._flush_all()
        # Otherwise (a device, not starved) its page pool reads the ring as it allocates.

    def _flush_all(self) -> None:
        """Return the ring's entries to the area's free list, then those held back, until none
        is held (the flush empties the ring). Copy mode needs this after every write. So does a
        device whose receive stopped with -ENOMEM: the kernel's copies take buffers from the
        free list, and a page pool that does not allocate (netdevsim forwards the sender's
        pages, so it copies every byte) never reads the ring."""
        while True:
            self._flush_rq()
            self._starved = False
            if not (self.rq.held and self.rq.push([], [])):
                return

    def _flush_rq(self) -> None:
        assert self._ring is not None
        self._ring.register(u.IORING_REGISTER_ZCRX_CTRL, self._flush, 0)

    def held_back(self) -> int:
        return self.rq.held

    def extra_stats(self) -> dict[str, int]:
        return {"refill_full": self.rq.full_events, "refill_held": self.rq.held,
                "rq_entries": self.rq.entries, "rx_buf_len": self.buf_len,
                "zcrx_copy": int(self.copy)}

    def close(self) -> None:
        ring, self._ring = self._ring, None
        try:
            if ring is not None and self.armed:
                cancel_multishot(ring, RECV_UD, CANCEL_UD)
                self.armed = False
        finally:
            if self._region_map is not None:
                self._region_map.close()
                self._region_map = None
            if ring is not None:
                ring.close()  # frees the ifq: the queue gets its normal page pool back
            self._reg.release()


def open_zcrx(fd: int, area_size: int, *, hugetlb: bool = False, dmabuf_fd: int | None = None,
              ifname: str | None = None, queue: int | None = None,
              rq_entries: int = 4096, user_region: bool = True, rx_buf_len: int = 0,
              copy: bool | None = None) -> ZcrxProvider:
    """A zcrx provider on the NIC queue that carries ``fd``'s flow (or ``ifname``/``queue``).

    ``copy``: None takes the device when it can do zcrx, else the kernel's copy mode where the
    kernel offers it (7.x); True: copy mode only; False: the device or a clear refusal.
    """
    offers = kernel_offers()
    if copy:
        return _open(fd, area_size, None, None, offers, hugetlb=hugetlb, dmabuf_fd=dmabuf_fd,
                     rq_entries=rq_entries, user_region=user_region, rx_buf_len=rx_buf_len)
    try:
        if ifname is None or queue is None:
            found_if, found_q = find_queue(fd)
            ifname = ifname or found_if
            queue = found_q if queue is None else queue
        return _open(fd, area_size, ifname, queue, offers, hugetlb=hugetlb,
                     dmabuf_fd=dmabuf_fd, rq_entries=rq_entries, user_region=user_region,
                     rx_buf_len=rx_buf_len)
    except Unsupported as e:
        if copy is None and not offers.copy_mode:
            e.message += "; this kernel has no zcrx copy mode to fall back to (7.x kernels)"
        if copy is False or not offers.copy_mode or dmabuf_fd is not None:
            raise
        why = e.message
    return _open(fd, area_size, None, None, offers, hugetlb=hugetlb, rq_entries=rq_entries,
                 user_region=user_region, rx_buf_len=rx_buf_len, why_copy=why)


def _open(fd: int, area_size: int, ifname: str | None, queue: int | None, offers: Offers, *,
          hugetlb: bool, dmabuf_fd: int | None = None, rq_entries: int, user_region: bool,
          rx_buf_len: int, why_copy: str = "") -> ZcrxProvider:
    if ifname is None:
        if not offers.copy_mode:
            raise Unsupported("this kernel has no zcrx copy mode (ZCRX_REG_NODEV, 7.x kernels) "
                              "and no device queue was given",
                              "pass ifname and queue of a zcrx-capable NIC, or use provider "
                              "'soft'")
        if dmabuf_fd is not None:
            raise UsageError("zcrx copy mode cannot fill a dma-buf area (the kernel's copy "
                             "writes through the CPU)", "leave dmabuf_fd out in copy mode")
    check_rx_buf_len(rx_buf_len, offers, ifname is None)
    area = Area(area_size, hugetlb=hugetlb, dmabuf_fd=dmabuf_fd)
    with contextlib.ExitStack() as undo:
        undo.callback(area.close)
        prov = ZcrxProvider(fd, area, ifname, queue, rq_entries=rq_entries,
                            user_region=user_region, rx_buf_len=rx_buf_len, why_copy=why_copy)
        undo.pop_all()
    return prov


__all__ = ["Offers", "RefillRing", "Registration", "ZcrxProvider", "kernel_offers", "open_zcrx",
           "parse_completions"]
