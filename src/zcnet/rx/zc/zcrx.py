"""Provider "zcrx": io_uring zero-copy receive (IORING_REGISTER_ZCRX_IFQ + RECV_ZC).

A ZcrxProvider is one connection's receive through a ZcrxQueue (zcrx_queue.py: the ifq, its
ring and area, shared by every connection on that NIC queue). Registration, its errors and what
the kernel offers are in zcrx_reg.py; the CQE parse and the refill ring in zcrx_rings.py;
finding the NIC queue of a socket is in netqueue.py.

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
import os
import socket
from collections.abc import Sized

import numpy as np

from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError
from zcnet.nic.arrival import WrongQueue
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.netqueue import find_queue
from zcnet.rx.zc.provider import (
    CANCEL_UD,
    RECV_UD,
    CopyCount,
    Delivery,
    ProviderBase,
    build_or_close,
)
from zcnet.rx.zc.zcrx_export import ZcrxExport, export_zcrx_queue
from zcnet.rx.zc.zcrx_queue import (
    COPY_NOTE,
    MEMBER_BITS,
    ZcrxQueue,
    find_open,
    queue_key,
)
from zcnet.rx.zc.zcrx_reg import (
    Offers,
    Registration,
    check_rx_buf_len,
    kernel_offers,
    no_stats_reason,
    register_ifq,
)
from zcnet.rx.zc.zcrx_rings import (
    OFF_MASK,
    RING_FLAGS,
    STOPS,
    RefillRing,
    parse_completions,
    total_bytes,
)
from zcnet.uapi import io_uring as u
from zcnet.uring.completions import Completions
from zcnet.uring.members import concat
from zcnet.uring.prep import prep_recv_zc
from zcnet.uring.ring import Ring

MODES = ("device", "copy")
_CAP_MAX = 0xFFFFFFFF  # sqe len is a u32: a larger share is no cap at all


def _of_queue(name: str) -> property:  # type: ignore[type-arg]
    """A read-only attribute of the connection's ZcrxQueue, under the provider's name."""
    return property(lambda self: getattr(self.zq, name), doc=f"The queue's ``{name}``.")


class ZcrxProvider(ProviderBase):
    """One connection's receive through a ZcrxQueue: the Provider its Receiver drives. Every
    call comes from the queue's thread (the Receiver's owner).

    Built as ``ZcrxProvider(fd, area, ifname, queue, ...)`` it opens a queue of its own on
    ``area`` (``ifname`` None: copy mode), closed with it; ``ZcrxQueue.join(fd)`` gives one on a
    queue shared with other connections.
    """

    name = "zcrx"

    def __init__(self, fd: int, area: Area, ifname: str | None, queue: int | None, *,
                 rq_entries: int = 4096, user_region: bool = True, rx_buf_len: int = 0,
                 why_copy: str = "") -> None:
        zq = ZcrxQueue(area, ifname, queue, rq_entries=rq_entries, user_region=user_region,
                       rx_buf_len=rx_buf_len, why_copy=why_copy)
        build_or_close(lambda: self._join(zq, fd), zq.close)

    @classmethod
    def joining(cls, zq: ZcrxQueue, fd: int) -> ZcrxProvider:
        m = cls.__new__(cls)
        m._join(zq, fd)
        return m

    def _join(self, zq: ZcrxQueue, fd: int) -> None:
        self.zq = zq
        self.fd = fd
        self.mid = mid = zq.add(self)
        self.ud = mid << MEMBER_BITS | RECV_UD
        self.cancel_ud = mid << MEMBER_BITS | CANCEL_UD
        self.area = zq.area
        self.inbox: list[Completions] = []
        self.armed = False
        self.cancelling = False
        self.cap = 0          # bytes the armed receive may deliver (0: no cap)
        self.since_arm = 0    # bytes it delivered so far
        self.held = 0         # buffers delivered and not given back
        self.cap_stops = 0
        self.left = False     # closed (this connection)
        self.queue_gone = False  # the queue closed under an open connection
        self.ended = False    # its stream ended (EOF or an error)
        self._released: Sized = ()  # its receiver's released chunks, not yet given back
        self._has_receiver = self._area_released = False
        c = zq.copied()
        self._copied_at_join = 0 if c is None else c[1]
        try:
            self._check_queue()
        except WrongQueue:
            self.left = True
            zq.leave(self)
            self.area_done(self.area)
            raise
        zq.recap()

    # Read-outs of the queue, under the names a single-connection provider always had.
    @property
    def note(self) -> str:
        n = len(self.zq.members)
        return self.zq.note + (f", shared by {n} connections" if n > 1 else "")

    copy = _of_queue("copy")
    mode = _of_queue("mode")
    ifname = _of_queue("ifname")
    queue = _of_queue("queue")
    rq = _of_queue("rq")
    ifq_id = _of_queue("ifq_id")
    buf_len = _of_queue("buf_len")
    flushes = _of_queue("flushes")
    reg = _of_queue("reg")  # the structs the kernel read and wrote back

    @property
    def offsets(self) -> tuple[int, int, int]:
        """(head, tail, rqes): the refill ring layout the kernel returned."""
        o = self.zq.reg.ifq.offsets
        return int(o.head), int(o.tail), int(o.rqes)

    @property
    def ring(self) -> Ring | None:
        return None if self.left else self.zq.ring

    def attach(self, fd: int) -> None:
        """Receive from ``fd`` (registration does not need the socket, so it can come first)."""
        self._live("attach")
        self.fd = fd
        self._check_queue()
        self._bound_socket()

    def _check_queue(self) -> None:
        """A connection that arrived on another NIC queue than this one's cannot receive
        through its ifq (the kernel ends its receive with -EFAULT at the first foreign buffer):
        refused before the first arm, where its queue is known (SO_INCOMING_NAPI_ID)."""
        zq = self.zq
        if zq.copy or self.fd < 0:
            return
        try:
            where = find_queue(self.fd)
        except (ZcnetError, OSError):  # no packet yet, or loopback: the queue is unknown
            return
        if where != (zq.ifname, zq.queue):
            raise WrongQueue(
                f"the connection on fd {self.fd} arrived on {where[0]} queue {where[1]}, not on "
                f"{zq.where}, whose zcrx queue it joined",
                f"steer its port to {zq.where} (`zcnet nic setup {zq.ifname} --queues "
                f"{zq.queue} --port PORT`), or join the zcrx queue of {where[0]} queue "
                f"{where[1]}", where[0], where[1])

    def _bound_socket(self) -> None:
        """On a shared device queue, bound what waits in the socket to the other half of its
        budget: those skbs hold the queue's buffers (copy mode queues kernel memory)."""
        zq = self.zq
        if self.fd < 0 or zq.copy or not zq.capping():
            return
        dup = os.dup(self.fd)
        try:
            s = socket.socket(fileno=dup)
        except OSError:  # not a socket (a test's socketpair stand-in): nothing to bound
            os.close(dup)
            return
        with s:  # the kernel doubles what it is given (skb overhead)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF,
                         (zq.budget() - zq.share()) * zq.buf_len // 2)

    def _live(self, method: str) -> None:
        if self.left:
            raise ClosedError.of(self, method)
        if self.queue_gone:
            raise ClosedError(f"{method}(): the zcrx queue {self.zq.where} was closed with "
                              "this connection open", "open a new queue and receiver")

    # --- Provider protocol ------------------------------------------------------------------
    def can_arm(self) -> bool:
        self._live("can_arm")
        return self._may_arm()

    def _may_arm(self) -> bool:
        """Buffers to arm with: the queue's free list was not found dry since the last flush,
        and (capped) this connection holds less than its share."""
        zq = self.zq
        return not zq.starved and (not zq.capping() or self.held < zq.share())

    def arm(self) -> None:
        self._live("arm")
        zq = self.zq
        cap = 0
        if zq.capping():
            # What is left of its share in buffers, in bytes as buffers are being filled.
            cap = max(1, int((zq.share() - self.held) * zq.fill()))
            if cap > _CAP_MAX:
                cap = 0
        assert zq.ring is not None
        prep_recv_zc(zq.ring, self.fd, zq.ifq_id, self.ud, cap)
        zq.ring.submit()
        self.cap, self.since_arm, self.armed, self.cancelling = cap, 0, True, False

    def reap(self, timeout: float | None) -> Delivery:
        if self.left:
            raise ClosedError.of(self, "reap")
        zq = self.zq
        if not self.inbox:
            if self.queue_gone:
                self._live("reap")
            zq.pump(timeout)
            if not self.inbox:
                return Delivery()
        inbox = self.inbox
        c = inbox[0] if len(inbox) == 1 else concat(inbox)
        inbox.clear()
        out = parse_completions(c, self.ud, fast=zq.rq.accel)
        if (n := len(out.tokens)) and zq.rq.area_starts is not None:
            out.offsets = zq.rq.virtual(out.tokens)  # added areas: offsets in the one range
        if n:
            self.held += n
            if self.cap:  # bytes only count for a capped receive (its end, the fill)
                nbytes = total_bytes(out.lengths, zq.rq.accel)
                zq.seen_cqes += n
                zq.seen_bytes += nbytes
                self.since_arm += nbytes
        if out.end is not None or out.stopped:
            self._ended(out)
        return out

    def _ended(self, out: Delivery) -> None:
        """The receive's final CQE: a reached cap (res 0 after exactly ``cap`` bytes) is a
        stop to re-arm, not EOF."""
        self.armed = self.cancelling = False
        if out.end == 0 and self.cap and self.since_arm >= self.cap:
            out.end, out.stopped = None, "rearm"
            self.cap_stops += 1
        self.ended = out.end is not None
        zq = self.zq
        if out.stopped == "exhausted":
            zq.starved = True
            if not zq.copy and (zq.rq.held or zq.rq.space() < zq.rq.entries):
                zq.flush_all()  # buffers released before the stop wait unread in the ring

    def watch_releases(self, released: Sized) -> None:
        self._released = released
        self._has_receiver = True

    def due(self) -> bool:
        """Its receiver has work: completions to take, chunks released to give back, or a
        receive it may arm again."""
        if self.left:
            raise ClosedError.of(self, "due")
        if self.inbox or self._released:
            return True
        return not (self.armed or self.ended or self.queue_gone) and self._may_arm()

    def _take_final(self) -> None:
        """While closing: drop the inbox (its data goes back unread) and note the final CQE."""
        inbox, self.inbox = self.inbox, []
        for c in inbox:
            self.zq._give_back_unread(c)
            mine = (c.user_data == self.ud) & ((c.flags & u.IORING_CQE_F_MORE) == 0)
            if mine.any():
                self.armed = self.cancelling = False

    def recycle(self, tokens: list[int] | np.ndarray, lengths: list[int] | np.ndarray) -> None:
        if self.left:  # closed: the refill ring may be unmapped
            raise ClosedError.of(self, "recycle")
        self.held -= len(tokens)
        if self.queue_gone:  # its queue closed under it: back through another ring of the
            mem = self.zq.mem  # ifq; with none, the kernel took every buffer back already
            if not mem.gone:
                mem.closed_tokens.append(np.asarray(tokens, dtype=np.uint64).tolist())
            return
        self.zq.recycle(tokens, lengths)

    def held_back(self) -> int:
        return self.zq.rq.held

    def kernel_copy(self) -> CopyCount:
        """Bytes the kernel copied for this connection: the queue's counter (zcrx_stats) since
        it joined, exact while it had the queue to itself or the kernel copied nothing."""
        zq = self.zq
        c = zq.copied()
        if c is None:
            return CopyCount(None, no_stats_reason())
        copied = c[1] - self._copied_at_join
        if not zq.capping() or copied == 0:
            return CopyCount(copied, "zcrx_stats.copy_bytes")
        if zq.copy:
            return CopyCount(None, "zcrx copy mode: the kernel copies every byte", True)
        return CopyCount(None, "zcrx_stats counts the whole queue, which other connections "
                               "shared")

    def extra_stats(self) -> dict[str, int]:
        d = self.zq.stats()
        d.update(zcrx_held=self.held, zcrx_cap_stops=self.cap_stops)
        return d

    def quiesce(self, armed: bool) -> bool:
        if self.left or self.queue_gone or self.zq.closed:
            return True
        self._take_final()
        return not self.armed or self.zq._cancel([self])

    def recycle_closed(self, tokens: list[int]) -> None:
        mem = self.zq.mem
        if not mem.gone:  # else the kernel took them back when the ifq went
            mem.closed_tokens.append(tokens)

    def area_done(self, area: Area) -> None:
        if not self._area_released:  # once per connection
            self._area_released = True
            self.zq.area_user_done()

    def close(self, armed: bool = False) -> bool:
        if self.left:
            return not self.armed
        ok = self.quiesce(armed)
        self._take_final()
        self.left = True
        self.zq.leave(self)
        if not self._has_receiver:  # nothing will hold its chunks: its part of the area goes
            self.area_done(self.area)
        return ok or self.zq.closed


