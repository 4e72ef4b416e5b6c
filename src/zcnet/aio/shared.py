"""One io_uring per event loop, shared by every soft-provider receiver opened on that loop.

Some facts that shape it:

- A receiver with a ring of its own costs the loop, per wakeup and per receiver, an eventfd
  read, an ``io_uring_enter`` and a reader callback. With 100 streams that is paid 100 times
  per loop iteration. One ring per loop pays it once: one eventfd, one reader callback, one
  enter that runs the task work of every receiver, completions dispatched by ``user_data``.
- Provided-buffer rings belong to a ring and are named by a 16-bit group id, so each receiver
  registers its own group on the loop's ring. Its requests carry ``member id << 8 | local
  user_data``; the provider (:class:`SoftProvider`, unchanged) sees only its local values
  through :class:`MemberRing`, its view of the shared ring.
- IORING_SETUP_TASKRUN_FLAG: the kernel sets IORING_SQ_TASKRUN in the SQ ring's flags when it
  queues task work (DEFER_TASKRUN: arriving data), before it signals the eventfd. Reading that
  word says whether an enter would find anything: no enter ever finds nothing.
- No lost wake-up: after a pass the eventfd is drained (a syscall, ordered with the kernel's
  signal) and only then the flag and the CQ are read. Work queued before the drain shows in
  them (and the pass repeats); work queued after it leaves the eventfd signalled.
- Submissions are batched: a receiver that arms (or re-arms) leaves its SQE in the SQ and asks
  for one pass at the end of the loop's current iteration, which submits them all at once.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from zcnet.aio.backend import Future, Loop
from zcnet.aio.taskrun import taskrun_flag
from zcnet.aio.wakeup import Waiting, wake_each
from zcnet.errors import ClosedError, ZcnetError
from zcnet.rx.zc.area import HUGE_2MB, PAGE_SIZE, Area
from zcnet.rx.zc.chunks import BATCH_SLOTS, CHUNK_SLOTS, Batch, Chunk
from zcnet.rx.zc.provider import (
    RECV_UD,
)
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing
from zcnet.uring.eventfd import drain, register_eventfd
from zcnet.uring.mem import page_align
from zcnet.uring.members import concat, split_by_member
from zcnet.uring.ring import Completions, Ring

try:
    # By name: an extension module has no source, so the import graph (grimp) would see this as
    # an import of the zcnet.aio package itself, a cycle through aio/__init__ that is not there.
    _loopaccel: ModuleType | None = importlib.import_module("zcnet.aio._loopaccel")
except ImportError:  # not built (no C compiler at install): the Python pass runs
    _loopaccel = None

RING_FLAGS = (u.IORING_SETUP_SINGLE_ISSUER
              | u.IORING_SETUP_SUBMIT_ALL | u.IORING_SETUP_TASKRUN_FLAG)
SQ_ENTRIES = 256
CQ_ENTRIES = 32768   # CQEs of every receiver between two passes; overflow ends a multishot
LOCAL_BITS = 8
LOCAL_MASK = (1 << LOCAL_BITS) - 1
FEW = 16  # passes of at most this many CQEs are dispatched as Python tuples
#: Areas of closed receivers a loop's ring keeps for the next ones, in bytes: populating a new
#: area is most of what opening a receiver costs (~1.5 ms for the default 4 MiB, against
#: ~0.1 ms for the rest; docs/aio.md).
SPARE_AREA_BYTES = 64 << 20
_WORK = u.IORING_SQ_TASKRUN | u.IORING_SQ_CQ_OVERFLOW
_U64 = np.uint64


def loop_accel() -> ModuleType | None:
    """The compiled pass (zcnet.aio._loopaccel) when it is built and ZCNET_PURE is not set
    (read when a loop's ring or a transport is made, so tests can run both), else None."""
    if _loopaccel is None or os.environ.get("ZCNET_PURE", "") not in ("", "0"):
        return None
    return _loopaccel


#: zcnet.aio._loopaccel.Round's answers (its DONE, AGAIN, FALLBACK), for when it is not built.
ROUND_DONE, ROUND_AGAIN, ROUND_FALLBACK = 0, 1, 2


class TransportCalls(NamedTuple):
    """A transport's steps its compiled round calls (zcnet.aio._loopaccel.Round: aio/_c/round.c,
    and router.c's pass, which runs it), handed over once, in this order, when the round is
    made: the C looks no method up by name. Each is what the Python round does there."""

    #: the round raised (router.c ran it directly): report it and end the connection
    round_failed: Callable[[Exception], None]
    #: the protocol closed or paused the transport inside chunk_received: the round's later
    #: chunks are released, or kept for resume_reading
    put_back: Callable[[list[Chunk]], None]
    #: ``write``'s send failed: the connection ends (later, not inside write)
    send_failed: Callable[[OSError], None]
    #: ``write``'s send took the first ``sent`` bytes: the rest waits for the socket
    buffer_rest: Callable[[bytes | bytearray | memoryview, int], None]


def compiled_round(transport: Any, rx: Any, member: MemberRing | None = None,
                   calls: TransportCalls | None = None) -> Any:
    """The compiled round (zcnet.aio._loopaccel.Round) of a shared-ring receiver: a transport's
    (``run``; ``calls`` its steps), or with ``transport`` None an AsyncReceiver's (``take``,
    ``take_batch``), on ``member`` (its MemberRing; None: its provider's). None when the
    compiled pass is off for the member's ring (or the ring has none: a zcrx queue's,
    zcnet.aio.loop_zcrx), or the receiver needs the Python round's (debug views revoked,
    coalescing). A pooled receiver's round is given its pool (zcnet.aio.pool): completions name
    their buffers, and the pool paces re-arms."""
    accel = (rx.provider.member if member is None else member).lr.accel
    if accel is None or rx.debug or rx.coalesce:
        return None
    core, prov = rx.core, rx.provider
    return accel.Round(transport, calls, core, prov.member, prov, prov.group.buf,
                       core.chunk_cls, CHUNK_SLOTS, core.queue, core.stats, RECV_UD,
                       u.IORING_CQE_F_MORE, u.IORING_CQE_BUFFER_SHIFT, Batch, BATCH_SLOTS,
                       getattr(rx.provider, "pool", None))


def loop_backend() -> str:
    """Which pass a ring made now runs: "c" (zcnet.aio._loopaccel) or "pure"."""
    return "pure" if loop_accel() is None else "c"


class LoopRing:
    """The shared ring of one event loop; opened with its first member, closed with its last."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.ring = Ring(SQ_ENTRIES, flags=RING_FLAGS | taskrun_flag(), cq_entries=CQ_ENTRIES)
        self.members: dict[int, MemberRing] = {}
        self._next_id = 1
        self._free_bgids: list[int] = []
        self._bgids = 0
        self._scheduled = False
        self.prepped = False  # SQEs were prepared since the last submit (MemberRing.prep)
        self.thread = threading.get_ident()
        #: The compiled pass, or None: read once per ring (ZCNET_PURE is an environment
        #: lookup, a few microseconds that every connection would otherwise pay three times).
        self.accel = loop_accel()
        #: Areas of closed receivers, populated and free, for the next ones (keep_area).
        self.spare: list[Area] = []
        #: The buffer group still registered over a spare area (by the area's id): the next
        #: receiver of that area takes it as it is, with no register or unregister.
        self.groups: dict[int, BufRing] = {}
        #: Open zcnet.aio.keep_ring holders: the ring outlives its last member while any is.
        self.keepers = 0
        #: The buffer group pooled receivers share (zcnet.aio.pool.Pool), made by the first.
        self.pool: Any = None
        with contextlib.ExitStack() as undo:  # a failure closes what was opened
            undo.callback(self.ring.close)
            self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            undo.callback(os.close, self.efd)
            self._router = self._make_router()
            register_eventfd(self.ring, self.efd)
            loop.add_reader(self.efd, self.poll, True)  # signalled: the eventfd is set
            undo.pop_all()

    def _make_router(self) -> Any:
        """The compiled reap-and-dispatch over this ring's CQ, or None (the Python one)."""
        accel = self.accel
        if accel is None:
            return None
        a = self.ring.cq_addresses()
        return accel.Router(self.ring, self.members, a.cq_head, a.cq_tail, a.cqes, a.cq_mask,
                            a.cqe_size, Completions.from_raw, FEW, a.sq_flags, _WORK,
                            u.IORING_ENTER_GETEVENTS, LOCAL_BITS)

    # --- members ---------------------------------------------------------------------------
    def join(self, bgid: int | None = None) -> MemberRing:
        """A new member, with buffer group id ``bgid`` (a kept group's) or a free one."""
        if bgid is None:
            bgid = self.take_bgid()
        mid = self._next_id
        self._next_id += 1
        m = self.members[mid] = MemberRing(self, mid, bgid)
        return m

    def take_bgid(self) -> int:
        """A buffer group id no group on this ring uses."""
        if self._free_bgids:
            return self._free_bgids.pop()
        if self._bgids > 0xFFFF:
            raise ZcnetError("65536 receivers already share this event loop's io_uring",
                             "close some, or open with shared_ring=False")
        self._bgids += 1
        return self._bgids - 1

    def leave(self, m: MemberRing) -> None:
        """``m`` is gone; its buffer group id is reused only once ``free_bgid`` says so."""
        if self.members.pop(m.mid, None) is not None and not self.members and not self.keepers:
            self.close()

    def unkeep(self) -> None:
        """A keep_ring holder let go: with no member left either, the ring closes now."""
        self.keepers -= 1
        if not self.keepers and not self.members:
            self.close()

    def free_bgid(self, bgid: int) -> None:
        """The receive that used ``bgid`` has ended: the id may name a new member's group."""
        if not self.ring.closed:
            self._free_bgids.append(bgid)

    # --- spare areas ---------------------------------------------------------------------
    def settled(self, buf: BufRing) -> bool:
        """Whether a closing member's buffer group can serve the next receiver as it is: the
        ring outlives the member, every buffer is back in the group, and the kernel's head is
        ours (it took no buffer whose completion we have not seen). Only on the loop's thread:
        the group is registered on its ring (SINGLE_ISSUER)."""
        if (threading.get_ident() != self.thread or self.ring.closed
                or (len(self.members) <= 1 and not self.keepers)
                or buf.in_ring != buf.entries):
            return False
        try:
            return buf.kernel_head() == buf.head  # both u16 (bufring masks its copy)
        except OSError:  # no IORING_REGISTER_PBUF_STATUS (Linux < 6.8): not known, not kept
            return False

    def _drop_group(self, buf: BufRing) -> None:
        buf.close()  # raises when the kernel refuses: then the id stays out of use
        self.free_bgid(buf.bgid)

    def spare_area(self, size: int, hugetlb: bool,
                   buf_size: int) -> tuple[Area, BufRing | None] | None:
        """A kept area of the size and kind an Area(size, hugetlb=...) would have, with the
        group kept registered over it when its buffers are ``buf_size`` bytes (one of another
        size is unregistered, its id freed), or None (also for a size that is not a positive
        int: Area refuses it with the reason)."""
        if type(size) is not int or size <= 0:
            return None
        kind = "hugetlb" if hugetlb else "anon"
        want = page_align(size, HUGE_2MB if hugetlb else PAGE_SIZE)
        for i, a in enumerate(self.spare):
            if a.size == want and a.kind == kind:
                del self.spare[i]
                buf = self.groups.pop(id(a), None)
                if buf is not None and buf.buf_size != buf_size:
                    with contextlib.ExitStack() as undo:  # a failure unmaps the area too
                        undo.callback(a.close)
                        self._drop_group(buf)
                        undo.pop_all()
                    buf = None
                return a, buf
        return None

    def keep_area(self, area: Area, buf: BufRing | None = None) -> None:
        """Keep a closed receiver's area (nothing in it held, no receive left that can write
        to it), with its still registered group ``buf`` if ``settled`` said so, for the next
        receiver while there is room; otherwise unmap it (and unregister the group). Only on
        the loop's thread: a last release after close may come from any thread."""
        if (threading.get_ident() == self.thread and not self.ring.closed
                and area.kind in ("anon", "hugetlb")
                and sum(a.size for a in self.spare) + area.size <= SPARE_AREA_BYTES):
            self.spare.append(area)
            if buf is not None:
                self.groups[id(area)] = buf
            return
        try:
            if buf is not None:
                self._drop_group(buf)
        finally:
            area.close()

    def close(self) -> None:
        spare, self.spare = self.spare, []
        groups, self.groups = self.groups, {}
        pool, self.pool = self.pool, None
        with contextlib.ExitStack() as undo:  # everything goes, even if one close fails
            undo.callback(self._close_ring)
            if pool is not None:
                undo.callback(pool.close)
            for buf in groups.values():
                undo.callback(buf.close)
            for a in spare:
                undo.callback(a.close)

    def _close_ring(self) -> None:
        if _rings.get(self.loop) is self:
            del _rings[self.loop]
        try:
            if self.efd >= 0:
                if not self.loop.is_closed():
                    self.loop.remove_reader(self.efd)
                os.close(self.efd)
                self.efd = -1
        finally:
            self._router = None
            self.ring.close()

    # --- passes --------------------------------------------------------------------------------
    def schedule(self) -> None:
        """One pass at the end of the loop's current iteration (batched submission)."""
        if self.loop.is_closed():  # closing at shutdown: nothing runs later
            self.poll()
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._scheduled_poll)

    def _scheduled_poll(self) -> None:
        self._scheduled = False
        if not self.ring.closed:
            self.poll()

    def work(self) -> bool:
        """Whether a pass would find anything: SQEs to submit, task work or CQEs."""
        ring = self.ring
        return bool(self.prepped or ring.cq_ready() or ring.sq_flags & _WORK)

    def poll(self, signalled: bool = False) -> None:
        """Submit, run the task work, reap and dispatch; drain the eventfd when it may be set.
        One pass; if the kernel queued more meanwhile, another pass is scheduled."""
        ring = self.ring
        if ring.fd < 0:  # closed (Ring.closed, without a property call once per pass)
            return
        entered = signalled
        if self.prepped:
            self.prepped = False
            ring.submit()
            entered = True
        router = self._router
        if router is not None:  # the rest of the pass in C, as below
            more = router.poll(entered, self.efd)
            if more > 0 or (more == 0 and self.prepped):
                self.schedule()
            if self.pool is not None:
                self.pool.end_pass()
            return
        if ring.sq_flags & _WORK:
            ring.get_events()
            entered = True
        n = ring.cq_ready()
        if n > FEW:
            self._dispatch(ring.reap())
        elif n:
            self._dispatch_few(ring, n)
        if ring.closed:  # its last member left during the dispatch (a protocol's close)
            return
        if entered:
            drain(self.efd)
            if self.work():
                self.schedule()
        if self.pool is not None:
            self.pool.end_pass()

    def wait(self, m: MemberRing, timeout: float) -> None:
        """Block up to ``timeout`` s until ``m`` has a completion (only close() waits so)."""
        ring = self.ring
        deadline = time.monotonic() + timeout
        while not m.inbox and not ring.closed:
            self.poll(signalled=True)
            left = deadline - time.monotonic()
            if m.inbox or left <= 0:
                return
            if not ring.cq_ready():
                ring.submit(1, min(left, 0.1))

    def _dispatch(self, c: Completions) -> None:
        self._deliver(split_by_member(c, LOCAL_BITS))  # type: ignore[arg-type]

    def _dispatch_few(self, ring: Ring, n: int) -> None:
        """A few CQEs as Python tuples: cheaper than the ~8 numpy calls of ``_dispatch``."""
        groups: dict[int, list[tuple[int, int, int]]] = {}
        for _ in range(n):
            cqe = ring.reap_one()
            if cqe is None:
                break
            ud, res, flags = cqe
            groups.setdefault(ud >> LOCAL_BITS, []).append((ud & LOCAL_MASK, res, flags))
        self._deliver(list(groups.items()))

    def _deliver(self, groups: list[tuple[int, Completions | list[tuple[int, int, int]]]]) -> None:
        """Every group into its member's inbox, then the wake-ups: a pass nested in a wake-up
        (a receiver closed from a callback waits on this ring) then finds each inbox holding
        the older completions first. A failing wake-up does not stop the others; the first
        failure is raised at the end."""
        woken = []
        for mid, c in groups:
            m = self.members.get(mid)
            if m is not None:  # else: a member that left; its cancel completed before it did
                m.inbox.append(c)
                woken.append(m)
        wake_each(woken)


