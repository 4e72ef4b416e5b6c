"""The Receiver: one socket, one provider, the chunks in flight and their way back. Only the
opening thread (the ring's owner) receives; releases from any thread are queued and given back
to the provider in batches before the owner next enters the kernel (see api.py).

Some facts about re-entry: Python runs inside a receive without another thread. A GC pass at
any allocation runs finalizers (``__del__``), and a signal handler runs between bytecodes.
Such code may release chunks (that is only a queue append, safe from anywhere), but a receive,
flush or close run there would find the provider and its buffer ring half-updated by the
receive it interrupted: a nested receive takes the completions the outer one waits for, a
close unmaps the buffer ring the outer one is writing. So an owner operation marks the
receiver busy while it runs: a receive entered then is refused (UsageError), a flush is left
to the running operation (it gives releases back before it next enters the kernel), and a
close is done as that operation ends. A release during close or during the accounting after
it is queued, and the accounting drains the queue until it stays empty.
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.bookkeeping import ReleaseQueue, Stats, contiguous_runs
from zcnet.rx.zc.chunks import Batch, Chunk, CoalescedChunk, LinearChunk, _as_list, _Held
from zcnet.rx.zc.debugviews import DebugViews
from zcnet.rx.zc.provider import CopyCount, Delivery, Provider
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import accel_for, backend

log = logging.getLogger(__name__)


_rx_of = operator.attrgetter("_rx")
_tok_of = operator.attrgetter("_tok")
_len_of = operator.attrgetter("length")
_sum = np.add.reduce
_get_ident = threading.get_ident


# The keys stats_dict() adds for the kernel's copies (engine stats carry them into bench cells).
COPY_FIELDS = ("kernel_copied_bytes", "kernel_copied_source", "zero_copy_share")


def copy_fields(count: CopyCount, delivered: int) -> dict[str, int | float | str | None]:
    """``COPY_FIELDS`` for ``delivered`` bytes of which the kernel copied ``count``."""
    copied = delivered if count.every_byte else count.bytes
    share = None
    if copied is not None and delivered:
        share = round(max(0.0, 1.0 - copied / delivered), 6)
    return dict(zip(COPY_FIELDS, (copied, count.source, share), strict=True))


class Receiver(DebugViews):
    """Zero-copy receiver bound to one socket and one provider; see the module docstring.

    ``max_held`` is the share of the area the application may hold before the receiver stops
    entering the kernel (back-pressure: TCP's window closes, nothing is dropped); ``debug``
    revokes views on release and poisons released memory.
    """

    # Slots for what zcnet.aio._loopaccel reads and writes every pass (in place, no dict lookup);
    # the rest lives in the instance dict (DebugViews has one).
    # zcnet.uring._accel's chunk release reads debug, _releases and _closed the same way.
    __slots__ = ("_busy", "_close_deferred", "_closed", "_end", "_limit", "_owner_tid",
                 "_releases", "_stream_off", "debug", "stalled")

    def __init__(self, sock: socket.socket | int, provider: Provider, *,
                 max_held: float = 0.75, debug: bool = False, coalesce: bool = False,
                 why: str = "", area_done: Callable[[Area], object] | None = None) -> None:
        if not 0.0 < max_held <= 1.0:
            raise UsageError(f"max_held must be in (0, 1], got {max_held}")
        self.fd = sock if isinstance(sock, int) else sock.fileno()
        self.provider = provider
        self.name = provider.name
        self.why = why
        self.area: Area = provider.area
        self._view = self.area.view
        self.debug = debug
        self.coalesce = coalesce
        # The compiled per-chunk and per-round work (zcnet.uring._accel), unless ZCNET_PURE
        self._accel = accel = accel_for(backend())
        self._chunk_cls: type[Chunk] = CompiledChunk if accel is not None else Chunk
        self._stats = Stats()
        self._limit = int(self.area.size * max_held)
        self._releases = ReleaseQueue()
        self._owner_tid = threading.get_ident()
        self._stream_off = 0
        self._end: int | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self._busy = False  # an owner operation runs (see the module docstring)
        self._close_deferred = False  # close() was called inside it: done when it ends
        self._accounting: int | None = None  # the thread closing or accounting, under the lock
        self._armed_once = False
        self._debug_views = {}
        self.stalled: str | None = None   # "backpressure" | "exhausted" while delivery is paused
        #: Given the area once the receiver is closed and none of it is held: unmaps it, or
        #: keeps it for another receiver (zcnet.aio's loop ring). Called once: None after.
        self._area_done: Callable[[Area], object] | None = area_done or Area.close

    @property
    def stats(self) -> Stats:
        """The counters, with the provider's refill-ring events folded in (owner thread)."""
        self._stats.refill_full = int(self.provider.extra_stats().get("refill_full", 0))
        return self._stats

    @property
    def ring(self) -> Ring | None:
        """The io_uring whose completions deliver this receiver's data, for an event loop to
        wait on; None when the provider reads the socket itself (devmem). The io_uring
        providers all keep their ring as ``_ring``; it is None once they are closed."""
        ring = getattr(self.provider, "_ring", None)
        return ring if isinstance(ring, Ring) else None

    def on_release(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once, from the releasing thread, when a chunk is next released (at
        once if one already is); None cancels. How an event loop waits out a pause
        (``stalled``) without blocking."""
        if self._closed:
            raise ClosedError.of(self, "on_release")
        self._releases.notify(callback)

    # --- owner-thread operations ----------------------------------------------------------------
    def _check_owner(self, method: str) -> None:
        if self._closed:
            raise ClosedError.of(self, method)
        if threading.get_ident() != self._owner_tid:
            raise ZcnetError(f"{method}() called from a thread that did not open the receiver",
                             "iterate in the opening thread; other threads may only release")

    def _refuse(self, method: str) -> None:
        """Raise why ``method`` may not start: closed, another thread, or inside another
        owner operation (see the module docstring). The receives check the three at once
        inline (they run once per round) and call this only when one holds."""
        self._check_owner(method)
        raise UsageError(f"{method}() inside another receive or flush of this receiver (a "
                         "finalizer or a signal handler ran there)",
                         "only release chunks from __del__ and signal handlers; receive in "
                         "the code that owns the receiver")

    def _op_end(self) -> None:
        self._busy = False
        if self._close_deferred:
            self.close()

    def _flush_releases(self) -> None:
        """Give everything released so far back to the kernel in one batch."""
        done = self._releases.drain()
        if not done:
            if self.provider.held_back():
                self.provider.recycle([], [])
            return
        if len(done) == 1 and type(done[0]) is Batch:  # recv_batch: no per-buffer work
            b = done[0]
            self._stats.note_released(len(b._tok), b.length)
            self.provider.recycle(b._tok, b.lengths)
            return
        # The iterator: one int token per chunk
        if self._accel is not None:
            got = self._accel.chunk_tokens(done, self._chunk_cls)  # one pass in C, or None
            if got is not None:
                self._stats.note_released(len(done), got[2])
                self.provider.recycle(got[0], got[1])
                return
        elif set(map(type, done)) == {Chunk}:
            toks: list[int] = list(map(_tok_of, done))
            lens: list[int] = list(map(_len_of, done))
            self._stats.note_released(len(toks), sum(lens))
            self.provider.recycle(toks, lens)
            return
        toks, lens = [], []
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
            nbytes += c.length
        self._stats.note_released(parts, nbytes)
        if arrays:  # a vectorizing provider takes arrays (the order of buffers is free)
            if toks:
                arrays.append(np.asarray(toks, dtype=arrays[0].dtype))
                array_lens.append(np.asarray(lens))
            self.provider.recycle(np.concatenate(arrays), np.concatenate(array_lens))
        else:
            self.provider.recycle(toks, lens)

    def flush(self) -> None:
        """Give chunks released so far back to the kernel now (owner thread); ``recv`` does
        this itself, so call it only to settle the stats when no more receiving follows."""
        self._check_owner("flush")
        if self._busy:
            return  # inside a receive (a finalizer): it gives the releases back itself
        self._busy = True
        try:
            self._flush_releases()
        finally:
            self._op_end()

    def recv(self, timeout: float | None = None) -> list[Chunk]:
        """Chunks received so far, waiting up to ``timeout`` seconds for at least one.

        Returns [] at EOF (then ``eof`` is True) or when nothing arrived in time; while the
        application holds too much (``stalled == "backpressure"``) or the provider ran out of
        buffers (``"exhausted"``) it waits for releases instead of entering the kernel.
        Raises the stream's OSError (ConnectionResetError, ...) after the data before it.
        """
        if self._busy or self._closed or _get_ident() != self._owner_tid:
            self._refuse("recv")
        self._busy = True
        try:
            d = self._next(timeout, "recv")
            return [] if d is None else self._chunks(d)
        finally:
            self._busy = False
            if self._close_deferred:
                self.close()

    def recv_batch(self, timeout: float | None = None) -> Batch | None:
        """Like ``recv`` but one Batch per kernel round (None instead of [])."""
        if self._busy or self._closed or _get_ident() != self._owner_tid:
            self._refuse("recv_batch")
        self._busy = True
        try:
            d = self._next(timeout, "recv_batch")
            if d is None:
                return None
            s = self._stream_off
            lengths = d.lengths
            if type(lengths) is not np.ndarray:
                n = sum(lengths)
            elif self._accel is None or (n := self._accel.int_sum(lengths)) is None:
                n = int(_sum(lengths))  # numpy: 1 us
            self._stats.note_delivered(len(lengths), n)
            self._stream_off = s + n
            if d.linear:
                self._stats.linear += sum(map(len, d.linear.values()))
            return Batch(self, d, s, n)
        finally:
            self._busy = False
            if self._close_deferred:
                self.close()

    def _next(self, timeout: float | None, method: str) -> Delivery | None:
        """The next non-empty delivery, or None at EOF/timeout (see ``recv``); the caller has
        checked the owner (``recv``, ``recv_batch``)."""
        if timeout is not None and not 0 <= timeout < math.inf:
            if timeout != math.inf:  # NaN never reaches a deadline: it would wait forever
                raise UsageError(f"{method}() timeout must be seconds >= 0 or None, "
                                 f"got {timeout!r}", "pass None to wait without a limit")
            timeout = None
        deadline = None if timeout is None else time.monotonic() + timeout
        warned = False
        while True:
            self._flush_releases()
            if self._end is not None:
                return self._finish()
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            stall = self._stall_reason()
            if stall is not None:
                if self.stalled != stall:
                    self.stalled = stall
                    if stall == "backpressure":
                        self._stats.backpressure += 1
                    else:
                        self._stats.exhausted += 1
                    log.info("%s receiver paused: %s (%d of %d bytes held)", self.name, stall,
                             self._stats.in_flight_bytes, self.area.size)
                step = 1.0 if remaining is None else min(remaining, 1.0)
                if not self._releases.wait(step):
                    if remaining is not None and remaining <= step:
                        return None
                    if not warned:
                        warned = True
                        log.warning("%s receiver stalled (%s): the application holds %d of %d "
                                    "area bytes; release chunks to resume", self.name, stall,
                                    self._stats.in_flight_bytes, self.area.size)
                continue
            self.stalled = None
            if not self.provider.armed:
                if self._armed_once:
                    self._stats.rearms += 1
                self.provider.arm()
                self._armed_once = True
            got = self.provider.reap(remaining)
            if got.end is not None:
                self._end = got.end
            if len(got.offsets):
                return got
            if got.end is not None:
                return self._finish()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _stall_reason(self) -> str | None:
        st = self._stats  # in_flight_bytes, without the property call (once per round)
        if st.delivered_bytes - st.released_bytes > self._limit:
            return "backpressure"
        if not self.provider.armed and not self.provider.can_arm():
            return "exhausted"
        return None

    def _finish(self) -> None:
        end = self._end
        if end is not None and end < 0:
            self._end = 0  # report the error once; afterwards behave like EOF
            raise OSError(-end, f"{os.strerror(-end)} (zero-copy receive on fd {self.fd})")
        return None

    @property
    def eof(self) -> bool:
        return self._end is not None

    def _chunks(self, d: Delivery) -> list[Chunk]:
        offsets, lengths, tokens = _as_list(d.offsets), _as_list(d.lengths), _as_list(d.tokens)
        s = self._stream_off
        if d.linear:
            out: list[Chunk] = []
            for i, (off, ln, tok) in enumerate(zip(offsets, lengths, tokens, strict=True)):
                out.append(Chunk(self, off, ln, tok, s) if i not in d.linear
                           else LinearChunk(self, d.linear[i], s))
                s += ln
            self._stats.linear += sum(map(len, d.linear.values()))
        elif self.coalesce and len(offsets) > 1:
            out = []
            for a, b in contiguous_runs(offsets, lengths):
                if b - a == 1:
                    c: Chunk = Chunk(self, offsets[a], lengths[a], tokens[a], s)
                else:
                    c = CoalescedChunk(self, offsets[a], tokens[a:b], lengths[a:b], s)
                    self._stats.coalesced += b - a - 1
                out.append(c)
                s += c.length
        elif self._accel is not None:
            # The per-buffer hot path: every Chunk made in C, with no __init__ frame each.
            out, s = self._accel.make_chunks(self._chunk_cls, self, offsets, lengths, tokens, s)
        else:
            # One C-level map instead of a Python loop: this is the per-buffer hot path.
            starts = list(itertools.accumulate(lengths, initial=s))
            out = list(map(Chunk, itertools.repeat(self), offsets, lengths, tokens, starts))
            s = starts[-1]
        self._stats.note_delivered(len(offsets), s - self._stream_off)
        self._stream_off = s
        return out

    def __iter__(self) -> Iterator[Chunk]:
        """Chunks until EOF; raises the stream's error after the data before it. If the loop
        is left early, chunks received but not yet handed out are released (a chunk the loop
        body got is the application's to release)."""
        if self._accel is not None:
            return self._accel.ChunkIter(self)  # the same loop in C: no generator per chunk
        return self._iterate()

    def _iterate(self) -> Iterator[Chunk]:
        while True:
            got = self.recv()
            if not got:
                if self.eof:
                    return
                continue
            it = iter(got)
            try:
                yield from it
            finally:
                rest = list(it)  # what the loop did not get when it was left early
                if rest:
                    self.release_many(rest)

    # --- any-thread operations ------------------------------------------------------------------
    def release(self, chunk: Chunk | Batch) -> None:
        if chunk._rx is not self:
            if chunk._rx is None:
                raise ValueError(f"{chunk!r} released twice")
            raise ValueError("chunk belongs to another receiver")
        chunk.release()

    def release_many(self, chunks: Iterable[Chunk | Batch]) -> None:
        """Release several chunks with one queue operation; all are checked before any is
        released, so a bad one leaves the rest untouched."""
        batch = list(chunks)
        if self.debug or self._accel is None or not self._accel.mark_released(
                batch, self, _Held):  # checked and marked in one C pass, or:
            if set(map(_rx_of, batch)) - {self}:  # find the culprit only if needed
                for c in batch:
                    if c._rx is not self:
                        raise ValueError(f"{c!r} released twice" if c._rx is None
                                         else "chunk belongs to another receiver")
            if len(set(map(id, batch))) != len(batch):
                raise ValueError("the same chunk appears twice in one release_many")
            for c in batch:
                c._rx = None
        if self.debug:
            for c in batch:
                self._revoke(c)
        self._releases.put_many(batch)
        if self._closed:
            self._release_after_close()

    # --- lifetime ------------------------------------------------------------------------------
    def stats_dict(self) -> dict[str, Any]:
        """Counters for reports (only consistent when read from the owner thread), with
        ``COPY_FIELDS``: how many of the delivered bytes the kernel copied (None: unknown,
        and ``kernel_copied_source`` says why), and the zero-copy share of them."""
        d: dict[str, Any] = self.stats.as_dict()
        d.update(self.provider.extra_stats())
        d.update(copy_fields(self.provider.kernel_copy(), self._stats.delivered_bytes))
        d["provider"] = self.name
        d["why"] = self.why
        return d

    def close(self) -> None:
        """Stop receiving and free the kernel side. Chunks still held stay valid (and may be
        released); the area is unmapped when the last one is released. Afterwards receiving
        raises ClosedError; ``stats``, ``stats_dict`` and ``eof`` still read."""
        if self._closed:
            return
        if threading.get_ident() != self._owner_tid:
            raise ZcnetError("close called from a thread that did not open the receiver")
        if self._busy:  # inside a receive (a finalizer): closed as that receive ends
            self._close_deferred = True
            return
        with self._close_lock:
            if self._closed:  # closed while this waited for the lock (a finalizer there)
                return
            self._closed = True
            self._accounting = threading.get_ident()
            try:
                # A provider that can stop receiving ahead of close (the soft ones) does so,
                # then gets back what was released: its buffers are whole at close, which a
                # loop's shared ring needs to keep them for the next receiver.
                quiesce = getattr(self.provider, "quiesce", None)
                if quiesce is not None:
                    quiesce()
                    self._flush_releases()
            finally:
                try:
                    self.provider.close()
                finally:  # Ctrl-C during the provider's cancel must not leak the area
                    try:
                        self._account_closed()
                    finally:
                        self._accounting = None

    def _release_after_close(self) -> None:
        # The owner no longer drains; whoever releases last does the accounting.
        me = threading.get_ident()
        if self._accounting == me:
            return  # a finalizer inside this thread's close or accounting: that drains it
        with self._close_lock:
            self._accounting = me
            try:
                self._account_closed()
            finally:
                self._accounting = None

    def _account_closed(self) -> None:
        q = self._releases
        while q:  # until empty: a finalizer here may release more (see the module docstring)
            done = q.drain()
            self._stats.note_released(sum(_parts(c) for c in done),
                                      sum(c.length for c in done))
            # Buffers that outlive their receiver (an event loop's pool, zcnet.aio.pool) go
            # back.
            if done and (late := getattr(self.provider, "recycle_closed", None)) is not None:
                late(done)
        done = self._area_done
        if self._stats.in_flight == 0 and done is not None:
            # Once: a kept area is not closed, and a later call (an empty release_many, a
            # release that waited for the lock during close) must not hand it on again.
            self._area_done = None
            done(self.area)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Receiver {self.name} fd={self.fd} area={self.area.kind}:{self.area.size} "
                f"in_flight={self._stats.in_flight}>")


class CompiledChunk(Chunk):
    """The Chunk a receiver with the accelerator hands out: ``release`` runs in C on the common
    path (zcnet.uring._accel.chunk_release) and falls back to _Held.release for the rest."""

    __slots__ = ()


if (_accel := accel_for("c")) is not None:
    CompiledChunk.release = _accel.chunk_release(  # type: ignore[method-assign]
        CompiledChunk, Receiver, ReleaseQueue, deque, _Held.release)


def _parts(held: _Held) -> int:
    return held.parts  # type: ignore[attr-defined,no-any-return]
