"""The kernel side of zcrx, faked faithfully enough to run the real ZcrxProvider on a host whose
kernel refuses zcrx on every device here.

What it copies from the kernel (io_uring/zcrx.c, 7.2), and what a registration in the VM showed:

- registration: the ring must be SINGLE_ISSUER|DEFER_TASKRUN|CQE32; reserved fields and zcrx_id
  zero; NODEV with if_idx/if_rxq 0; rq_entries rounded up to a power of two; the region at least
  ``rqes + 16 * rq_entries``; ``offsets`` exactly as real registrations returned them
  (``KERNEL_LAYOUTS``: 7.2.13 packs head and tail in one line, 7.3.4 gives each its own; the
  vm test checks the running kernel's against this table); ``rq_area_token`` = area id << 48;
  ``rx_buf_len`` written back.
- receive: each buffer (niov) of ``rx_buf_len`` bytes comes from the free list; one CQE32 per
  buffer with ``off`` = area id << 48 | niov * rx_buf_len; no free buffer ends the multishot with
  -ENOMEM, EOF with 0, an error with -errno.
- refill: the kernel reads ``tail`` at its offset, entries from ``head`` (its own) to tail at
  ``rqes + (i & mask) * 16``, and stores head at its offset. Device mode consumes entries when it
  refills (here: each wait; never with ``pool_reads_ring`` False, as on a device that copies);
  copy mode only on ZCRX_CTRL_FLUSH_RQ.
- eventfd (IORING_REGISTER_EVENTFD, one per ring, else EBUSY): signalled after an enter when
  CQEs wait or an armed receive's socket has more to deliver (the kernel's task work), which
  is what an event loop watching it needs.
- stats (7.x): an ``event_desc`` with ZCRX_EVENT_DESC_FLAG_STATS puts a ``struct zcrx_stats`` at
  ``stats_offset`` (8-byte aligned, past the entries, inside the region; EINVAL/ERANGE
  otherwise), zeroed; each buffer the kernel copies into (copy mode, or a device that copies)
  adds one to ``copy_count`` and its bytes to ``copy_bytes``.

Unlike the kernel (which skips or stops at a bad entry), every bad entry is recorded in
``rejections`` so a test can fail on it: wrong area id, offset past the area, a length that is
not the one delivered for that buffer (0 passes: the kernel ignores it), nonzero pad, a buffer
returned that the user did not hold, more entries than the ring holds.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from zcnet.rx.zc.area import PAGE_SIZE
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Completions

# (head, tail, rqes) that IORING_REGISTER_ZCRX_IFQ returned in the VM, by kernel release.
KERNEL_LAYOUTS = {"7.2.13": (0, 4, 64), "7.3.4": (0, 64, 128)}
CQE32 = struct.Struct("<QiIQQ")  # io_uring_cqe + io_uring_zcrx_cqe
REQUIRED_FLAGS = u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN | u.IORING_SETUP_CQE32
OFF_MASK = (1 << u.IORING_ZCRX_AREA_SHIFT) - 1
# Kernel-internal (io_uring/memmap.h), not uapi: the mmap offset of a kernel-allocated region.
ZCRX_REGION_MMAP_OFF = 0x30000000
ZCRX_REGION_ID_SHIFT = 16


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass
class Stream:
    """What the socket holds for the multishot: bytes, in segments as TCP would queue them."""

    data: bytes = b""
    segment: int = 1448
    per_wait: int = 64          # segments copied per wake-up
    end: int | None = None      # 0: EOF after the data, -errno: error after the data
    pos: int = 0


@dataclass
class FakeKernel:
    """Shared state of the fake: registrations, rejections, and the stream to deliver."""

    area_id: int = 0
    layout: tuple[int, int, int] = KERNEL_LAYOUTS["7.2.13"]
    stream: Stream = field(default_factory=Stream)
    #: Per-socket streams (by the fd a RECV_ZC names); a socket not here reads ``stream``.
    streams: dict[int, Stream] = field(default_factory=dict)
    rejections: list[str] = field(default_factory=list)
    rings: list[FakeRing] = field(default_factory=list)
    foreign_every: int = 0      # post a data CQE of another request every N wake-ups
    # Device mode: the page pool reads the refill ring as it allocates (each wait here). False
    # is a device that copies (upstream netdevsim forwards the sender's pages): its pool never
    # allocates, so never reads the ring, and the kernel copies every byte.
    pool_reads_ring: bool = True
    stats: bool = True          # the kernel has zcrx stats (7.x); False: EINVAL on event_desc
    next_id: int = 0
    #: Device queues an ifq holds: a second registration there is EEXIST (the queue already
    #: has a memory provider: __netif_mp_open_rxq).
    bound: set[tuple[int, int]] = field(default_factory=set)

    def ring_class(self) -> Callable[..., FakeRing]:
        def make(entries: int = 64, *, flags: int = 0, cq_entries: int | None = None) -> FakeRing:
            ring = FakeRing(self, entries, flags, cq_entries)
            self.rings.append(ring)
            return ring
        return make

    @property
    def ring(self) -> FakeRing:
        return self.rings[-1]


class FakeRing:
    """Stands in for zcnet.uring.ring.Ring as ZcrxProvider uses it."""

    def __init__(self, kernel: FakeKernel, entries: int, flags: int,
                 cq_entries: int | None) -> None:
        self.k = kernel
        self.flags = flags
        self.cq_entries = cq_entries or 2 * entries
        self.fd = os.memfd_create("fake-zcrx-ring", os.MFD_CLOEXEC)  # mmap target of a region
        # Below the regions the ring fd maps the SQ/CQ rings and the SQEs (IORING_OFF_SQ_RING 0,
        # IORING_OFF_SQES): other memory, not a fault (sparse: untouched, it costs nothing).
        os.ftruncate(self.fd, ZCRX_REGION_MMAP_OFF)
        self.cq: list[tuple[int, int, int, int]] = []
        # The armed multishot RECV_ZCs: user_data -> [socket fd, byte cap (0: none), delivered].
        # Any number may share the ifq, as in the kernel (io_recvzc_prep keeps nothing per
        # socket).
        self.reqs: dict[int, list[int]] = {}
        self.sock_fd = -1               # the socket of the last RECV_ZC armed
        self.registered = False
        self.closed = False
        self.flushes = 0
        self.waits = 0
        self.wait_timeouts: list[float | None] = []  # what each waiting submit was given
        self.efd = -1                   # the registered eventfd
        self._mm: mmap.mmap | None = None
        self._dmabuf_mm: mmap.mmap | None = None

    # --- registration ----------------------------------------------------------------------
    def register(self, opcode: int, arg: object, nr_args: int) -> int:
        ctypes.c_uint(nr_args)  # what the real syscall wrapper passes: a TypeError if not an int
        if opcode == u.IORING_REGISTER_ZCRX_IFQ:
            assert isinstance(arg, u.io_uring_zcrx_ifq_reg) and nr_args == 1
            return self._register_ifq(arg)
        if opcode == u.IORING_REGISTER_ZCRX_CTRL:
            assert isinstance(arg, u.zcrx_ctrl)
            if nr_args or any(getattr(arg, "__resv")) or arg.zcrx_id != self.zcrx_id:
                raise _err(errno.EINVAL)
            if arg.op != u.ZCRX_CTRL_FLUSH_RQ or any(getattr(arg.zc_flush, "__resv")):
                raise _err(errno.EINVAL)
            self.flushes += 1
            self._consume_refill()
            return 0
        if opcode == u.IORING_REGISTER_EVENTFD:
            if self.efd >= 0:
                raise _err(errno.EBUSY)
            assert isinstance(arg, ctypes.c_int32) and nr_args == 1
            self.efd = arg.value
            return 0
        if opcode == u.IORING_UNREGISTER_EVENTFD:
            if self.efd < 0:
                raise _err(errno.ENXIO)
            self.efd = -1
            return 0
        raise _err(errno.EINVAL)

    def _register_ifq(self, reg: u.io_uring_zcrx_ifq_reg) -> int:
        if self.flags & REQUIRED_FLAGS != REQUIRED_FLAGS:
            raise _err(errno.EINVAL)
        if any(getattr(reg, "__resv")) or reg.zcrx_id or self.registered:
            raise _err(errno.EINVAL)
        if reg.event_desc and not self.k.stats:
            raise _err(errno.EINVAL)  # before 7.x this is __resv[0]
        if reg.flags & ~u.ZCRX_REG_NODEV or not reg.rq_entries:
            raise _err(errno.EINVAL)
        self.nodev = bool(reg.flags & u.ZCRX_REG_NODEV)
        if self.nodev and (reg.if_idx or reg.if_rxq):
            raise _err(errno.EINVAL)
        self.queue = None if self.nodev else (int(reg.if_idx), int(reg.if_rxq))
        if self.queue in self.k.bound:
            raise _err(errno.EEXIST)
        entries = 1 << (reg.rq_entries - 1).bit_length()
        area = u.io_uring_zcrx_area_reg.from_address(reg.area_ptr)
        rd = u.io_uring_region_desc.from_address(reg.region_ptr)
        self.HEAD, self.TAIL, self.RQES = self.k.layout
        if rd.size < self.RQES + 16 * entries:
            raise _err(errno.EINVAL)
        buf_len = reg.rx_buf_len or PAGE_SIZE
        if self.nodev and buf_len != PAGE_SIZE:
            raise _err(errno.EOPNOTSUPP)
        if area.flags == u.IORING_ZCRX_AREA_DMABUF:
            # A dma-buf area: addr is the offset into the buffer (0 here); only a device can
            # fill it, so copy mode has none.
            if self.nodev or area.addr or os.lseek(area.dmabuf_fd, 0, os.SEEK_END) < area.len:
                raise _err(errno.EINVAL)
        elif area.flags or area.addr % PAGE_SIZE:
            raise _err(errno.EINVAL)
        if area.len % buf_len:
            raise _err(errno.EINVAL)
        self.user_region = bool(rd.flags & u.IORING_MEM_REGION_TYPE_USER)
        if self.user_region:
            raw = (ctypes.c_char * rd.size).from_address(rd.user_addr)
            self.region = np.frombuffer(raw, dtype=np.uint8)
        else:
            # Where the kernel puts it (io_uring/memmap.h: IORING_MAP_OFF_ZCRX_REGION, the
            # ifq id above IORING_OFF_ZCRX_SHIFT): a mapping at any other offset is other memory.
            offset = ZCRX_REGION_MMAP_OFF | self.k.next_id << ZCRX_REGION_ID_SHIFT
            os.ftruncate(self.fd, offset + rd.size)  # sparse: only the region is ever touched
            self._mm = mmap.mmap(self.fd, rd.size, offset=offset)
            self.region = np.frombuffer(self._mm, dtype=np.uint8)
            rd.mmap_offset = offset
        self.region[:self.RQES] = 0
        self.stats_at: int | None = None
        if reg.event_desc:
            ev = u.zcrx_event_desc.from_address(reg.event_desc)
            if ev.flags != u.ZCRX_EVENT_DESC_FLAG_STATS or ev.type_mask or ev.stats_offset % 8:
                raise _err(errno.EINVAL)
            if not self.RQES + 16 * entries <= ev.stats_offset <= rd.size - 16:
                raise _err(errno.ERANGE)
            self.stats_at = int(ev.stats_offset)
            self.region[self.stats_at:self.stats_at + 16] = 0
        self.entries, self.buf_len = entries, buf_len
        if area.flags:  # the "device" writes the dma-buf through a mapping of its own
            self._dmabuf_mm = mmap.mmap(area.dmabuf_fd, area.len)
            self.area = np.frombuffer(self._dmabuf_mm, dtype=np.uint8)
        else:
            self.area = np.frombuffer((ctypes.c_char * area.len).from_address(area.addr),
                                      dtype=np.uint8)
        self.niovs = area.len // buf_len
        # A stack like the kernel's freelist: the next buffer is the last one returned.
        self.free = list(range(self.niovs))
        self.user_len = [0] * self.niovs   # bytes the user holds in each buffer (0: not held)
        self.head = 0                      # the kernel's cached head
        area.rq_area_token = self.k.area_id << u.IORING_ZCRX_AREA_SHIFT
        reg.rq_entries = entries
        reg.offsets.head, reg.offsets.tail, reg.offsets.rqes = self.k.layout
        reg.zcrx_id = self.zcrx_id = self.k.next_id
        self.k.next_id += 1
        reg.rx_buf_len = buf_len
        self.registered = True
        if self.queue is not None:
            self.k.bound.add(self.queue)
        return 0

    # --- refill ring: read where the kernel reads ------------------------------------------
    def _u32(self, at: int) -> int:
        return int(self.region[at:at + 4].view(np.uint32)[0])

    def _consume_refill(self) -> None:
        tail = self._u32(self.TAIL)
        n = (tail - self.head) & 0xFFFFFFFF
        if n > self.entries:
            self.k.rejections.append(f"{n} entries queued in a ring of {self.entries}")
            n = self.entries
        for i in range(n):
            at = self.RQES + ((self.head + i) & (self.entries - 1)) * 16
            off, ln, pad = struct.unpack_from("<QII", self.region, at)
            self._return(off, ln, pad)
        self.head = (self.head + n) & 0xFFFFFFFF
        self.region[self.HEAD:self.HEAD + 4].view(np.uint32)[0] = self.head

    def _return(self, off: int, ln: int, pad: int) -> None:
        area_id, offset = off >> u.IORING_ZCRX_AREA_SHIFT, off & OFF_MASK
        if pad:
            self.k.rejections.append(f"pad {pad:#x} in refill entry {off:#x}")
            return
        if area_id != self.k.area_id:
            self.k.rejections.append(f"area id {area_id} (registered {self.k.area_id})")
            return
        niov = offset // self.buf_len
        if niov >= self.niovs:
            self.k.rejections.append(f"offset {offset:#x} past the area")
            return
        if not self.user_len[niov]:
            self.k.rejections.append(f"buffer {niov} returned but not held by the user")
            return
        if ln and ln != self.user_len[niov]:  # 0: what zcnet writes for buffers released
            # after their connection left; the kernel reads only off (io_parse_rqe)
            self.k.rejections.append(f"buffer {niov} returned with length {ln}, delivered "
                                     f"{self.user_len[niov]}")
            return
        self.user_len[niov] = 0
        self.free.append(niov)

    # --- the data path ------------------------------------------------------------------------
    def prep(self, opcode: int, fd: int = -1, addr: int = 0, length: int = 0, off: int = 0,
             user_data: int = 0, *, ioprio: int = 0, file_index: int = 0, **_: int) -> int:
        if opcode == u.IORING_OP_RECV_ZC:
            ok = (ioprio == u.IORING_RECV_MULTISHOT and file_index == self.zcrx_id
                  and user_data not in self.reqs and fd >= 0)
            if not ok:
                self.cq.append((user_data, -errno.EINVAL, 0, 0))
                return 0
            self.reqs[user_data] = [fd, length, 0]
            self.sock_fd = fd
        elif opcode == u.IORING_OP_ASYNC_CANCEL:
            if addr in self.reqs:
                self.cq.append((addr, -errno.ECANCELED, 0, 0))
                del self.reqs[addr]
                self.cq.append((user_data, 0, 0, 0))
            else:
                self.cq.append((user_data, -errno.ENOENT, 0, 0))
        else:
            raise AssertionError(f"zcrx provider prepared opcode {opcode}")
        return 0

    def submit(self, wait_nr: int = 0, timeout: float | None = None) -> int:
        if wait_nr:
            self.wait_timeouts.append(timeout)
        if wait_nr and not self.cq:
            self._wake()
        self._signal()
        return 0

    def get_events(self) -> None:
        """An enter that only runs the task work: what a wait lets the kernel do."""
        if not self.cq:
            self._wake()
        self._signal()

    def _signal(self) -> None:
        """The registered eventfd hears of CQEs waiting and of data an armed receive has yet
        to take (the next wait delivers it)."""
        if self.efd >= 0 and (self.cq or any(self._pending(ud) for ud in self.reqs)):
            os.eventfd_write(self.efd, 1)

    def _pending(self, ud: int) -> bool:
        s = self.k.streams.get(self.reqs[ud][0], self.k.stream)
        return s is not None and (s.pos < len(s.data) or s.end is not None)

    def _wake(self) -> None:
        """What a wait lets the kernel do: refill (device mode), then copy queued segments."""
        self.waits += 1
        if not self.nodev and self.k.pool_reads_ring:
            self._consume_refill()
        k = self.k
        if k.foreign_every and self.waits % k.foreign_every == 0:
            # Another request's CQEs carry data and end: they are not ours.
            self.cq.append((77, 4096, u.IORING_CQE_F_MORE, 5 << 12))
            self.cq.append((78, 100, 0, 6 << 12))
        for ud in list(self.reqs):
            if ud in self.reqs:
                self._serve(ud)

    def _serve(self, ud: int) -> None:
        """One request's turn: up to ``per_wait`` segments of its socket's stream, each in a
        buffer of its own, within its byte cap (reached: res 0 and no F_MORE, as EOF)."""
        k = self.k
        fd, cap, _ = req = self.reqs[ud]
        s = k.streams.get(fd, k.stream)
        for _ in range(s.per_wait):
            if s.pos >= len(s.data):
                break
            if not self.free:
                if not any(u_ == ud for u_, *_ in self.cq):
                    self._final(ud, -errno.ENOMEM)
                return
            n = min(s.segment, self.buf_len)
            if cap:
                n = min(n, cap - req[2])
            seg = s.data[s.pos:s.pos + n]
            niov = self.free.pop()
            base = niov * self.buf_len
            self.area[base:base + len(seg)] = np.frombuffer(seg, dtype=np.uint8)
            self.user_len[niov] = len(seg)
            if self.stats_at is not None and (self.nodev or not k.pool_reads_ring):
                st = self.region[self.stats_at:self.stats_at + 16].view(np.uint64)
                st += np.array([1, len(seg)], dtype=np.uint64)
            self.cq.append((ud, len(seg), u.IORING_CQE_F_MORE,
                            k.area_id << u.IORING_ZCRX_AREA_SHIFT | base))
            s.pos += len(seg)
            req[2] += len(seg)
            if cap and req[2] >= cap:
                self._final(ud, 0)
                return
        if s.pos >= len(s.data) and s.end is not None:
            self._final(ud, s.end)

    @property
    def armed(self) -> int | None:
        """The user_data of the first armed RECV_ZC (None: none armed); set None: every armed
        receive ends without a CQE (a test that posts the final itself)."""
        return next(iter(self.reqs), None)

    @armed.setter
    def armed(self, value: None) -> None:
        assert value is None
        self.reqs.clear()

    def _final(self, ud: int, res: int) -> None:
        self.cq.append((ud, res, 0, 0))
        del self.reqs[ud]

    def cq_ready(self) -> int:
        return len(self.cq)

    def reap(self, max_n: int | None = None) -> Completions:
        """The CQEs as CQE32 memory read back through the ring's own views."""
        if max_n is None:
            take, self.cq = self.cq, []
        else:
            take, self.cq = self.cq[:max_n], self.cq[max_n:]
        mem = np.zeros(len(take) * 32, dtype=np.uint8)
        for i, (ud, res, flags, off) in enumerate(take):
            CQE32.pack_into(mem, i * 32, ud, res, flags, off, 0)
        u64 = mem.view(np.uint64).reshape(-1, 4)
        u32 = mem.view(np.uint32).reshape(-1, 8)
        return Completions(user_data=u64[:, 0].copy(), res=u32.view(np.int32)[:, 2].copy(),
                           flags=u32[:, 3].copy(), extra=u64[:, 2:4].copy())

    def close(self) -> None:
        """The ring goes and with it the ifq: the user's pages are unpinned."""
        self.closed = True
        if self.registered and self.queue is not None:
            self.k.bound.discard(self.queue)
        self.region = np.empty(0, np.uint8)
        self.area = np.empty(0, np.uint8)
        for mm in (self._mm, self._dmabuf_mm):
            if mm is not None:
                mm.close()
        os.close(self.fd)

    # --- what tests read ------------------------------------------------------------------------
    @property
    def free_count(self) -> int:
        return len(self.free)


def install_copy_mode(monkeypatch) -> FakeKernel:  # type: ignore[no-untyped-def]
    """A FakeKernel behind zcnet's zcrx queues, offering copy mode (a 7.x kernel's offers and
    its stats layout), through ``monkeypatch`` (pytest's)."""
    from zcnet.rx.zc import zcrx, zcrx_queue, zcrx_rings
    from zcnet.rx.zc.zcrx_reg import Offers, StatsLayout

    k = FakeKernel()
    monkeypatch.setattr(zcrx_rings, "Ring", k.ring_class())  # queue_ring makes it
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: Offers(
        u.ZCRX_REG_IMPORT | u.ZCRX_REG_NODEV, u.ZCRX_FEATURE_RX_PAGE_SIZE, 3))
    monkeypatch.setattr(zcrx_queue, "kernel_stats_layout", lambda: StatsLayout(16, 8))
    return k
