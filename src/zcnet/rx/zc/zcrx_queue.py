"""One zcrx interface queue shared by every connection it receives (``ZcrxQueue``), and one
connection's side of it (``ZcrxMember``: the Provider a Receiver drives).

Some facts that shape it (io_uring/zcrx.c and net.c, 7.3.4):

- Any number of sockets may RECV_ZC through one ifq of one ring: the kernel keeps nothing per
  socket, and a CQE names only its user_data. Routing is ours: each member's requests carry
  its id above the low ``MEMBER_BITS`` of user_data (zcnet.uring.members splits a round).
- A queue takes one ifq: a second registration on a bound queue is EEXIST. So there is one
  ZcrxQueue per (network namespace, device, queue) per thread, and connections join it.
- One refill ring per ifq: a buffer goes back by its area offset, whoever received it.
- A buffer a connection holds is lost to the whole queue until it comes back, and the kernel
  has no per-socket fairness: on a device the page pool runs dry and every flow on the queue
  drops; in copy mode the receive being served when the free list runs dry stops (-ENOMEM).
  The one per-socket bound is the byte cap each RECV_ZC carries (sqe len, 6.15). Reaching it
  ends the receive with res 0 and no F_MORE, the CQE of EOF, so a member counts the bytes since
  its arm to tell a cap from the end of the stream.
- The ring is SINGLE_ISSUER: every enter and register must come from the thread that made it,
  so a queue and its members belong to that thread. Another thread receives the same NIC
  queue through a ring of its own that imports the ifq (zcrx_export.py, 6.19+).

Fairness: each connection may hold ``share_bytes()`` (the area over its connections); its
receive is armed with a cap of what is left of that and is not armed again while none is left.
A connection that keeps its chunks stalls alone: its data waits in its socket and TCP's window
closes for that flow only. The kernel enforces the cap in bytes; a buffer filled only partly
(small packets on a device) holds fewer, so buffer-wise a connection may hold more than
``share()`` there.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import ClassVar, Protocol

import numpy as np

from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.provider import RECV_UD, close_ring
from zcnet.rx.zc.zcrx_areas import add_area
from zcnet.rx.zc.zcrx_ifq import IfqMemory, QueueRegistry, device_reserve, queue_key
from zcnet.rx.zc.zcrx_reg import Registration, kernel_stats_layout, memlock_error, register_ifq
from zcnet.rx.zc.zcrx_rings import RefillRing, queue_ring
from zcnet.uapi import io_uring as u
from zcnet.uring.completions import Completions
from zcnet.uring.mem import Mapping
from zcnet.uring.members import split_by_member
from zcnet.uring.prep import prep_cancel
from zcnet.uring.ring import Ring

COPY_NOTE = ("copy mode: no device queue, the kernel copies every byte into the zcrx area "
             "(ZCRX_REG_NODEV); the zcrx protocol runs for real, zero copy does not")
MEMBER_BITS = 8    # user_data: member id << MEMBER_BITS | RECV_UD or CANCEL_UD
MIN_SHARE = 16     # buffers each connection may hold at least

QUEUES: QueueRegistry[ZcrxQueue] = QueueRegistry()


def find_open(key: tuple[int, ...]) -> ZcrxQueue | None:
    """This thread's open queue for ``key``, if any (a connection joins it)."""
    return QUEUES.mine().get(key)


class Member(Protocol):
    """What the queue routes to and cancels: one connection (zcnet.rx.zc.zcrx.ZcrxProvider)."""

    mid: int
    ud: int
    cancel_ud: int
    inbox: list[Completions]
    armed: bool
    cancelling: bool
    cap: int
    since_arm: int
    queue_gone: bool

    def _take_final(self) -> None: ...

    def _bound_socket(self) -> None: ...

    def due(self) -> bool: ...


class MemberClass(Protocol):
    def joining(self, zq: ZcrxQueue, fd: int) -> Member: ...


