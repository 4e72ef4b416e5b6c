"""Provider "zcrx": io_uring zero-copy receive (IORING_REGISTER_ZCRX_IFQ + RECV_ZC).

Registration, its errors and what the kernel offers are in zcrx_reg.py; finding the NIC queue
of a socket is in netqueue.py.

Some facts about zcrx that shape this module:

- The ring must be SINGLE_ISSUER | DEFER_TASKRUN with 32-byte CQEs: each data CQE carries an
  ``io_uring_zcrx_cqe`` in its second half whose ``off`` is the byte offset in the area with the
  area id in the bits above IORING_ZCRX_AREA_SHIFT. The data is at ``area + (off & ~MASK)``.
- Registration takes the area (user memory or a dma-buf), and a "refill ring" region that is
  either our own page-aligned memory (IORING_MEM_REGION_TYPE_USER) or kernel memory we mmap at
  the ``mmap_offset`` the kernel returns. The kernel returns the ring layout in ``offsets``: a u32
  head, a u32 tail, then ``rq_entries`` 16-byte ``io_uring_zcrx_rqe``; we use what it returns.
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
- The refill ring's layout is whatever ``offsets`` says, and it changes between releases:
  a 7.2.13 registration returned head 0, tail 4, entries at 64; a 7.3.4 one head 0, tail 64,
  entries at 128 (head and tail on their own cache lines).
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct

import numpy as np

from zcnet.errors import ClosedError, Unsupported, UsageError
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.netqueue import find_queue
from zcnet.rx.zc.provider import RECV_UD, Delivery, close_ring, note_final, reap_ready
from zcnet.rx.zc.provider import RING_FLAGS as PROVIDER_RING_FLAGS
from zcnet.rx.zc.zcrx_reg import (
    Offers,
    Registration,
    check_rx_buf_len,
    kernel_offers,
    memlock_error,
    register_ifq,
)
from zcnet.uapi import io_uring as u
from zcnet.uring.mem import Mapping
from zcnet.uring.prep import prep_recv_zc
from zcnet.uring.ring import Completions, Ring

RING_FLAGS = PROVIDER_RING_FLAGS | u.IORING_SETUP_CQE32  # a zcrx CQE carries a 16-byte tail
OFF_MASK = (1 << u.IORING_ZCRX_AREA_SHIFT) - 1  # offset bits of a zcrx cqe/rqe ``off``
_OFF_MASK = np.uint64(OFF_MASK)
_NO_OFFS = np.zeros(0, dtype=np.uint64)
_NO_LENS = np.zeros(0, dtype=np.uint32)
_UD_BYTES: dict[int, bytes] = {}
# A final CQE's errno that does not end the stream: -ENOSPC is a CQ overflow (data intact).
# -ENOMEM: no free buffer in the area for the kernel's copy (the data waits in the socket).
STOPS = {errno.ENOSPC: "rearm", errno.ECANCELED: "rearm", errno.ENOMEM: "exhausted"}
MODES = ("device", "copy")
COPY_NOTE = ("copy mode: no device queue, the kernel copies every byte into the zcrx area "
             "(ZCRX_REG_NODEV); the zcrx protocol runs for real, zero copy does not")


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
        ring.view(np.uint32).reshape(entries, 4)[:, 3] = 0  # pad: zero once, never written
        self._tail = int(self._ktail[0])
        self._token = np.uint64(area_token)
        self._held_off = _NO_OFFS  # what did not fit yet, sent first next time
        self._held_len = _NO_LENS
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

    def push(self, offs: list[int] | np.ndarray, lens: list[int] | np.ndarray) -> int:
        """Queue buffers (their CQE ``off`` values and lengths, lists or arrays) for the
        kernel; returns how many were written now. The rest stay held and go first next time.

        Vectorized: the entries are written with a few slice operations (two where the ring
        wraps), no Python object per buffer for arrays."""
        o = np.asarray(offs, dtype=np.uint64)
        ln = np.asarray(lens, dtype=np.uint32)
        if len(self._held_off):
            o = np.concatenate((self._held_off, o))
            ln = np.concatenate((self._held_len, ln))
        total = len(o)
        n = min(self.space(), total)
        if n < total:
            self.full_events += 1
            self._held_off, self._held_len = o[n:].copy(), ln[n:].copy()
        elif len(self._held_off):
            self._held_off, self._held_len = _NO_OFFS, _NO_LENS
        if n:
            t = self._tail & self.mask
            k = min(n, self.entries - t)  # up to the ring's end, the rest from its start
            for lo, src in ((t, slice(0, k)), (0, slice(k, n))):
                m = src.stop - src.start
                if m:
                    dst = self._rqe_off[lo:lo + m]
                    np.bitwise_and(o[src], _OFF_MASK, out=dst)
                    np.bitwise_or(dst, self._token, out=dst)
                    self._rqe_len[lo:lo + m] = ln[src]
            self._tail = (self._tail + n) & 0xFFFFFFFF
            self._release_ktail()
            self.produced += n
        return n


def _repeated(user_data: int, n: int) -> bytes:
    """``n`` copies of ``user_data`` as the CQEs hold it (cached: one compare per round)."""
    b = _UD_BYTES.get(user_data, b"")
    if len(b) < 8 * n:
        b = _UD_BYTES[user_data] = struct.pack("<Q", user_data) * max(n, 1024)
    return b if len(b) == 8 * n else b[:8 * n]


def parse_completions(c: Completions, user_data: int = RECV_UD) -> Delivery:
    """Data fragments and the stream's state from CQE32 completions of one RECV_ZC.

    The common round (every CQE is data of our RECV_ZC) gives arrays with a fixed handful of
    numpy calls and no Python object per buffer: tokens (the CQEs' ``off``), offsets and
    lengths. Anything else (other user_data, the final CQE) takes the filtering path."""
    out = Delivery()
    n = len(c)
    if not n:
        return out
    extra = c.extra
    assert extra is not None, "zcrx needs a CQE32 ring"
    # Only the last CQE of a multishot can lack F_MORE, and every CQE that ends it lacks it:
    # with F_MORE on the last one every res is data.
    if c.flags.item(n - 1) & u.IORING_CQE_F_MORE and (
            c.user_data.tobytes() == _repeated(user_data, n)):
        off = extra[:, 0]
        out.tokens = off
        out.offsets = off & _OFF_MASK
        out.lengths = c.res
        return out
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
        region, self._region_map = self._region_map, None
        with contextlib.ExitStack() as undo:
            undo.callback(self._reg.release)
            # Closing the ring frees the ifq: the queue gets its normal page pool back.
            if ring is not None:
                close_ring(ring, self.armed, *(() if region is None else (region.close,)))
                self.armed = False
            elif region is not None:
                region.close()


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
