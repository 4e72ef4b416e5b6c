"""One zcrx queue received by several processes: the queue's memory in a memfd, its ifq
exported (ZCRX_CTRL_EXPORT) by the process that registered it and imported (ZCRX_REG_IMPORT,
6.19+) by each process that receives on it. A benchmark server's flow workers use it.

Some facts that shape it (io_uring/zcrx.c, 7.3.4):

- IMPORT gives the importing ring the same ifq: area, refill ring and buffers. A CQE names a
  buffer by its offset in the area, and the refill ring is memory both sides write, so both
  must be memory every process maps: one memfd holds [area | refill region | count page],
  registered as a user area and a user region (shmem takes zcrx's long-term pins).
- The "[zcrx]" file EXPORT returns keeps the ifq (and the NIC queue) bound while open. It
  travels to the other process over a unix socket (SCM_RIGHTS; multiprocessing does it when a
  ``ZcrxHandoff`` is pickled to a child) and is closed there once imported.
- Several processes write one refill ring and the kernel orders none of them: writers take a
  lock on the memfd (an open-file-description lock on a description of their own, so
  processes exclude each other; a thread lock in front for this process's threads) and read
  the ring's tail under it instead of keeping it.
- Shares divide the area over every connection of the ifq, in any process: the hosting process
  counts the members it hands out on the count page; each process's queue divides by that
  count, or by its own connections where it has more.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass
from multiprocessing import reduction

from zcnet.errors import UsageError, ZcnetError
from zcnet.nic.arrival import WrongQueue
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.netqueue import find_queue
from zcnet.rx.zc.zcrx_export import IMPORT_SINCE, export_box, import_box
from zcnet.rx.zc.zcrx_ifq import IfqMemory, queue_key
from zcnet.rx.zc.zcrx_queue import QUEUES, ZcrxQueue
from zcnet.rx.zc.zcrx_reg import Registration, kernel_offers, refill_region_size
from zcnet.rx.zc.zcrx_rings import queue_ring
from zcnet.uapi import io_uring as u
from zcnet.uring.mem import Mapping, page_align
from zcnet.uring.ring import Ring

_COUNT = struct.Struct("=q")
# struct flock (x86-64): l_type, l_whence, pad, l_start, l_len, l_pid (0 for an OFD lock), pad.
_FLOCK = struct.Struct("hh4xqqi4x")
SLOTS = PAGE_SIZE // _COUNT.size - 1  # count page: the total, then one word per process


class ProcessLock:
    """The refill ring writers' lock: a thread lock, then a write lock on the whole memfd
    through this process's own open file description."""

    def __init__(self, memfd: int) -> None:
        self._fd = os.open(f"/proc/self/fd/{memfd}", os.O_RDWR | os.O_CLOEXEC)
        self._thread = threading.Lock()

    def _set(self, kind: int) -> None:
        if self._fd < 0:  # closed with this process's last ring: its ring writers are gone
            return
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLKW, _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))

    def __enter__(self) -> ProcessLock:
        self._thread.acquire()
        with contextlib.ExitStack() as undo:
            undo.callback(self._thread.release)
            self._set(fcntl.F_WRLCK)
            undo.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._set(fcntl.F_UNLCK)
        finally:
            self._thread.release()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SharedIfqMemory(IfqMemory):
    """IfqMemory of an ifq whose connections live in several processes. The count page holds
    the total of connections (word 0) and each importing process's own count (its ``slot``):
    the host hands a slot out counting one (the connection it is for), the process writes its
    count there, and the host takes the slot's count off the total when the process is gone,
    so a killed process leaves no connection counted. The lock excludes every process's
    refill-ring writers."""

    def __init__(self, reg: Registration, area: Area, count: mmap.mmap, lock: ProcessLock,
                 slot: int | None = None) -> None:
        self._count = count
        self._slot = slot
        self.local = 0
        super().__init__(reg, area)
        self.lock = lock  # type: ignore[assignment]

    def _word(self, i: int) -> int:
        return int(_COUNT.unpack_from(self._count, 8 * i)[0])

    def _add(self, i: int, delta: int) -> None:
        _COUNT.pack_into(self._count, 8 * i, self._word(i) + delta)

    @property  # type: ignore[override]
    def members(self) -> int:
        """Connections on the ifq as this process sees them: every other process's count,
        and its own as it is (not as handed out)."""
        if self._count.closed or self._slot is None:
            return self.local
        return self._word(0) - self._word(self._slot) + self.local

    @members.setter
    def members(self, n: int) -> None:  # IfqMemory.__init__'s 0
        self.local = n

    def count(self, delta: int) -> None:
        self.local += delta
        if self._slot is not None and not self._count.closed:
            self._add(0, self.local - self._word(self._slot))
            _COUNT.pack_into(self._count, 8 * self._slot, self.local)

    @property
    def total(self) -> int:
        """Connections of every process on the ifq, as counted (0 once unmapped)."""
        return 0 if self._count.closed else self._word(0)

    def hand_out(self, slot: int) -> None:
        """The host gives ``slot`` to a process for one connection."""
        with self.lock:
            _COUNT.pack_into(self._count, 8 * slot, 1)
            self._add(0, 1)

    def take_back(self, slot: int) -> None:
        """The process of ``slot`` is done: its connections are no longer counted."""
        with self.lock:
            self._add(0, -self._word(slot))
            _COUNT.pack_into(self._count, 8 * slot, 0)

    def release(self) -> None:
        super().release()
        if self.gone:
            with contextlib.ExitStack() as undo:
                undo.callback(self.lock.close)
                undo.callback(self._count.close)