ZcrxQueue.member_cls = ZcrxProvider

def open_zcrx(fd: int, area_size: int, *, hugetlb: bool = False, dmabuf_fd: int | None = None,
              ifname: str | None = None, queue: int | None = None,
              rq_entries: int = 4096, user_region: bool = True, rx_buf_len: int = 0,
              copy: bool | None = None) -> ZcrxProvider:
    """A zcrx provider on the NIC queue that carries ``fd``'s flow (or ``ifname``/``queue``).

    ``copy``: None takes the device when it can do zcrx, else the kernel's copy mode where the
    kernel offers it (7.x); True: copy mode only; False: the device or a clear refusal.
    A queue this thread already receives (a ZcrxQueue, or another connection's provider) is
    joined, not registered again (that would be EEXIST); its area and settings apply. Copy mode
    joins only a queue opened with ``open_zcrx_queue``.
    """
    return _provider(fd, area_size, hugetlb=hugetlb, dmabuf_fd=dmabuf_fd, ifname=ifname,
                     queue=queue, rq_entries=rq_entries, user_region=user_region,
                     rx_buf_len=rx_buf_len, copy=copy, shared=False)  # type: ignore[return-value]


def open_zcrx_queue(area_size: int, *, hugetlb: bool = False, dmabuf_fd: int | None = None,
                    ifname: str | None = None, queue: int | None = None,
                    rq_entries: int = 4096, user_region: bool = True, rx_buf_len: int = 0,
                    copy: bool | None = None, area_capacity: int | None = None,
                    cqe_mixed: bool = False) -> ZcrxQueue:
    """A zcrx queue for many connections (a server's): ``ifname``/``queue`` of a NIC, or copy
    mode (``copy`` as in open_zcrx; no device given: copy mode). Each connection joins it with
    ``join(fd)`` (or ``open_zcrx`` on one of its sockets, in this thread); it stays open until
    ``close()``. Every receive on it is capped to its connection's share of the area.
    ``area_capacity``: address space reserved for areas added later (``add_area``, Linux 7.3;
    zcnet.rx.zc.zcrx_areas). ``cqe_mixed``: the queue's ring takes IORING_SETUP_CQE_MIXED
    (Linux 6.18) instead of CQE32: a RECV_ZC completion is 32 bytes, any other 16."""
    if ifname is None and queue is None and copy is None:
        copy = True
    return _provider(-1, area_size, hugetlb=hugetlb, dmabuf_fd=dmabuf_fd, ifname=ifname,
                     queue=queue, rq_entries=rq_entries, user_region=user_region,
                     rx_buf_len=rx_buf_len, copy=copy, shared=True,
                     area_capacity=area_capacity,
                     cqe_mixed=cqe_mixed)  # type: ignore[return-value]


