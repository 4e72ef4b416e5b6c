"""Waking the event loop when an io_uring has work, through an eventfd the ring signals.

Some facts about ring readiness with DEFER_TASKRUN (the soft and zcrx providers' rings):

- When data arrives the kernel does not post a CQE: it queues task work on the ring, and the
  CQE appears only inside the owner's next ``io_uring_enter(GETEVENTS)``.
- ``poll()`` on the ring fd reports EPOLLIN when the CQ has entries *or* task work is pending,
  but queueing task work does not wake the ring's poll wait queue. A fresh poll()/select()
  scan sees it; epoll, which only re-checks an fd after a wake-up, is never told. Measured on
  this kernel (6.18): data arrives, ``select`` says the ring fd is readable, an epoll set
  holding it stays empty. asyncio, uvloop and trio all sit on epoll, so ``add_reader(ring.fd)``
  would sleep through data that has arrived.
- An eventfd registered with IORING_REGISTER_EVENTFD is signalled when task work is queued on
  an empty list, and when CQEs are posted (our own enter included). How soon after the data
  differs between kernels: ~16 ms on 6.18.44 here, where the loop's own rings then run
  COOP_TASKRUN instead (zcnet.aio.taskrun). zcrx rings cannot (DEFER_TASKRUN is required).

So the loop watches an eventfd, and the rule that loses no wake-up is: sleep only right after
an enter that found nothing. Work queued after that enter lands on an empty list and signals
the eventfd. Draining the eventfd at any other moment is safe because another enter comes
before the next sleep; the receiver drains it right after a productive enter to swallow the
signal its own CQE posting raised, which would otherwise cost one idle loop iteration.

No helper thread: the loop's own epoll wait is the only place anyone sleeps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from zcnet.aio import backend
from zcnet.aio.backend import check_one_waiter
from zcnet.aio.looptypes import Future, HasLoop, Loop
from zcnet.uring.eventfd import drain, register_eventfd
from zcnet.uring.ring import Ring


class Wakeup:
    """Readiness of one fd as awaitable events on one loop.

    With a ring: an eventfd registered with it, watched for the wakeup's whole life and drained
    on every signal. With ``sock_fd`` instead (a provider that reads the socket itself): the
    socket is watched only while someone waits, since it stays readable until read.
    ``on_ready`` runs in the loop on every signal; ``wait`` returns at the next one.
    """

    def __init__(self, loop: Loop, ring: Ring | None, *,
                 sock_fd: int = -1, on_ready: Callable[[], None] | None = None) -> None:
        self.loop = loop
        self._on_ready = on_ready
        self._waiter: Future[None] | None = None
        self._watching = False
        if ring is None:
            self.efd = -1
            self.fd = sock_fd
            return
        self.efd = self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, self.efd)
            register_eventfd(ring, self.efd)
            loop.add_reader(self.efd, self._ready)
            undo.pop_all()
        self._watching = True

    def _ready(self) -> None:
        if self.efd >= 0:
            drain(self.efd)
        else:
            self._unwatch()
        if self._on_ready is not None:
            self._on_ready()
        self.kick()

    def kick(self) -> None:
        """Wake the waiter, if any (loop thread)."""
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def swallow(self) -> None:
        """Drain the eventfd after an enter that posted CQEs (see the module docstring)."""
        if self.efd >= 0:
            drain(self.efd)

    async def wait(self) -> None:
        if self.fd < 0:
            raise ValueError("wait on a closed wakeup")
        backend.check_one_waiter(self._waiter)
        if not self._watching:
            self.loop.add_reader(self.fd, self._ready)
            self._watching = True
        fut = self._waiter = self.loop.create_future()
        try:
            await fut
        finally:
            self._waiter = None

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)

    def close(self) -> None:
        """Stop watching and close the eventfd; a pending ``wait`` is cancelled."""
        if self.fd < 0:
            return
        self._unwatch()
        w = self._waiter
        if w is not None and not w.done() and not self.loop.is_closed():
            w.cancel()
        if self.efd >= 0:
            os.close(self.efd)
        self.efd = self.fd = -1
        self._on_ready = None  # a bound method of the owner: no cycle outlives the close


def wake_each(woken: list[Waiting]) -> None:
    """``wake()`` each member; a failing one does not stop the others, and the first failure
    is raised at the end."""
    failure: BaseException | None = None
    for m in woken:
        try:
            m.wake()
        except Exception as e:  # one try per member: the others still run
            failure = failure or e
    if failure is not None:
        raise failure


class Waiting:
    """Waking a member's receiver: its transport's round (``on_ready``) or its task's future
    (``waiter``). A MemberRing here; a zcrx receiver's member in zcnet.aio.loop_zcrx."""

    __slots__ = ()
    lr: HasLoop  # the loop's ring (or zcrx queue): its ``loop`` makes the futures
    waiter: Future[None] | None
    on_ready: Callable[[], None] | None
    closed: bool

    def wake(self) -> None:
        """Run the receiver's round as a dispatch does: its transport's, or its task's."""
        if self.on_ready is not None:
            self.on_ready()
        else:
            self.kick()

    def kick(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    def wait(self) -> Future[None]:
        """A future the next dispatch (or close) resolves, awaited as it is: no coroutine frame
        per wake-up. One whose waiter was cancelled is dropped by the next kick or wait. The
        awaiting code clears ``waiter`` when its await ends unwoken (its awaitable closed,
        thrown into or dropped after a step): a future nobody awaits any more would otherwise
        make every later wait look like another task's (``check_one_waiter``)."""
        check_one_waiter(self.waiter)
        fut: Future[None] = self.lr.loop.create_future()
        self.waiter = fut
        if self.closed:  # closed while the future was made (a GC pass): no kick will come
            self.kick()
        return fut