@dataclass
class ZcrxHandoff:
    """What a process receiving on a hosted queue needs: the "[zcrx]" file and the memfd (fds
    it owns; pickling sends copies along, which the receiving side owns) and the layout."""

    box_fd: int
    memfd: int
    area_size: int
    region_size: int
    rq_entries: int
    area_token: int
    buf_len: int
    reserve: int
    ifname: str | None
    queue: int | None
    stats_offset: int | None
    slot: int

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_rebuild, (reduction.DupFd(self.box_fd), reduction.DupFd(self.memfd),
                           self.area_size, self.region_size, self.rq_entries, self.area_token,
                           self.buf_len, self.reserve, self.ifname, self.queue,
                           self.stats_offset, self.slot))

    @property
    def where(self) -> str:
        return "copy mode" if self.ifname is None else f"{self.ifname} queue {self.queue}"

    def close(self) -> None:
        """Close both fds (once: a handoff used in its own process shares no number)."""
        fds, self.box_fd, self.memfd = (self.box_fd, self.memfd), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def _rebuild(box: reduction.DupFd, memfd: reduction.DupFd, *rest: object) -> ZcrxHandoff:
    return ZcrxHandoff(box.detach(), memfd.detach(), *rest)  # type: ignore[arg-type]


def _layout(memfd: int, area_size: int, region_size: int
            ) -> tuple[Area, Mapping, mmap.mmap, ProcessLock]:
    """The memfd mapped: area, refill region, count page, and this process's lock on it."""
    with contextlib.ExitStack() as undo:
        area = Area(area_size, memfd=memfd)
        undo.callback(area.close)
        region = Mapping(region_size, fd=memfd, offset=area_size)
        undo.callback(region.close)
        count = mmap.mmap(memfd, PAGE_SIZE, offset=area_size + region_size)
        undo.callback(count.close)
        lock = ProcessLock(memfd)
        undo.pop_all()
    return area, region, count, lock


class HostedQueue:
    """A zcrx queue this process registers for connections of other processes (``handoff``
    for each). Its ring receives nothing itself; it keeps the ifq until ``close``."""

    def __init__(self, ifname: str | None, queue: int | None, area_size: int, *,
                 rq_entries: int = 4096, rx_buf_len: int = 0) -> None:
        where = "copy mode" if ifname is None else f"{ifname} queue {queue}"
        if not kernel_offers().imports:
            raise UsageError(f"receiving {where} in several processes needs ZCRX_CTRL_EXPORT "
                             f"and ZCRX_REG_IMPORT (Linux {IMPORT_SINCE}+)",
                             "receive every connection of the queue in one process")
        size = page_align(area_size)
        entries = 1 << (max(1, rq_entries) - 1).bit_length()
        self.region_size = refill_region_size(entries)
        self.memfd = os.memfd_create("zcnet-zcrx", os.MFD_CLOEXEC)
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, self.memfd)
            os.ftruncate(self.memfd, size + self.region_size + PAGE_SIZE)
            area, region, count, lock = _layout(self.memfd, size, self.region_size)
            undo.callback(area.close)
            undo.callback(region.close)
            undo.callback(count.close)
            undo.callback(lock.close)

            def memory(reg: Registration, a: Area) -> IfqMemory:
                return SharedIfqMemory(reg, a, count, lock)

            self.zq = ZcrxQueue(area, ifname, queue, rq_entries=entries, rx_buf_len=rx_buf_len,
                                shared=True, region=region, memory=memory)
            undo.pop_all()
        self.zq.rq.shared = True
        self.mem: SharedIfqMemory = self.zq.mem  # type: ignore[assignment]
        self.free = list(range(SLOTS, 0, -1))  # count page words handed out lowest first

    def handoff(self) -> ZcrxHandoff:
        """A connection's worth of the queue for another process (this queue's thread): a new
        "[zcrx]" file and a count slot, until ``taken_back``."""
        if not self.free:
            raise UsageError(f"{self.zq.where} is handed to {SLOTS} processes already",
                             "end some flows first")
        zq = self.zq
        box = export_box(zq)
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, box)
            memfd = os.dup(self.memfd)
            undo.pop_all()
        slot = self.free.pop()
        self.mem.hand_out(slot)
        return ZcrxHandoff(box, memfd, zq.area.size, self.region_size, zq.rq.entries,
                           zq.rq.area_token, zq.buf_len, zq.reserve, zq.ifname, zq.queue,
                           zq.reg.stats_offset, slot)

    def taken_back(self, h: ZcrxHandoff) -> None:
        """The process ``h`` went to is gone or done: its fds closed, its count taken off."""
        h.close()
        if h.slot not in self.free:
            self.mem.take_back(h.slot)
            self.free.append(h.slot)

    def close(self) -> None:
        """Unregister (this queue's thread): the ifq goes when the importers' rings are gone."""
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, self.memfd)
            self.zq.close()