def _provider(fd: int, area_size: int, *, hugetlb: bool, dmabuf_fd: int | None,
              ifname: str | None, queue: int | None, rq_entries: int, user_region: bool,
              rx_buf_len: int, copy: bool | None, shared: bool,
              area_capacity: int | None = None,
              cqe_mixed: bool = False) -> ZcrxProvider | ZcrxQueue:
    """open_zcrx (a provider on ``fd``) or, ``shared``, open_zcrx_queue (the queue)."""
    offers = kernel_offers()
    kw = {"hugetlb": hugetlb, "rq_entries": rq_entries, "user_region": user_region,
          "rx_buf_len": rx_buf_len, "shared": shared, "area_capacity": area_capacity,
          "cqe_mixed": cqe_mixed}
    if copy:
        return _open(fd, area_size, None, None, offers, dmabuf_fd=dmabuf_fd, **kw)
    try:
        if ifname is None or queue is None:
            found_if, found_q = find_queue(fd)
            ifname = ifname or found_if
            queue = found_q if queue is None else queue
        return _open(fd, area_size, ifname, queue, offers, dmabuf_fd=dmabuf_fd, **kw)
    except Unsupported as e:
        if copy is None and not offers.copy_mode:
            e.message += "; this kernel has no zcrx copy mode to fall back to (7.x kernels)"
        if copy is False or not offers.copy_mode or dmabuf_fd is not None:
            raise
        why = e.message
    return _open(fd, area_size, None, None, offers, why_copy=why, **kw)


