"""One small buffer group per event loop, shared by the soft receivers opened with ``pool``.

Why: a receiver with a group of its own copies into an area of its own. With 100 streams on
one CPU that is 100 areas, far more than the cache, and the kernel's copy into them (and the
sender's copy after it) misses. One small group that every receive fills in turn stays in the
cache, as uvloop's per-connection buffer does, which it reads again at once.
``benchmarks/uring_pool.py`` measured it at the ring layer: 1.98x the rate at 0.32x the CPU
per GiB (docs/aio.md, "A pool per loop").

How it works:

- The pool is a buffer group on the loop's shared ring over one area (``POOL_SIZE``, 8 MiB of
  64 KiB buffers by default). Every pooled receiver's multishot receive selects from it
  without bundles: each completion names its one buffer, so a receiver's completions can be
  taken whenever its round runs. With bundles a completion's buffers are the next ones in the
  shared ring's order, which only CQ order across all receivers gives.
- The pool runs dry in normal operation. The receive that takes the last buffer ends, and so do
  the others when their data comes (-ENOBUFS). A receive that ended waits in a FIFO queue. At
  the end of each pass of the loop's ring, once the released buffers are back, as many of them
  are woken to re-arm as the pool holds receive caps (``Pool.pace``: 8 for 8 MiB). Re-arming
  all of them at once made almost every one fail again at once: 131,000 re-arms per GiB
  against 2,400.
- At the end of a pass with receivers waiting and the pool dry, every pooled receiver's
  released chunks go back to the pool: a receiver that waits runs no round of its own to
  return them. When the pool is still dry then (the application holds all of it), that is
  retried every ``DRY_RETRY`` seconds until a release refills it.
- Each receive is capped (the SQE's ``optlen``): it ends after ``QUOTA`` (1 MiB, a wake-up's
  worth at zcnet's ``rcvlowat``; half the pool when that is smaller), or what its receiver may
  still take below ``max_held``, and waits its turn again. 100 streams on one CPU, callback
  style: caps of 1 MiB ran at 26-28 Gbit/s (8 and 16 MiB pools), 512 KiB at 15, 2 MiB at
  20-22; areas of their own at 18-19 (docs/aio.md). A receive
  that stayed armed while its application read nothing would otherwise fill the whole pool
  and starve the others; with the cap one that holds its chunks leaves the rest to them.
- Lifetime: the group lives with the loop's ring, and the area stays mapped until the ring is
  closed and no pooled receiver holds a chunk of it. Chunks released after their receiver
  closed go back to the pool, from another thread at the loop's next turn. The completions that
  arrive while a closing receiver's receive is cancelled give their buffers back too.

Not covered:

- A receive whose cancel the kernel did not confirm (a stuck close) may still take buffers,
  and those stay lost to the pool.
- The cap counts bytes, not buffers. A receiver of small messages whose application stops
  reading can take every buffer, one message each, before its cap is reached, and the others
  wait until it reads again. The pool is for bulk streams whose application reads them.
- ``max_held`` is a share of the whole pool. Receivers that each hold chunks until they get
  more can hold all of it between them and wait for each other.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque

from zcnet.aio.loop_soft import OnLoopRing
from zcnet.aio.looptypes import Loop, Timer
from zcnet.aio.shared import LoopRing, MemberRing, loop_ring
from zcnet.errors import ClosedError, UsageError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import Delivery, IntSeq, buffer_count
from zcnet.rx.zc.receiver import Receiver
from zcnet.rx.zc.soft_group import SoftGroup
from zcnet.uring.bufring import BufRing
from zcnet.uring.ring import Completions

POOL_SIZE = 8 << 20
#: What one receive may take before it ends and waits its turn again.
QUOTA = 1 << 20
#: How often a dry pool with receivers waiting looks for released chunks again, in seconds.
DRY_RETRY = 0.001
#: The largest receive cap: the kernel reads the SQE's optlen as an int.
_CAP_MAX = 0x7FFFFFFF


class Pool:
    """The buffer group every pooled receiver of one loop's ring selects from."""

    def __init__(self, lr: LoopRing, size: int, buf_size: int) -> None:
        entries = buffer_count(size, buf_size)
        self.lr = lr
        self.size = size
        self.buf_size = buf_size
        self.area = Area(entries * buf_size)
        self.bgid = -1
        with contextlib.ExitStack() as undo:  # a failure frees the id and the area
            undo.callback(self.area.close)
            self.bgid = lr.take_bgid()
            undo.callback(lr.free_bgid, self.bgid)
            self.buf = BufRing(lr.ring, self.bgid, entries, buf_size, area=self.area.mapping)
            undo.pop_all()
        #: Receivers whose receive ended and that wait for buffers, oldest first.
        self.waiting: deque[PooledSoftProvider] = deque()
        #: Open pooled receivers by provider id: their releases are returned at a pass's end.
        self.receivers: dict[int, Receiver] = {}
        pool_bytes = entries * buf_size
        #: Bytes one receive may take (QUOTA, at most half the pool, whole buffers) and how
        #: many receives are armed per pass: as many as the pool holds of those.
        self.quota = max(buf_size, min(QUOTA, pool_bytes // 2, _CAP_MAX) // buf_size * buf_size)
        self.pace = max(2, pool_bytes // self.quota)
        self.arms = 0        # receives armed in this pass
        self.holders = 0     # receivers not yet done with the area (Receiver's area_done)
        self._holders_lock = threading.Lock()  # holder_done runs on the releasing thread
        self.late: deque[list[int]] = deque()  # released after close, off the loop's thread
        self.closed = False
        self._retry: Timer | None = None  # the DRY_RETRY timer, while one is set

    # --- a pass -----------------------------------------------------------------------------
    def end_pass(self) -> None:
        """The loop's ring finished a pass: return what was released, wake ``pace`` waiting
        receivers to re-arm, and make sure another look comes while some still wait."""
        self.arms = 0
        if self.late:
            self._take_late()
        if not self.waiting or self.closed or self.lr.loop.is_closed():
            return  # shutting down: every pass runs at once there, and nothing is to be woken
        free = self.free()
        if not free:  # what was released but is not back yet (no round flushed it)
            for rx in list(self.receivers.values()):
                # A closing one flushes its own, and so does one whose receive this pass
                # runs inside (a pass nested in its flush).
                core = rx.core
                if core.queue and not core.closed and not core.busy:
                    rx.flush()
            free = self.free()
        woken = 0
        while self.waiting and woken < self.pace and free:
            p = self.waiting.popleft()
            p.queued = False
            if p.closed:  # closed while it waited
                continue
            p.granted = True
            woken += 1
            p.member.wake()
        if self.waiting:
            if free:
                self.lr.schedule()
            elif self._retry is None:
                with contextlib.suppress(RuntimeError):  # a trio run ending meanwhile
                    self._retry = self.lr.loop.call_later(DRY_RETRY, self._dry_retry)

    def free(self) -> int:
        """Buffers the kernel can still take. Not ``in_ring``: that counts buffers the kernel
        filled until a round reads their completions, and a receiver whose application is not
        reading leaves them unread (waking the others then only fails their receives at
        once). One system call: at a pass's end while receivers wait, and per arm."""
        buf = self.buf
        return (buf.tail - buf.kernel_head()) & 0xFFFF

    def _dry_retry(self) -> None:
        self._retry = None
        if not self.closed:
            self.end_pass()

    def enqueue(self, p: PooledSoftProvider) -> None:
        if not p.queued:
            p.queued = True
            self.waiting.append(p)
            self.lr.schedule()  # a pass ends soon, and its end_pass wakes the oldest

    # --- buffers back -----------------------------------------------------------------------
    def give_back(self, bids: list[int]) -> None:
        """Buffers released after their receiver closed, from any thread."""
        if self.closed or not bids:
            return
        if threading.get_ident() == self.lr.thread:
            self.buf.provide(bids)
            return
        self.late.append(bids)
        with contextlib.suppress(RuntimeError):  # the loop closed: the ring goes with it
            self.lr.loop.call_soon_threadsafe(self._take_late)

    def released(self) -> None:
        """Buffers came back (a round's releases; the compiled round calls this too): with
        receivers waiting for some, a pass soon wakes them (its end does), since a pass that
        already ended may have found the pool dry."""
        if self.waiting and not self.lr.loop.is_closed():
            self.lr.schedule()

    def _take_late(self) -> None:
        while self.late and not self.closed:
            self.buf.provide(self.late.popleft())

    # --- lifetime ---------------------------------------------------------------------------
    def holder_done(self, _area: object = None) -> None:
        """A pooled receiver is closed and holds nothing (its Receiver's ``area_done``)."""
        with self._holders_lock:
            self.holders -= 1
            last = self.closed and not self.holders
        if last:
            self.area.close()

    def close(self) -> None:
        """With the loop's ring (before it): the group goes now, the area once nothing of it
        is held."""
        with self._holders_lock:  # one of this and the last holder_done unmaps the area
            if self.closed:
                return
            self.closed = True
        self.waiting.clear()
        self.late.clear()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        try:
            self.buf.close()
        finally:
            with self._holders_lock:
                last = not self.holders
            if last:
                self.area.close()


class PooledSoftProvider(OnLoopRing):
    """The soft provider on its loop's pool: a SoftGroup on the pool's buffer group whose
    completions name their buffers (``named``), its receives capped and their re-arms paced
    by the pool."""

    def __init__(self, fd: int, pool: Pool, member: MemberRing) -> None:
        self.area = pool.area
        self.member = member
        member.tuples = True  # a completion per buffer: many per pass, for the compiled round
        self.pool = pool
        self.group = SoftGroup(fd, pool.area, pool.buf_size, member, pool.buf, bundle=False,
                               round_cqes=1, named=True)
        self.note = (f"{self.group.entries} buffers of {pool.buf_size} bytes, on the loop's "
                     "shared io_uring, the event loop's pool")
        self.queued = False   # in the pool's waiting queue
        self.granted = False  # woken by the pool: may arm once
        self.closed = False

    def _check(self, method: str) -> SoftGroup:
        if self.closed:
            raise ClosedError.of(self, method)
        return self.group

    def can_arm(self) -> bool:
        self._check("can_arm")
        if self.granted:
            return True
        pool = self.pool
        if not pool.waiting and pool.arms < pool.pace and pool.free():
            pool.arms += 1
            return True
        pool.enqueue(self)
        return False

    def arm(self) -> None:
        """Arm a receive capped at this receiver's quota: it ends there and waits its turn
        again (one that stays armed while its application reads nothing would otherwise take
        the whole pool)."""
        self._check("arm").arm(self.quota())
        self.granted = False

    def quota(self) -> int:
        """The pool's quota, no more than the receiver may still take before it is held back
        (``max_held``), and at least one buffer."""
        pool = self.pool
        bs = pool.buf_size
        share = pool.quota
        rx = pool.receivers.get(id(self))
        if rx is not None:
            core = rx.core
            share = min(share, core.limit - core.stats.in_flight_bytes)
        return max(bs, share // bs * bs)

    def reap(self, timeout: float | None) -> Delivery:
        g = self._check("reap")
        m = self.member
        if not m.inbox and timeout:
            m.submit(1, timeout)
        box, m.inbox = m.inbox, []
        out = Delivery()
        for part in box:
            g.take_few(part if type(part) is list else part.tuples(), out)
        return out

    def recycle(self, tokens: IntSeq, lengths: IntSeq) -> None:
        self._check("recycle").recycle(tokens)
        if len(tokens):
            self.pool.released()

    def quiesce(self, armed: bool) -> bool:
        """Cancel ahead of close, the buffers of completions reaped meanwhile given back to
        the pool (a group of its own would simply go; the pool stays)."""
        return not armed or self._check("quiesce").cancel(self._reaped_at_cancel)

    def _reaped_at_cancel(self, c: Completions) -> None:
        out = Delivery()
        self.group.take_few(c.tuples(), out)
        self.pool.give_back(out.tokens)  # type: ignore[arg-type]  # take_few: a list

    def recycle_closed(self, tokens: list[int]) -> None:
        """Chunks released after the receiver closed (any thread): their buffers are the
        pool's, not the receiver's."""
        self.pool.give_back(tokens)

    def close(self, armed: bool = False) -> bool:
        if self.closed:
            return not armed
        self.closed = True
        over = not armed
        with contextlib.ExitStack() as undo:
            undo.callback(self.member.close)
            undo.callback(self._leave_pool)
            if armed:
                over = self.group.cancel(self._reaped_at_cancel)
        return over

    def _leave_pool(self) -> None:
        pool = self.pool
        pool.receivers.pop(id(self), None)
        if self.queued:
            self.queued = False
            with contextlib.suppress(ValueError):
                pool.waiting.remove(self)


def open_pooled_soft(loop: Loop, fd: int, size: int, buf_size: int) -> PooledSoftProvider:
    """A soft provider on ``loop``'s pool (made now, ``size`` bytes of ``buf_size`` buffers,
    if the loop's ring has none). Its Receiver must be registered with ``pool.receivers`` and
    hand ``pool.holder_done`` as its ``area_done``."""
    lr = loop_ring(loop)
    pool = lr.pool
    if pool is None:
        with contextlib.ExitStack() as undo:  # a failure: a ring opened for it alone goes
            undo.callback(_close_if_unused, lr)
            pool = lr.pool = Pool(lr, size, buf_size)
            undo.pop_all()
    elif (pool.size, pool.buf_size) != (size, buf_size):
        raise UsageError(
            f"this event loop's pool is {pool.size} bytes of {pool.buf_size}-byte buffers, "
            f"not {size} of {buf_size}",
            "open every pooled receiver of a loop with the same pool size and buf_size")
    m = lr.join(pool.bgid)
    with contextlib.ExitStack() as undo:
        undo.callback(m.close)
        p = PooledSoftProvider(fd, pool, m)
        undo.pop_all()
    with pool._holders_lock:
        pool.holders += 1
    return p


def _close_if_unused(lr: LoopRing) -> None:
    if not lr.members and not lr.keepers:
        lr.close()
