"""zcrx receivers on an event loop: every connection of the loop's thread on one NIC queue (or
in copy mode) receives through that queue's ZcrxQueue (zcnet.rx.zc.zcrx_queue), driven by
the loop.

Some facts that shape it:

- A zcrx queue takes one ifq, and its ring is single-issuer, so there is one ZcrxQueue per
  (netns, device, queue) per thread, which the loop's thread owns; the receivers of that thread
  join it (``open_zcrx``'s rules: a device queue is joined, not registered again; a device
  that cannot do zcrx takes the kernel's copy mode, on the one copy-mode queue of the thread).
- Each receiver is the blocking API's Receiver over a ZcrxProvider: its round is
  ``recv(0)``, which pumps the queue's ring when its inbox is empty (one enter; every CQE into
  its member's inbox). What this module adds is when to run it.
- One eventfd registered on the queue's ring and one loop reader (``LoopZcrx.poll``): a pass
  drains the eventfd, enters once (GETEVENTS: the task work runs), routes the CQEs, and
  wakes the receivers whose inbox holds completions. Work queued after the pass's enter
  signals the eventfd again (no lost wake-up), and so do the CQEs a receiver's own pump
  posts, so the others hear of theirs in the next pass.
- The area's buffers are shared: a receiver paused because it may not arm ("exhausted": its
  share is held, or the queue ran dry) is resumed by its own releases (``on_release``) but also
  by anyone's returns, and by a connection leaving (the shares grow). So while any receiver is
  paused so, each round that ends schedules a pass, which wakes those that may arm now (what
  ``ZcrxQueue.ready`` does for a blocking server).
- No compiled pass: these rounds are the Python ones (zcnet.aio.shared.compiled_round
  answers None for a member whose ring has no ``accel``).
- zcrx needs DEFER_TASKRUN, whose eventfd signal some kernels raise an RCU grace period late
  (~16 ms; zcnet.aio.taskrun: 6.18.44 here and Debian's 7.3.4 both). There a receiver whose
  round ended with its receive armed also watches its socket, once (``round_done``): the
  socket turns readable when data arrives, and the pass that wakes then runs the task work
  that takes the data. Only while armed: a socket whose receive cannot take its data stays
  readable, and a level-triggered reader would spin.
"""

from __future__ import annotations

import contextlib
import os
import socket
import weakref
from typing import cast

from zcnet.aio.looptypes import Future, Loop
from zcnet.aio.taskrun import signal_is_prompt
from zcnet.aio.wakeup import Waiting, wake_each
from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.rx.zc import zcrx
from zcnet.rx.zc.api import Receiver
from zcnet.rx.zc.devnote import device_note
from zcnet.rx.zc.providers import Option
from zcnet.rx.zc.zcrx import ZcrxProvider, ZcrxQueue
from zcnet.rx.zc.zcrx_queue import find_open, queue_key
from zcnet.uring.completions import Completions
from zcnet.uring.eventfd import drain, register_eventfd, unregister_eventfd

#: The options a zcrx receiver on the loop takes: the provider's, then the Receiver's.
ZCRX_OPTIONS = frozenset({"hugetlb", "dmabuf_fd", "ifname", "queue", "rx_buf_len",
                          "max_held", "coalesce", "debug"})
_PROVIDER_OPTIONS = ("hugetlb", "dmabuf_fd", "ifname", "queue", "rx_buf_len")
_EXHAUSTED = "exhausted"