def _open(fd: int, area_size: int, ifname: str | None, queue: int | None, offers: Offers, *,
          hugetlb: bool, dmabuf_fd: int | None = None, rq_entries: int, user_region: bool,
          rx_buf_len: int, why_copy: str = "", shared: bool,
          area_capacity: int | None = None, cqe_mixed: bool = False) -> ZcrxProvider | ZcrxQueue:
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
    if not shared and (zq := _joinable(ifname, queue)) is not None:
        return zq.join(fd)
    area = Area(area_size, hugetlb=hugetlb, dmabuf_fd=dmabuf_fd, capacity=area_capacity)
    with contextlib.ExitStack() as undo:
        undo.callback(area.close)
        zq = ZcrxQueue(area, ifname, queue, rq_entries=rq_entries, user_region=user_region,
                       rx_buf_len=rx_buf_len, why_copy=why_copy, shared=shared,
                       cqe_mixed=cqe_mixed)
        undo.pop_all()
    if shared:
        return zq
    return build_or_close(lambda: zq.join(fd), zq.close)


def _joinable(ifname: str | None, queue: int | None) -> ZcrxQueue | None:
    """This thread's open queue for the device queue (or shared copy-mode queue), if any."""
    if ifname is None:
        return find_open(queue_key(0, 0))
    try:
        ifindex = socket.if_nametoindex(ifname)
    except OSError:
        return None  # ZcrxQueue names the problem
    return find_open(queue_key(ifindex, queue or 0))


__all__ = ["COPY_NOTE", "OFF_MASK", "PAGE_SIZE", "RING_FLAGS", "STOPS", "Offers", "RefillRing",
           "Registration", "ZcrxExport", "ZcrxProvider", "ZcrxQueue", "export_zcrx_queue",
           "kernel_offers", "open_zcrx",
           "open_zcrx_queue", "parse_completions", "register_ifq"]