class MemberRing(Waiting):
    """One receiver's view of the loop's ring, shaped like the slice of :class:`Ring` that
    :class:`SoftProvider` and the provider helpers use, in the member's local user_data."""

    # Slots for what zcnet.aio._loopaccel reads and writes every pass (in place, no dict lookup);
    # the rest lives in the instance dict.
    __slots__ = ("__dict__", "__weakref__", "fast", "inbox", "on_ready", "tuples", "waiter")

    def __init__(self, lr: LoopRing, mid: int, bgid: int) -> None:
        self.lr = lr
        self.mid = mid
        self.bgid = bgid
        # Dispatched completions: arrays, or (user_data, res, flags) tuples for a few.
        self.inbox: list[Completions | list[tuple[int, int, int]]] = []
        self.waiter: Future[None] | None = None
        #: Called at each dispatch instead of waking ``waiter`` (zcnet.aio.protocol).
        self.on_ready: Callable[[], None] | None = None
        #: The compiled round of a transport (zcnet.aio._loopaccel.Round): the compiled pass
        #: runs it directly and calls ``on_ready`` only when it cannot finish the round.
        self.fast: Any = None
        #: The compiled pass hands this member any number of CQEs as tuples, which its
        #: compiled round takes (callback members always: ``on_ready``); else more than
        #: FEW go as arrays, which only the Python round reads. A pooled receiver's CQEs are
        #: one buffer each, so a pass often brings it more than FEW.
        self.tuples = False
        self.closed = False

    # --- what SoftProvider and zcnet.rx.zc.provider call ---------------------------------------
    def prep(self, opcode: int, fd: int = -1, addr: int = 0, length: int = 0, off: int = 0,
             user_data: int = 0, **kw: Any) -> int:
        if self.lr.ring.closed:
            raise ClosedError("the event loop's shared io_uring is closed")
        tag = self.mid << LOCAL_BITS
        if opcode == u.IORING_OP_ASYNC_CANCEL:
            addr |= tag  # the target's user_data
        if kw.get("flags", 0) & u.IOSQE_BUFFER_SELECT:
            kw["buf_index"] = self.bgid
        lr = self.lr
        slot = lr.ring.prep(opcode, fd, addr, length, off, tag | user_data, **kw)
        lr.prepped = True
        return slot

    def submit(self, wait_nr: int = 0, timeout: float | None = None) -> int:
        """No wait: submitted with everyone's at the end of this loop iteration. A wait with a
        timeout (closing: the cancel's final CQE) blocks up to that long."""
        if wait_nr and timeout:
            self.lr.wait(self, timeout)
        else:
            self.lr.schedule()
        return 0

    def cq_ready(self) -> int:
        return sum(map(len, self.inbox))

    def reap(self) -> Completions:
        box = self.inbox
        self.inbox = []
        if len(box) == 1 and type(box[0]) is Completions:
            return box[0]
        parts = [c if type(c) is Completions else _from_tuples(c) for c in box]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return _from_tuples([])
        return concat(parts)

    def close(self) -> None:
        self.closed = True
        self.inbox = []
        self.kick()
        self.lr.leave(self)

    def has_data(self) -> bool:
        """Completions for its receiver are waiting, or a pass of the loop's ring (only when
        the kernel flags work for it) brought some."""
        if not self.inbox and self.lr.work():
            self.lr.poll()
        return bool(self.inbox)

def _from_tuples(cqes: list[tuple[int, int, int]]) -> Completions:
    if not cqes:
        return Completions(np.empty(0, _U64), np.empty(0, np.int32), np.empty(0, np.uint32))
    ud, res, flags = zip(*cqes, strict=True)
    return Completions(np.array(ud, _U64), np.array(res, np.int32), np.array(flags, np.uint32))


_rings: weakref.WeakKeyDictionary[Loop, LoopRing] = (
    weakref.WeakKeyDictionary())


def loop_ring(loop: Loop) -> LoopRing:
    """``loop``'s shared ring, opened now if it has none."""
    lr = _rings.get(loop)
    if lr is None or lr.ring.closed:
        lr = _rings[loop] = LoopRing(loop)
    return lr