def import_queue(h: ZcrxHandoff, *, shared: bool = False) -> ZcrxQueue:
    """This thread's queue on the ifq ``h`` hands over (its own ring, ``h``'s memory): this
    thread's connections on the device queue join it. ``h``'s fds are used up (closed).
    ``shared`` as for open_zcrx_queue (False: it closes with its last connection)."""
    with contextlib.ExitStack() as undo:
        undo.callback(h.close)
        ring = queue_ring(h.rq_entries)
        with contextlib.ExitStack() as fail:
            fail.callback(ring.close)
            ifq = import_box(ring, h.box_fd, h.where)
            area, region, count, lock = _layout(h.memfd, h.area_size, h.region_size)
            fail.callback(area.close)
            fail.callback(region.close)
            fail.callback(count.close)
            fail.callback(lock.close)
            zq = _adopted(h, ring, ifq, area, region, count, lock, shared)
            fail.pop_all()
    return zq


def _adopted(h: ZcrxHandoff, ring: Ring, ifq: u.io_uring_zcrx_ifq_reg, area: Area,
             region: Mapping, count: mmap.mmap, lock: ProcessLock, shared: bool) -> ZcrxQueue:
    """A ZcrxQueue over an imported ifq (``ifq``: the kernel's answer to the import): what
    __init__ learns from registering, taken from ``h`` (tests compare the two)."""
    ifindex = socket.if_nametoindex(h.ifname) if h.ifname is not None else 0
    ifq_id = int(ifq.zcrx_id)
    ifq.if_idx, ifq.if_rxq, ifq.rq_entries, ifq.rx_buf_len = (ifindex, h.queue or 0,
                                                              h.rq_entries, h.buf_len)
    events = None
    if h.stats_offset is not None:
        events = u.zcrx_event_desc(flags=u.ZCRX_EVENT_DESC_FLAG_STATS,
                                   stats_offset=h.stats_offset)
    reg = Registration(ifq, u.io_uring_zcrx_area_reg(addr=area.addr, len=area.size,
                                                     rq_area_token=h.area_token),
                       u.io_uring_region_desc(size=h.region_size, user_addr=region.addr,
                                              flags=u.IORING_MEM_REGION_TYPE_USER),
                       region, events)
    zq = ZcrxQueue.__new__(ZcrxQueue)
    zq.area, zq.copy, zq.ifname, zq.queue = area, h.ifname is None, h.ifname, h.queue
    zq.mode = "copy" if zq.copy else "device"
    zq.shared, zq.members, zq._mids, zq.unsettled = shared, {}, [], set()
    zq.owner_tid = threading.get_ident()
    zq.key = queue_key(ifindex, h.queue or 0)
    zq.where = h.where
    zq.reg, zq.mem = reg, SharedIfqMemory(reg, area, count, lock, h.slot)
    zq._ring, zq.ifq_id, zq._kstats = ring, ifq_id, None
    zq._copied, zq._consumed, zq.flushes = (0, 0), 0, 0
    zq.seen_cqes = zq.seen_bytes = 0
    zq.rq = zq._map_refill_ring()
    zq.rq.shared = True
    zq.buf_len, zq.reserve = h.buf_len, h.reserve
    zq.flush_ctrl = u.zcrx_ctrl(zcrx_id=ifq_id, op=u.ZCRX_CTRL_FLUSH_RQ)
    zq.note = (f"{h.where}, imported from another process, {zq.rq.entries} refill entries "
               f"of {zq.buf_len} bytes")
    QUEUES.add(zq.key, zq, own=False)
    return zq


def arrival_queue(sock: socket.socket, queues: list[ZcrxQueue], wait: float = 10.0
                  ) -> ZcrxQueue:
    """Of ``queues``, the one ``sock``'s connection arrived on. With one, that one (joining it
    checks the arrival); with several, the NAPI of its first data tells, waited for up to
    ``wait`` seconds (the data waits in the socket: nothing is read)."""
    if len(queues) == 1:
        return queues[0]
    names = f"{queues[0].ifname} queues " + ",".join(str(q.queue) for q in queues)
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    poll.poll(int(wait * 1000))
    try:
        where = find_queue(sock.fileno())
    except (ZcnetError, OSError):
        raise ZcnetError(f"the connection on fd {sock.fileno()} brought no data in {wait:g} s, "
                         f"so which of {names} it arrived on is unknown",
                         "have the peer send first, or receive one queue per flow") from None
    for zq in queues:
        if (zq.ifname, zq.queue) == where:
            return zq
    raise WrongQueue(f"the connection on fd {sock.fileno()} arrived on {where[0]} queue "
                     f"{where[1]}, not on the zcrx {names}",
                     f"steer its port to those queues (`zcnet nic setup {where[0]} --queues "
                     f"... --port PORT`)", where[0], where[1])
