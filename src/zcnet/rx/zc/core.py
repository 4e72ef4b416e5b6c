"""The receive core: one connection's receive state as a state machine without I/O (h11 style).

Events in: a provider's delivery (``deliver`` / ``deliver_batch``), chunks released from any
thread (``Chunk.release`` appends to ``queue``), the receive armed (``armed``), close.
Decisions out: the buffers to give back (``returned``), what to do next (``decide``: reap,
arm, re-arm, wait for releases, finish), the chunks to hand out, the error to raise
(``finish``). The blocking :class:`~zcnet.rx.zc.receiver.Receiver` and every zcnet.aio receiver
drive the same core; they differ only in how they wait and enter the kernel.

The receive's state is one field, ``phase``, and its changes are the table ``TRANSITIONS``:

    IDLE ---ARM---> ARMED ---STOP/CANCEL---> STOPPED ---ARM---> ARMED
                      |---EOF----> ENDED
                      '---ERROR--> FAILED ---RAISED---> ENDED

STOP: the multishot receive ended without ending the stream (the provider ran out of
buffers, a CQ overflow, a capped receive's end); the core re-arms once it may. ERROR: the
stream failed; its error is raised once, after the data delivered before it. A closed receiver
keeps its phase: ARMED after close means a receive whose cancel the kernel did not confirm (it
may still write to the area).

``decide`` turns the phase and the held bytes into the next step (``DECISIONS``, first match):
FINISH once ended; BACKPRESSURE while the application holds more than ``limit`` bytes (the
receiver stops entering the kernel, TCP's window closes, nothing is dropped); EXHAUSTED when
the receive is not armed and the provider has no buffer to arm with; ARM / REARM when it is
not armed; else REAP.

Some facts about sharing buffers between threads (the lesson of the zcrx "refs cache
bouncing" series): when the CPU that hands buffers out and the CPU that takes them back both
write the same counters, every release bounces a cache line between them. So every counter
here is written by the owner thread only; another thread that releases a chunk appends it to
``queue`` (``deque.append`` is atomic under the GIL, no lock per chunk), and the owner drains
the queue in one batch before it next enters the kernel.

The fields are ``__slots__`` with public names: the compiled chunk release
(zcnet.rx.zc._rxaccel) is handed the core's layout once, at import, and reads ``C_FIELDS`` in
place; nothing there looks them up by name per call. zcnet.aio._loopaccel's round reads the
core's public fields through cached slot offsets and takes its phases and the two changes it
makes (a re-arm, a stop) from ``TRANSITIONS`` at import: the table is the one place a phase
change is defined.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from enum import IntEnum
from types import MappingProxyType, ModuleType

import numpy as np

from zcnet.errors import UsageError
from zcnet.rx.zc.accel import rx_accel_for
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.bookkeeping import Stats, contiguous_runs
from zcnet.rx.zc.chunks import CHUNK_SLOTS, Batch, Chunk, CoalescedChunk, Held, LinearChunk, as_list
from zcnet.rx.zc.debugviews import DebugViews
from zcnet.rx.zc.provider import Delivery

log = logging.getLogger(__name__)

_sum = np.add.reduce


class Phase(IntEnum):
    IDLE = 0      # never armed
    ARMED = 1     # a receive is armed (devmem: the binding delivers by itself)
    STOPPED = 2   # the receive ended, the stream did not: arm again when it may
    ENDED = 3     # EOF, or the stream's error was raised
    FAILED = 4    # the stream failed: its error is raised once, then ENDED


class Event(IntEnum):
    ARM = 0     # the driver armed the receive
    STOP = 1    # a delivery said the receive ended, not the stream (Delivery.stopped)
    EOF = 2     # a delivery's end 0
    ERROR = 3   # a delivery's end -errno
    RAISED = 4  # finish() raised the error
    CANCEL = 5  # the provider cancelled the receive and saw it end (close)


class Action(IntEnum):
    REAP = 0          # enter the kernel (or wait for data) and take what it delivered
    ARM = 1           # arm the receive for the first time
    REARM = 2         # arm it again after a STOP (counted in stats.rearms)
    BACKPRESSURE = 3  # wait for releases: the application holds more than max_held
    EXHAUSTED = 4     # wait for releases: the provider has no buffer to arm with
    FINISH = 5        # the stream ended: EOF, or raise its error once (``finish``)


P, E = Phase, Event
#: Every change of ``phase``: (phase, event) -> the next phase. Anything else is a bug in a
#: driver of the core, and ``transition`` raises.
TRANSITIONS: Mapping[tuple[Phase, Event], Phase] = MappingProxyType({
    (P.IDLE, E.ARM): P.ARMED,
    (P.STOPPED, E.ARM): P.ARMED,
    (P.ARMED, E.STOP): P.STOPPED,
    (P.ARMED, E.EOF): P.ENDED,
    (P.ARMED, E.ERROR): P.FAILED,
    (P.FAILED, E.RAISED): P.ENDED,
    (P.ARMED, E.CANCEL): P.STOPPED,
})

#: ``decide``'s rules in order, as data: (what must hold, the action). ``held > limit`` is
#: the application holding more than ``max_held`` of the area; ``no buffers`` the provider's
#: ``can_arm()`` answering False.
DECISIONS: tuple[tuple[str, Action], ...] = (
    ("phase is ENDED or FAILED", Action.FINISH),
    ("held > limit", Action.BACKPRESSURE),
    ("phase is IDLE or STOPPED, no buffers", Action.EXHAUSTED),
    ("phase is IDLE", Action.ARM),
    ("phase is STOPPED", Action.REARM),
    ("phase is ARMED", Action.REAP),
)

#: The fields the compiled chunk release reads in place (see the module docstring).
C_FIELDS = ("closed", "debug", "waiting", "queue")

# The same values as plain ints for the per-round code (an enum member's lookup costs more).
_IDLE, _ARMED, _STOPPED, _ENDED, _FAILED = map(int, Phase)
_REAP, _ARM, _REARM, _BACKPRESSURE, _EXHAUSTED, _FINISH = map(int, Action)


class RxCore(DebugViews):
    """One connection's receive state (see the module docstring). Only the owner thread calls
    its methods; any thread releases chunks into ``queue``."""

    __slots__ = ("accel", "area", "busy", "chunk_cls", "closed", "coalesce", "debug", "error",
                 "event", "fd", "late", "limit", "name", "notify_cb", "owner_tid", "phase",
                 "queue", "stalled", "stats", "stream_off", "view", "views", "waiting")

    def __init__(self, area: Area, *, name: str, fd: int, max_held: float = 0.75,
                 debug: bool = False, coalesce: bool = False, accel: ModuleType | None = None,
                 chunk_cls: type[Chunk] = Chunk) -> None:
        if not 0.0 < max_held <= 1.0:
            raise UsageError(f"max_held must be in (0, 1], got {max_held}")
        self.name = name
        self.fd = fd
        self.area = area
        self.view = area.view
        self.limit = int(area.size * max_held)
        self.debug = debug
        self.coalesce = coalesce
        self.accel = accel
        self.chunk_cls = chunk_cls
        self.stats = Stats()
        self.phase = _IDLE
        self.error = 0
        self.stalled: str | None = None   # "backpressure" | "exhausted" while paused
        self.stream_off = 0
        self.queue: deque[Held] = deque()
        self.waiting = False               # the owner waits for a release (put signals)
        self.notify_cb: Callable[[], None] | None = None
        self.event = threading.Event()
        self.closed = False
        self.busy = False  # an owner operation runs (see zcnet.rx.zc.receiver)
        self.owner_tid = threading.get_ident()
        self.views: dict[int, list[object]] = {}
        #: Called by a release after close (the owner no longer drains): the receiver's
        #: accounting. None: nothing to do.
        self.late: Callable[[], None] | None = None

    # --- the receive's state --------------------------------------------------------------
    def transition(self, event: Event) -> None:
        nxt = TRANSITIONS.get((Phase(self.phase), event))
        if nxt is None:
            raise RuntimeError(f"{self.name} receive: {event.name} in phase "
                               f"{Phase(self.phase).name}")
        self.phase = int(nxt)

    @property
    def armed(self) -> bool:
        """A receive is armed (and may write to the area)."""
        return self.phase == _ARMED

    def reaping(self) -> bool:
        """Whether ``decide`` would answer REAP with no pause to end: the receive is armed and
        the application holds no more than ``limit`` (no side effect: an event loop asks
        before it enters the kernel)."""
        st = self.stats
        return (self.phase == _ARMED and self.stalled is None
                and st.delivered_bytes - st.released_bytes <= self.limit)

    @property
    def ended(self) -> bool:
        """The stream ended (EOF or an error): nothing more will be delivered."""
        return self.phase >= _ENDED

    def decide(self, can_arm: Callable[[], bool]) -> int:
        """The next step, an ``Action`` (``DECISIONS``, as plain ints: this runs once per
        round); a pause is counted once and logged as it starts."""
        phase = self.phase
        if phase >= _ENDED:
            return _FINISH
        st = self.stats
        if st.delivered_bytes - st.released_bytes > self.limit:
            act, why = _BACKPRESSURE, "backpressure"
        elif phase != _ARMED:
            if can_arm():
                self.stalled = None
                return _ARM if phase == _IDLE else _REARM
            act, why = _EXHAUSTED, "exhausted"
        else:
            self.stalled = None
            return _REAP
        if self.stalled != why:
            self.stalled = why
            if act == _BACKPRESSURE:
                st.backpressure += 1
            else:
                st.exhausted += 1
            log.info("%s receiver paused: %s (%d of %d bytes held)", self.name, why,
                     st.delivered_bytes - st.released_bytes, self.area.size)
        return act

    def armed_now(self) -> None:
        """The driver armed the receive (after ARM or REARM)."""
        if self.phase == _STOPPED:
            self.stats.rearms += 1
        self.transition(Event.ARM)

    def cancelled(self) -> None:
        """The provider confirmed that the receive is over (a cancel at close)."""
        if self.phase == _ARMED:
            self.transition(Event.CANCEL)

    def finish(self) -> None:
        """At FINISH: raise the stream's error once (then EOF), or return (EOF)."""
        if self.phase == _FAILED:
            self.transition(Event.RAISED)
            err = self.error
            raise OSError(err, f"{os.strerror(err)} (zero-copy receive on fd {self.fd})")

    def _ended_by(self, d: Delivery) -> None:
        """The phase change a delivery brings: the stream's end, or its receive's stop."""
        end = d.end
        if end is not None:
            if end == 0:
                self.transition(Event.EOF)
            else:
                self.error = -end
                self.transition(Event.ERROR)
        elif d.stopped:
            self.transition(Event.STOP)

    # --- deliveries ------------------------------------------------------------------------
    def deliver(self, d: Delivery) -> list[Chunk]:
        """The chunks of a delivery (possibly none), counted, with the phase changed as it
        says (EOF, error, stop)."""
        if d.end is not None or d.stopped:
            self._ended_by(d)
        if not len(d.offsets):
            return []
        offsets, lengths, tokens = as_list(d.offsets), as_list(d.lengths), as_list(d.tokens)
        s = self.stream_off
        if d.linear:
            out: list[Chunk] = []
            for i, (off, ln, tok) in enumerate(zip(offsets, lengths, tokens, strict=True)):
                out.append(Chunk(self, off, ln, tok, s) if i not in d.linear
                           else LinearChunk(self, d.linear[i], s))
                s += ln
            self.stats.linear += sum(map(len, d.linear.values()))
        elif self.coalesce and len(offsets) > 1:
            out = []
            for a, b in contiguous_runs(offsets, lengths):
                if b - a == 1:
                    c: Chunk = Chunk(self, offsets[a], lengths[a], tokens[a], s)
                else:
                    c = CoalescedChunk(self, offsets[a], tokens[a:b], lengths[a:b], s)
                    self.stats.coalesced += b - a - 1
                out.append(c)
                s += c.length
        elif self.accel is not None:
            # The per-buffer hot path: every Chunk made in C, with no __init__ frame each.
            out, s = self.accel.make_chunks(self, offsets, lengths, tokens, s)
        else:
            # One C-level map instead of a Python loop: this is the per-buffer hot path.
            starts = list(itertools.accumulate(lengths, initial=s))
            out = list(map(Chunk, itertools.repeat(self), offsets, lengths, tokens, starts))
            s = starts[-1]
        self.stats.note_delivered(len(offsets), s - self.stream_off)
        self.stream_off = s
        return out

    def deliver_batch(self, d: Delivery) -> Batch | None:
        """A delivery as one Batch (None when it holds no data), as ``deliver``."""
        if d.end is not None or d.stopped:
            self._ended_by(d)
        lengths = d.lengths
        if not len(lengths):
            return None
        s = self.stream_off
        if type(lengths) is not np.ndarray:
            n = sum(lengths)
        elif self.accel is None or (n := self.accel.int_sum(lengths)) is None:
            n = int(_sum(lengths))  # numpy: 1 us
        self.stats.note_delivered(len(lengths), n)
        self.stream_off = s + n
        if d.linear:
            self.stats.linear += sum(map(len, d.linear.values()))
        return Batch(self, d, s, n)

    # --- releases ------------------------------------------------------------------------------
    def put_many(self, items: Iterable[Held]) -> None:
        """Queue released items (any thread)."""
        self.queue.extend(items)
        if self.waiting:
            self.signal()

    def signal(self) -> None:
        """A release while the owner waits: wake it (its event, or its callback once)."""
        self.event.set()
        notify, self.notify_cb = self.notify_cb, None
        if notify is not None:
            notify()

    def notify(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once, from the releasing thread, at the next release (at once
        when one is queued); None cancels. How an event loop waits out a pause."""
        self.notify_cb = callback
        self.waiting = callback is not None
        if callback is not None and self.queue:
            self.signal()

    def wait_release(self, timeout: float | None) -> bool:
        """Sleep until something is released or ``timeout`` passes; True when items wait."""
        if self.queue:
            return True
        self.event.clear()
        self.waiting = True
        try:
            # Re-check after announcing the wait: a put between the check and the flag would
            # otherwise not set the event.
            if self.queue:
                return True
            self.event.wait(timeout)
        finally:
            self.waiting = self.notify_cb is not None
        return bool(self.queue)

    def drain(self) -> list[Held]:
        """Everything released so far, oldest first (owner thread only).

        Another drain may run inside this one: the list's allocation can start a GC pass
        whose finalizer drains (a flush from ``__del__``). That drain takes what is left, and
        this one keeps what it had popped: every item goes to exactly one of them."""
        q = self.queue
        n = len(q)
        if n < 2:  # one batch per round (recv_batch): no map over a repeat
            return [q.popleft()] if n else []
        # n pops in C (no Python frame per item); items other threads append meanwhile stay.
        out: list[Held] = []
        try:
            out.extend(map(deque.popleft, itertools.repeat(q, n)))
        except IndexError:  # a nested drain emptied the queue: extend kept what it had taken
            return out
        return out

    def returned(self) -> tuple[list[int] | np.ndarray, list[int] | np.ndarray] | None:
        """The buffers released so far, as (tokens, lengths) for the provider's ``recycle``,
        counted released; None when nothing was."""
        done = self.drain()
        if not done:
            return None
        st = self.stats
        if len(done) == 1 and type(done[0]) is Batch:  # recv_batch: no per-buffer work
            b = done[0]
            st.note_released(len(b._tok), b.length)
            return b._tok, b.lengths
        # The iterator: one int token per chunk
        if self.accel is not None:
            got = self.accel.chunk_tokens(done)  # one pass in C, or None
            if got is not None:
                st.note_released(len(done), got[2])
                return got[0], got[1]
        elif set(map(type, done)) == {Chunk}:
            toks: list[int] = [c._tok for c in done]
            lens: list[int] = [c.length for c in done]
            st.note_released(len(toks), sum(lens))
            return toks, lens
        return self._returned_mixed(done)

    def _returned_mixed(self, done: list[Held]
                        ) -> tuple[list[int] | np.ndarray, list[int] | np.ndarray]:
        """``returned`` for any mix of chunks, coalesced chunks and batches."""
        toks: list[int] = []
        lens: list[int] = []
        arrays: list[np.ndarray] = []
        array_lens: list[np.ndarray] = []
        parts = nbytes = 0
        for c in done:
            t = c._tok
            if type(t) is int:
                toks.append(t)
                lens.append(c.length)
                parts += 1
            else:
                ls = c._lens if type(c) is CoalescedChunk else c.lengths
                if type(t) is np.ndarray:
                    arrays.append(t)
                    array_lens.append(np.asarray(ls))
                else:
                    toks.extend(t)
                    lens.extend(ls)
                parts += len(t)
            # ``+``, as sum() on the all-chunks path: a length that is not an int fails
            # with the same message either way (the compiled path always comes here).
            nbytes = nbytes + c.length
        self.stats.note_released(parts, nbytes)
        if arrays:  # a vectorizing provider takes arrays (the order of buffers is free)
            if toks:
                arrays.append(np.asarray(toks, dtype=arrays[0].dtype))
                array_lens.append(np.asarray(lens))
            return np.concatenate(arrays), np.concatenate(array_lens)
        return toks, lens

    def release_many(self, items: list[Held]) -> None:
        """Release several held items with one queue operation; all are checked before any
        is released, so a bad one leaves the rest untouched."""
        if self.debug or self.accel is None or not self.accel.mark_released(items, self):
            if set(map(_owner_of, items)) - {self}:  # find the culprit only if needed
                for c in items:
                    if c._rx is not self:
                        raise ValueError(f"{c!r} released twice" if c._rx is None
                                         else "chunk belongs to another receiver")
            if len(set(map(id, items))) != len(items):
                raise ValueError("the same chunk appears twice in one release_many")
            for c in items:
                c._rx = None
        if self.debug:
            for c in items:
                self.revoke(c)
        self.put_many(items)
        if self.closed and self.late is not None:
            self.late()

    def late_release(self) -> None:
        """A release after close (Chunk.release): the receiver's accounting."""
        if self.late is not None:
            self.late()


def _owner_of(held: Held) -> RxCore | None:
    return held._rx


class CompiledChunk(Chunk):
    """The Chunk a core with the compiled twins hands out: ``release`` runs in C on the common
    path (zcnet.rx.zc._rxaccel's, bound below) and falls back to Held.release for the rest."""

    __slots__ = ()


if (_rx_c := rx_accel_for("c")) is not None:
    CompiledChunk.release = _rx_c.bind(  # type: ignore[method-assign]
        Held, CompiledChunk, CHUNK_SLOTS, RxCore, deque, Held.release)