class LoopZcrx:
    """One ZcrxQueue received on one loop: its eventfd, reader and receivers (members)."""

    accel = None  # no compiled pass for zcrx rounds (compiled_round reads it)

    def __init__(self, loop: Loop, zq: ZcrxQueue, own: bool) -> None:
        self.loop = loop
        self.zq = zq
        #: Opened here (the copy-mode queue): closed with its last receiver.
        self.own = own
        self.members: dict[int, ZcrxMember] = {}  # by the provider's member id
        self.paused: set[ZcrxMember] = set()      # stalled "exhausted": see the module doc
        #: The eventfd hears of arriving data at once; if not, members watch their sockets.
        self.prompt = signal_is_prompt()
        #: What every receiver's ``why`` says about the device (netdevsim: no NIC's DMA).
        self.device_note = None if zq.copy else device_note(zq.ifname)
        self._scheduled = False
        ring = zq.ring
        assert ring is not None
        with contextlib.ExitStack() as undo:
            self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            undo.callback(os.close, self.efd)
            register_eventfd(ring, self.efd)
            undo.callback(unregister_eventfd, ring)
            loop.add_reader(self.efd, self.poll)
            undo.pop_all()
        _by_queue[zq] = self

    def join(self, p: ZcrxProvider, rx: Receiver) -> ZcrxMember:
        m = self.members[p.mid] = ZcrxMember(self, p, rx)
        return m

    def leave(self, m: ZcrxMember) -> None:
        """``m``'s receiver closed: with no receiver left, the loop lets go of the queue."""
        if self.members.get(m.p.mid) is m:
            del self.members[m.p.mid]
        self.paused.discard(m)
        if self.members:
            if self.paused:
                self.schedule()  # the others' shares grew
        else:
            self.close()

    def leave_if_empty(self) -> None:
        """An open that failed: the loop lets go of a queue it holds for nobody."""
        if not self.members:
            self.close()

    def close(self) -> None:
        """Stop watching the queue, and close it when opened here and nobody else is on it."""
        zq = self.zq
        with contextlib.ExitStack() as undo:
            if self.own and not zq.members:
                undo.callback(zq.close)
            elif zq.ring is not None and self.efd >= 0:  # open for others: the next loop
                undo.callback(unregister_eventfd, zq.ring)  # registers its own eventfd
            self._unwatch()

    def _unwatch(self) -> None:
        _by_queue.pop(self.zq, None)
        efd, self.efd = self.efd, -1
        if efd < 0:
            return
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, efd)
            if not self.loop.is_closed():
                self.loop.remove_reader(efd)

    # --- passes ------------------------------------------------------------------------------
    def schedule(self) -> None:
        """One pass later in this loop iteration (once, however many ask)."""
        if not self._scheduled and self.efd >= 0 and not self.loop.is_closed():
            self._scheduled = True
            self.loop.call_soon(self._scheduled_poll)

    def _scheduled_poll(self) -> None:
        self._scheduled = False
        self.poll()

    def poll(self) -> None:
        """Drain the eventfd, enter the ring once and route its CQEs, wake the receivers with
        completions and the paused ones that may arm now. A queue closed under its receivers
        wakes them all, once (each raises ClosedError naming the queue). The first failing
        wake-up is raised after all."""
        if self.efd < 0:
            return
        drain(self.efd)
        zq = self.zq
        if zq.closed:
            self._unwatch()
            woken = list(self.members.values())
        else:
            ring = zq.ring
            assert ring is not None
            ring.get_events()  # runs the task work: a plain enter (pump(0) would arm a timer)
            if ring.cq_ready() or self.paused:
                # Routes what is there (no second enter); while a receiver waits for buffers,
                # also gives back those of connections that closed holding chunks.
                zq.pump(0)
            woken = [m for m in self.members.values() if m.p.inbox]
            if self.paused:
                armable = [m for m in self.paused if m.p.can_arm()]
                self.paused.difference_update(armable)
                woken += [m for m in armable if not m.p.inbox]
        wake_each(woken)


class ZcrxMember(Waiting):
    """One zcrx receiver's place on its LoopZcrx: what its task awaits (``wait``) or its
    transport's round (``on_ready``), shaped like the MemberRing a soft receiver has."""

    __slots__ = ("closed", "fast", "lr", "on_ready", "p", "rx", "waiter", "watching")

    def __init__(self, lr: LoopZcrx, p: ZcrxProvider, rx: Receiver) -> None:
        self.lr = lr
        self.p = p
        self.rx = rx
        self.waiter = None
        self.on_ready = None
        self.fast = None
        self.closed = False
        #: The socket's fd while the loop watches it (late eventfd signal: the module doc).
        self.watching = -1

    @property
    def inbox(self) -> list[Completions]:
        return self.p.inbox

    def has_data(self) -> bool:
        """Whether the receiver's round would find anything: completions routed to it (after
        a pass, when none were), or its queue's end (ClosedError)."""
        if not self.p.inbox:
            self.lr.poll()
        return bool(self.p.inbox) or self.lr.zq.closed

    def round_done(self) -> None:
        """The receiver's round ended (it waits now): note whether it is paused for buffers
        (see the module docstring), and while anyone is, look again after this round."""
        lr = self.lr
        if self.rx.core.stalled == _EXHAUSTED:
            lr.paused.add(self)
        else:
            lr.paused.discard(self)
        if lr.paused:
            lr.schedule()
        if (self.watching < 0 and not lr.prompt and self.p.fd >= 0
                and self.rx.core.armed and not lr.loop.is_closed()):
            self.watching = self.p.fd
            lr.loop.add_reader(self.watching, self._socket_ready)

    def _socket_ready(self) -> None:
        """Data arrived (or the peer ended): one pass, which runs the task work."""
        self.unwatch()
        self.lr.poll()

    def unwatch(self) -> None:
        fd, self.watching = self.watching, -1
        if fd >= 0 and not self.lr.loop.is_closed():
            self.lr.loop.remove_reader(fd)

    def wait(self) -> Future[None]:
        self.round_done()
        return super().wait()

    def leave(self) -> None:
        """The receiver closed (its provider left the queue)."""
        if not self.closed:
            self.closed = True
            self.on_ready = None
            self.unwatch()
            self.kick()
            self.lr.leave(self)


