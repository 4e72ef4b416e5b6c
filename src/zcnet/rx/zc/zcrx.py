"""Provider "zcrx": io_uring zero-copy receive (IORING_REGISTER_ZCRX_IFQ + RECV_ZC).

Registration, its errors and what the kernel offers are in zcrx_reg.py; the CQE parse and the
refill ring in zcrx_rings.py; finding the NIC queue of a socket is in netqueue.py.

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
- On a device queue the NIC's page pool takes buffers from the refill ring as it allocates
  (io_pp_zc_alloc_netmems reads the ring first, the free list only when the ring is empty), so
  recycling is a ring write and nothing else. Only the kernel's copy fallback takes from the
  free list: a device that copies (upstream netdevsim forwards the sender's pages, so the
  kernel copies all of it) can run the free list dry while returned buffers wait in the ring
  for a pool that never allocates; such a stop (-ENOMEM) is answered with a flush.
- Where the kernel counts its copies (7.x, ZCRX_FEATURE_EVENT), registration places a
  ``struct zcrx_stats`` at the end of the refill region; ``kernel_copy()`` reads it.

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
import socket

import numpy as np

from zcnet.errors import ClosedError, Unsupported, UsageError
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.netqueue import find_queue
from zcnet.rx.zc.provider import (
    RECV_UD,
    CopyCount,
    Delivery,
    ProviderBase,
    close_ring,
    reap_ready,
)
from zcnet.rx.zc.provider import RING_FLAGS as PROVIDER_RING_FLAGS
from zcnet.rx.zc.zcrx_reg import (
    Offers,
    Registration,
    check_rx_buf_len,
    kernel_offers,
    kernel_stats_layout,
    memlock_error,
    no_stats_reason,
    register_ifq,
)
from zcnet.rx.zc.zcrx_rings import OFF_MASK, STOPS, RefillRing, parse_completions
from zcnet.uapi import io_uring as u
from zcnet.uring.mem import Mapping
from zcnet.uring.prep import prep_recv_zc
from zcnet.uring.ring import Ring

RING_FLAGS = PROVIDER_RING_FLAGS | u.IORING_SETUP_CQE32  # a zcrx CQE carries a 16-byte tail
MODES = ("device", "copy")
COPY_NOTE = ("copy mode: no device queue, the kernel copies every byte into the zcrx area "
             "(ZCRX_REG_NODEV); the zcrx protocol runs for real, zero copy does not")


class ZcrxProvider(ProviderBase):
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
                                       nodev=self.copy, rx_buf_len=rx_buf_len,
                                       stats=kernel_stats_layout())
        self._region_map: Mapping | None = None
        self._ring: Ring | None = None
        self._kstats: np.ndarray | None = None  # the kernel's zcrx_stats: copy count, bytes
        self._copied = (0, 0)                   # its last reading (kept after close)
        self._consumed: int | None = None       # the refill ring's kernel head, last read
        self.flushes = 0
        with contextlib.ExitStack() as undo:
            undo.callback(self.close, False)
            if err := memlock_error(self._reg.locked_bytes()):
                raise err
            self._ring = Ring(64, flags=RING_FLAGS, cq_entries=max(1024, 2 * rq_entries))
            register_ifq(self._ring, self._reg, ifname=ifname or "(no device, copy mode)")
            self.rq = self._map_refill_ring()
            self._consumed = 0
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
        if (at := reg.stats_offset) is not None:
            self._kstats = mem[at:at + 16].view(np.uint64)
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

    @property
    def ring(self) -> Ring | None:
        return self._ring

    def reap(self, timeout: float | None) -> Delivery:
        ring = self._ring
        if ring is None:
            raise ClosedError.of(self, "reap")
        out = parse_completions(reap_ready(ring, timeout), fast=self.rq.accel)
        if out.end is not None or out.stopped:
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
        free list, and a page pool that does not allocate (a device that copies) never reads
        the ring. A device that DMAs never stops so (its pool reads the ring): no flush."""
        while True:
            self._flush_rq()
            self._starved = False
            if not (self.rq.held and self.rq.push([], [])):
                return

    def _flush_rq(self) -> None:
        assert self._ring is not None
        self._ring.register(u.IORING_REGISTER_ZCRX_CTRL, self._flush, 0)
        self.flushes += 1

    def kernel_copy(self) -> CopyCount:
        """Bytes the kernel copied into the area, from its own counter (zcrx_stats)."""
        if self._reg.stats_offset is None:
            return CopyCount(None, no_stats_reason())
        self._read_region()
        return CopyCount(self._copied[1], "zcrx_stats.copy_bytes")

    def held_back(self) -> int:
        return self.rq.held

    def _read_region(self) -> None:
        """What the kernel wrote in the refill region: the ring's head, the copy counters
        (kept here, as the region is unmapped at close)."""
        if self._ring is None or self._consumed is None:
            return
        self._consumed = self.rq.kernel_head()
        if self._kstats is not None:
            self._copied = (int(self._kstats[0]), int(self._kstats[1]))

    def extra_stats(self) -> dict[str, int]:
        self._read_region()
        d = {"refill_full": self.rq.full_events, "refill_held": self.rq.held,
             "refill_produced": self.rq.produced, "refill_consumed": self._consumed or 0,
             "rq_entries": self.rq.entries, "rx_buf_len": self.buf_len,
             "zcrx_copy": int(self.copy), "zcrx_flushes": self.flushes}
        if self._reg.stats_offset is not None:
            d["zcrx_copy_count"] = self._copied[0]  # copy-fallback CQEs (zcrx_stats)
        return d

    def close(self, armed: bool = False) -> bool:
        self._read_region()  # the last readings, before the region goes
        ring, self._ring = self._ring, None
        region, self._region_map = self._region_map, None
        self._kstats = None
        with contextlib.ExitStack() as undo:
            undo.callback(self._reg.release)
            # Closing the ring frees the ifq: the queue gets its normal page pool back (the
            # kernel is done with the area then, whatever the cancel saw).
            if ring is not None:
                close_ring(ring, armed, *(() if region is None else (region.close,)))
            elif region is not None:
                region.close()
        return True


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


__all__ = ["OFF_MASK", "STOPS", "Offers", "RefillRing", "Registration", "ZcrxProvider",
           "kernel_offers", "open_zcrx", "parse_completions"]