class ZcrxQueue:
    """One zcrx ifq (a NIC queue, or copy mode when ``ifname`` is None), its ring, area and
    refill ring, shared by the connections that ``join`` it (see the module docstring).

    ``shared``: the application opened it for many connections (it stays open without any,
    until ``close``, and caps every receive); False: opened for one connection, closed when
    its last member leaves, and uncapped while it has one member.
    """

    #: The provider each connection gets (zcnet.rx.zc.zcrx sets it: it builds on this module).
    member_cls: ClassVar[MemberClass]

    def __init__(self, area: Area, ifname: str | None, queue: int | None, *,
                 rq_entries: int = 4096, user_region: bool = True, rx_buf_len: int = 0,
                 why_copy: str = "", shared: bool = False, region: Mapping | None = None,
                 memory: Callable[[Registration, Area], IfqMemory] = IfqMemory,
                 cqe_mixed: bool = False) -> None:
        self.area = area
        self.copy = ifname is None
        self.mode = "copy" if self.copy else "device"
        self.ifname = ifname
        self.queue = queue
        self.shared = shared
        self.members: dict[int, Member] = {}
        self.owner_tid = threading.get_ident()
        self._mids: list[int] = []  # ids of members that left, reused lowest first
        ifindex = 0
        if ifname is not None:
            try:
                ifindex = socket.if_nametoindex(ifname)
            except OSError:
                raise UsageError(f"no interface named {ifname!r} in this network namespace"
                                 ) from None
        self.key = queue_key(ifindex, queue or 0)
        self.where = "copy mode" if self.copy else f"{ifname} queue {queue}"
        self.reg = Registration.build(area, ifindex, queue or 0, rq_entries, user_region,
                                       nodev=self.copy, rx_buf_len=rx_buf_len,
                                       stats=kernel_stats_layout(), region=region)
        self.mem = memory(self.reg, area)
        self._ring: Ring | None = None
        self._kstats: np.ndarray | None = None  # the kernel's zcrx_stats: copy count, bytes
        self._copied = (0, 0)                   # its last reading (kept after close)
        self._consumed: int | None = None       # the refill ring's kernel head, last read
        self.flushes = 0
        self.seen_cqes = self.seen_bytes = 0  # data CQEs and their bytes (see fill)
        self.unsettled: set[int] = set()  # ids of members that left with a receive armed
        with contextlib.ExitStack() as undo:
            undo.callback(self._close_kernel_side)
            if err := memlock_error(self.reg.locked_bytes()):
                raise err
            self._ring = queue_ring(rq_entries, cqe_mixed)
            try:
                register_ifq(self._ring, self.reg, ifname=ifname or "(no device, copy mode)")
            except ZcnetError as e:
                if (owner := QUEUES.owners.get(self.key)) is not None:
                    raise ZcnetError(
                        f"{self.where} is already received by another thread of this process "
                        f"(thread {owner}): a zcrx queue's ring is single-issuer",
                        "receive its connections in that thread, or in a ring that imports "
                        "the queue (zcnet.rx.zc.zcrx.export_zcrx_queue there, Linux 6.19+)"
                        ) from e
                raise
            self.rq = self._map_refill_ring()
            self._consumed = 0
            undo.pop_all()
        self.ifq_id = int(self.reg.ifq.zcrx_id)
        # 7.x writes back the buffer size; older kernels leave our 0 (one page).
        self.buf_len = int(self.reg.ifq.rx_buf_len) or PAGE_SIZE
        self.reserve = 0 if self.copy else device_reserve(ifname)  # type: ignore[arg-type]
        self.flush_ctrl = u.zcrx_ctrl(zcrx_id=self.ifq_id, op=u.ZCRX_CTRL_FLUSH_RQ)
        where = (f"{COPY_NOTE}" + (f" ({why_copy})" if why_copy else "") if self.copy
                 else f"{ifname} queue {queue}")
        self.note = f"{where}, {self.rq.entries} refill entries of {self.buf_len} bytes"
        if shared or not self.copy:  # a device queue is joined, never registered twice
            QUEUES.add(self.key, self, own=True)

    @classmethod
    def adopt(cls, source: ZcrxQueue, ring: Ring, ifq_id: int, *, shared: bool) -> ZcrxQueue:
        """The queue of a ring that imported ``source``'s ifq (zcrx_export.py) in this thread:
        its own ring and zcrx id, ``source``'s area, refill ring and counters (same process,
        same addresses). Registered as this thread's queue for the device queue."""
        zq = cls.__new__(cls)
        for name in ("area", "copy", "mode", "ifname", "queue", "key", "where", "reg", "mem",
                     "rq", "buf_len", "reserve", "note", "_kstats"):
            setattr(zq, name, getattr(source, name))
        zq.shared = shared
        zq.members, zq._mids, zq.unsettled = {}, [], set()
        zq.owner_tid = threading.get_ident()
        zq._ring, zq.ifq_id = ring, ifq_id
        zq._copied, zq._consumed, zq.flushes = source._copied, 0, 0
        zq.seen_cqes, zq.seen_bytes = source.seen_cqes, source.seen_bytes
        zq.flush_ctrl = u.zcrx_ctrl(zcrx_id=ifq_id, op=u.ZCRX_CTRL_FLUSH_RQ)
        with zq.mem.lock:
            zq.mem.holders += 1
            zq.mem.area_users += 1
        QUEUES.add(zq.key, zq, own=False)
        return zq

    def _map_refill_ring(self) -> RefillRing:
        reg = self.reg
        size = int(reg.region.size)
        if reg.region_mem is not None:
            mem = reg.region_mem.view(np.uint8, 0, size)
        else:
            assert self._ring is not None
            self.mem.region_map = Mapping(size, fd=self._ring.fd,
                                          offset=int(reg.region.mmap_offset))
            mem = self.mem.region_map.view(np.uint8, 0, size)
        if (at := reg.stats_offset) is not None:
            self._kstats = mem[at:at + 16].view(np.uint64)
        o = reg.ifq.offsets
        return RefillRing(mem, o.head, o.tail, o.rqes, int(reg.ifq.rq_entries),
                          int(reg.area.rq_area_token))

    @property
    def ring(self) -> Ring | None:
        return self._ring

    def add_area(self, size: int) -> int:
        """``size`` more bytes of area (ZCRX_CTRL_ADD_AREA, 7.3: zcnet.rx.zc.zcrx_areas)."""
        return add_area(self, size)

    @property
    def starved(self) -> bool:
        """The area's free list ran dry (a receive stopped with -ENOMEM) and no flush of the
        refill ring followed yet, on any ring of the ifq."""
        return self.mem.starved

    @starved.setter
    def starved(self, value: bool) -> None:
        self.mem.starved = value

    @property
    def closed(self) -> bool:
        return self._ring is None

    # --- connections ------------------------------------------------------------------------
    def buffers(self) -> int:
        """The area's buffers the connections share: on a device, less what its RX ring and
        page pool hold to receive into (``reserve``)."""
        total = self.area.size // self.buf_len
        return max(total - self.reserve, total // 2)

    def budget(self) -> int:
        """Buffers per connection: the shared ones, split evenly over every connection on the
        ifq (all its rings)."""
        return self.buffers() // max(1, self.mem.members)

    def share(self) -> int:
        """Buffers a connection may hold: its whole budget in copy mode; half on a device,
        whose other half its socket may hold (skbs that wait in a socket hold the queue's
        buffers too: SO_RCVBUF bounds them)."""
        return self.budget() if self.copy else self.budget() // 2

    def fill(self) -> float:
        """Bytes per buffer seen so far on this ring (a 1500-byte MTU fills a 4 KiB buffer
        about a third): what turns a share of buffers into a receive's byte cap. Before any
        data, a quarter buffer: the first caps stop early rather than overshoot."""
        return self.seen_bytes / self.seen_cqes if self.seen_cqes else self.buf_len / 4

    def share_bytes(self) -> int:
        """The most bytes a connection may hold (its share of buffers, each full)."""
        return self.share() * self.buf_len

    def capping(self) -> bool:
        """Receives carry a byte cap: the queue is shared, or has more than one connection."""
        return self.shared or self.mem.members > 1

    def join(self, fd: int) -> Member:
        """A provider (zcnet.rx.zc.zcrx.ZcrxProvider) for the connection on ``fd``, receiving
        through this queue (owner thread; ``fd`` -1: attach it later)."""
        return self.member_cls.joining(self, fd)

    def add(self, m: Member) -> int:
        """Take ``m`` in and give it its id. Refused when the area would give each connection
        fewer than MIN_SHARE buffers."""
        self._check("join")
        n = self.mem.members + 1
        if n > 1 and self.buffers() // n // (1 if self.copy else 2) < MIN_SHARE:  # one
            # connection: any area, as asked
            raise UsageError(
                f"{self.where}: its {self.area.size >> 10} KiB zcrx area gives {n} connections "
                f"fewer than {MIN_SHARE} buffers of {self.buf_len} bytes each",
                "open the queue with a larger area_size, or serve fewer connections on it")
        mid = min(self._mids) if self._mids else len(self.members)
        if self._mids:
            self._mids.remove(mid)
        self.members[mid] = m
        with self.mem.lock:
            self.mem.count(1)
            self.mem.area_users += 1
        return mid

    def recap(self) -> None:
        """Cancel armed receives whose cap exceeds the share now (or have none): each stops
        ("rearm") and its core arms it again with a cap that fits."""
        if not self.capping() or self._ring is None:
            return
        limit = int(self.share() * self.fill())
        cancelled = False
        for m in self.members.values():
            m._bound_socket()  # its socket's part of a smaller budget
            if m.armed and not m.cancelling and (not m.cap or m.cap - m.since_arm > limit):
                prep_cancel(self._ring, m.ud, m.cancel_ud)
                m.cancelling = cancelled = True
        if cancelled:
            self._ring.submit()

    def leave(self, m: Member) -> None:
        """``m`` closed: its id is free, the others' shares grow; a queue opened for one
        connection closes with its last."""
        if self.members.get(m.mid) is m:
            del self.members[m.mid]
            if m.armed:  # its cancel was not confirmed: CQEs may still come, never reuse its id
                self.unsettled.add(m.mid)
            else:
                self._mids.append(m.mid)
            with self.mem.lock:
                self.mem.count(-1)
        if not self.members and not self.shared:
            self.close()

    def area_user_done(self) -> None:
        """A member's receiver holds nothing any more (its ``area_done``): the area is
        unmapped once the queue is closed and no chunk of it is held."""
        self.mem.area_done()

    # --- the ring --------------------------------------------------------------------------
    def _check(self, method: str) -> None:
        if self._ring is None:
            raise ClosedError.of(self, method)
        if threading.get_ident() != self.owner_tid:
            raise ZcnetError(f"{method}() on {self.where}'s zcrx queue from a thread that did "
                             "not open it (its ring is single-issuer)",
                             "receive every connection of a queue in the thread that opened it")

    def pump(self, timeout: float | None) -> None:
        """One enter (waiting up to ``timeout`` when nothing is ready), then every completion
        into its member's inbox. Buffers of a member that left go straight back."""
        ring = self._ring
        assert ring is not None
        if self.mem.closed_tokens:
            self._drain_closed()
        if not ring.cq_ready():
            ring.submit(1, timeout)
        c = ring.reap()
        if len(c):
            self._route(c)

    def ready(self, timeout: float | None = 0) -> list[Member]:
        """The connections whose receiver has work (owner thread): completions routed to it,
        or a receive to arm again. When none has, one enter first, waiting up to ``timeout``
        seconds (None: until a completion). A server's loop: ``recv(0)`` on each."""
        self._check("ready")
        if self.mem.closed_tokens:
            self._drain_closed()
        due = [m for m in self.members.values() if m.due()]
        if due:
            return due
        self.pump(timeout)
        return [m for m in self.members.values() if m.due()]

    def _route(self, c: Completions) -> None:
        members = self.members
        if len(members) == 1 and not self.unsettled:
            # One connection and no other request in flight: all of it is that connection's
            # (its parse keeps only its receive's CQEs, as a provider of its own ring did).
            for m in members.values():
                m.inbox.append(c)
            return
        for mid, part in split_by_member(c, MEMBER_BITS, local=False):
            m = members.get(mid)
            if m is not None:
                m.inbox.append(part)
            else:
                self._give_back_unread(part)

    def _give_back_unread(self, c: Completions) -> None:
        """Data CQEs nobody will read (their member left or is closing): each holds a buffer
        the kernel counts as the user's, so it goes back through the refill ring."""
        extra = c.extra
        data = (c.res > 0) & ((c.user_data & np.uint64((1 << MEMBER_BITS) - 1)) == RECV_UD)
        if extra is not None and data.any() and self._ring is not None:
            self.recycle(extra[data, 0], c.res[data])

    def _drain_closed(self) -> None:
        with self.mem.lock:
            got, self.mem.closed_tokens = self.mem.closed_tokens, []
        toks = [t for part in got for t in part]
        if toks:  # the kernel reads only an entry's offset (io_parse_rqe): length 0 is fine
            self.recycle(toks, [0] * len(toks))

    def recycle(self, tokens: list[int] | np.ndarray, lengths: list[int] | np.ndarray) -> None:
        with self.mem.lock:  # other threads' queues on this ifq write the same ring
            n = self.rq.push(tokens, lengths)
        if (self.copy and n) or (not self.copy and self.starved):
            self.flush_all()
        # Otherwise (a device, not starved) its page pool reads the ring as it allocates.

    def flush_all(self) -> None:
        """Return the ring's entries to the area's free list, then those held back, until none
        is held (the flush empties the ring). Copy mode needs this after every write. So does a
        device whose receive stopped with -ENOMEM: the kernel's copies take buffers from the
        free list, and a page pool that does not allocate (a device that copies) never reads
        the ring. A device that DMAs never stops so (its pool reads the ring): no flush."""
        while True:
            self._flush_rq()
            self.starved = False
            with self.mem.lock:
                if not (self.rq.held and self.rq.push([], [])):
                    return

    def _flush_rq(self) -> None:
        assert self._ring is not None
        self._ring.register(u.IORING_REGISTER_ZCRX_CTRL, self.flush_ctrl, 0)
        self.flushes += 1

    # --- what the kernel counted -----------------------------------------------------------
    def copied(self) -> tuple[int, int] | None:
        """The kernel's (copies, bytes copied) into this queue's area (None: not counted)."""
        if self.reg.stats_offset is None:
            return None
        self._read_region()
        return self._copied

    def _read_region(self) -> None:
        """What the kernel wrote in the refill region: the ring's head, the copy counters
        (kept here, as the region is unmapped at close)."""
        if self._ring is None or self._consumed is None:
            return
        self._consumed = self.rq.kernel_head()
        if self._kstats is not None:
            self._copied = (int(self._kstats[0]), int(self._kstats[1]))

    def stats(self) -> dict[str, int]:
        self._read_region()
        d = {"refill_full": self.rq.full_events, "refill_held": self.rq.held,
             "refill_produced": self.rq.produced, "refill_consumed": self._consumed or 0,
             "rq_entries": self.rq.entries, "rx_buf_len": self.buf_len,
             "zcrx_copy": int(self.copy), "zcrx_flushes": self.flushes,
             "zcrx_members": len(self.members), "zcrx_share": self.share()}
        if self.reg.stats_offset is not None:
            d["zcrx_copy_count"] = self._copied[0]  # copy-fallback CQEs (zcrx_stats)
        return d

    # --- close ------------------------------------------------------------------------------
    def close(self) -> bool:
        """Stop every connection's receive and free the ifq (owner thread). The next receive
        of a connection still open raises ClosedError naming the queue; chunks already handed
        out stay valid (the area is unmapped when the last is released). True when every
        receive was seen to end."""
        if self._ring is None:
            return True
        if threading.get_ident() != self.owner_tid:
            raise ZcnetError(f"close() on {self.where}'s zcrx queue from a thread that did not "
                             "open it", "close it in the thread that opened it")
        armed = [m for m in self.members.values() if m.armed]
        ok = True
        with contextlib.ExitStack() as undo:
            undo.callback(self.area_user_done)
            undo.callback(self._close_kernel_side)
            if armed:
                ok = self._cancel(armed)
            for m in self.members.values():
                m.queue_gone = True
        return ok

    def _cancel(self, members: list[Member]) -> bool:
        """Cancel these members' receives and route until each final CQE is in (bounded:
        50 x 0.1 s, like cancel_multishot)."""
        ring = self._ring
        assert ring is not None
        for m in members:
            if not m.cancelling:
                prep_cancel(ring, m.ud, m.cancel_ud)
                m.cancelling = True
        ring.submit()
        for _ in range(50):
            for m in members:
                m._take_final()
            if not any(m.armed for m in members):
                return True
            self.pump(0.1)
        return False

    def _close_kernel_side(self) -> None:
        self._read_region()  # the last readings, before the region goes
        QUEUES.remove(self.key, self)
        ring, self._ring = self._ring, None
        self._kstats = None
        with contextlib.ExitStack() as undo:
            undo.callback(self.mem.release)
            # Closing the last ring that holds the ifq frees it: the queue gets its normal page
            # pool back, and the kernel takes back every buffer a user still held
            # (io_zcrx_scrub).
            if ring is not None:
                close_ring(ring, False)

    def __enter__(self) -> ZcrxQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<ZcrxQueue {self.where} members={len(self.members)} "
                f"{'closed' if self.closed else 'open'}>")