_by_queue: weakref.WeakKeyDictionary[ZcrxQueue, LoopZcrx] = weakref.WeakKeyDictionary()


def _loop_queue(loop: Loop, zq: ZcrxQueue, own: bool) -> LoopZcrx:
    lq = _by_queue.get(zq)
    if lq is None:
        return LoopZcrx(loop, zq, own)
    if lq.loop is not loop:
        raise ZcnetError(f"zcrx {zq.where} is received by another event loop of this thread",
                         "close that loop's receivers first (a queue's ring is single-issuer)")
    return lq


def _copy_queue(loop: Loop, area_size: int, opts: dict[str, Option]) -> LoopZcrx:
    """This thread's copy-mode queue (opened now with ``area_size`` when it has none) on
    ``loop``."""
    zq = find_open(queue_key(0, 0))
    own = zq is None
    if zq is None:
        zq = zcrx.open_zcrx_queue(area_size, copy=True, hugetlb=bool(opts.get("hugetlb")),
                                  rx_buf_len=cast(int, opts.get("rx_buf_len") or 0))
    with contextlib.ExitStack() as undo:
        if own:
            undo.callback(zq.close)
        lq = _loop_queue(loop, zq, own)
        undo.pop_all()
    return lq


def _open_provider(loop: Loop, fd: int, area_size: int,
                   opts: dict[str, Option]) -> tuple[ZcrxProvider, LoopZcrx | None, str]:
    """The socket's provider by open_zcrx's rules (the device's queue, else copy mode where the
    kernel has it), with copy mode on the thread's shared copy-mode queue; that queue's
    LoopZcrx in copy mode, and why copy mode."""
    offers = zcrx.kernel_offers()
    if not offers.copy_mode or opts.get("dmabuf_fd") is not None:
        return zcrx.open_zcrx(fd, area_size, **opts), None, ""  # type: ignore[arg-type]
    try:
        return (zcrx.open_zcrx(fd, area_size, copy=False, **opts),  # type: ignore[arg-type]
                None, "")
    except Unsupported as e:
        why = e.message
    lq = _copy_queue(loop, area_size, opts)
    with contextlib.ExitStack() as undo:
        undo.callback(lq.leave_if_empty)
        p = zcrx.open_zcrx(fd, area_size, copy=True, **opts)  # type: ignore[arg-type]
        undo.pop_all()
    return p, lq, why


def open_zcrx_receiver(loop: Loop, sock: socket.socket, area_size: int,
                       kw: dict[str, Option], what: str) -> tuple[Receiver, ZcrxMember]:
    """A zcrx Receiver on ``sock`` through the loop thread's queue for it, and its member.
    ``area_size``: the queue's area when this receiver opens the queue (a receiver joining an
    open queue shares its area)."""
    extra = set(kw) - ZCRX_OPTIONS
    if extra:
        raise UsageError(f"{what} with provider 'zcrx' does not take "
                         f"{', '.join(sorted(extra))}",
                         f"it takes area_size, {', '.join(sorted(ZCRX_OPTIONS))}")
    opts = {k: kw[k] for k in _PROVIDER_OPTIONS if k in kw}
    p, lq, why = _open_provider(loop, sock.fileno(), area_size, opts)
    with contextlib.ExitStack() as undo:
        undo.callback(lambda: _abandon(p, lq))  # the lq of the moment
        if lq is None:
            lq = _loop_queue(loop, p.zq, False)
        rx = Receiver(sock, p, max_held=cast(float, kw.get("max_held", 0.75)),
                      debug=bool(kw.get("debug", False)),
                      coalesce=bool(kw.get("coalesce", False)),
                      why=f"zcrx requested; {p.note}" + (f" ({why})" if why else "")
                      + (f"; {lq.device_note}" if lq.device_note else ""))
        m = lq.join(p, rx)
        undo.pop_all()
    return rx, m


def _abandon(p: ZcrxProvider, lq: LoopZcrx | None) -> None:
    """An open that failed after the provider joined: it leaves the queue (and gives its use
    of the area back), then the loop lets go of a queue it holds for nobody."""
    with contextlib.ExitStack() as undo:
        if lq is not None:
            undo.callback(lq.leave_if_empty)
        undo.callback(p.area_done, p.area)
        p.close()


__all__ = ["ZCRX_OPTIONS", "LoopZcrx", "ZcrxMember", "open_zcrx_receiver"]
