"""The Receiver: one socket, one provider and the receive core (zcnet.rx.zc.core) between them.
Only the opening thread (the ring's owner) receives; releases from any thread are queued and
given back to the provider in batches before the owner next enters the kernel (see api.py).
What the Receiver adds to the core is the blocking side: where to wait (in the provider's
reap, or for a release while delivery is paused), the owner thread, and close.

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

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.rx.zc.accel import rx_accel_for
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.bookkeeping import Stats
from zcnet.rx.zc.chunks import Batch, Chunk, Held
from zcnet.rx.zc.core import Action, CompiledChunk, RxCore
from zcnet.rx.zc.provider import CopyCount, Provider
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import backend

log = logging.getLogger(__name__)

_get_ident = threading.get_ident
_REAP, _FINISH, _PAUSED = int(Action.REAP), int(Action.FINISH), int(Action.BACKPRESSURE)


# The keys stats_dict() adds for the kernel's copies (engine stats carry them into bench cells).
COPY_FIELDS = ("kernel_copied_bytes", "kernel_copied_source", "zero_copy_share")

#: What stats_dict() holds: counters, the copy fields and the provider's name and reason.
StatValue = int | float | str | None


def copy_fields(count: CopyCount, delivered: int) -> dict[str, StatValue]:
    """``COPY_FIELDS`` for ``delivered`` bytes of which the kernel copied ``count``."""
    copied = delivered if count.every_byte else count.bytes
    share = None
    if copied is not None and delivered:
        share = round(max(0.0, 1.0 - copied / delivered), 6)
    return dict(zip(COPY_FIELDS, (copied, count.source, share), strict=True))


class Receiver:
    """Zero-copy receiver bound to one socket and one provider; see the module docstring.

    ``max_held`` is the share of the area the application may hold before the receiver stops
    entering the kernel (back-pressure: TCP's window closes, nothing is dropped); ``debug``
    revokes views on release and poisons released memory.
    """

    def __init__(self, sock: socket.socket | int, provider: Provider, *,
                 max_held: float = 0.75, debug: bool = False, coalesce: bool = False,
                 why: str = "", area_done: Callable[[Area], object] | None = None) -> None:
        self.fd = sock if isinstance(sock, int) else sock.fileno()
        self.provider = provider
        self.name = provider.name
        self.why = why
        self.area: Area = provider.area
        # The compiled per-chunk work (zcnet.rx.zc._rxaccel), unless ZCNET_PURE
        accel = rx_accel_for(backend())
        #: The receive's state machine and chunk bookkeeping (zcnet.rx.zc.core).
        self.core = RxCore(self.area, name=provider.name, fd=self.fd, max_held=max_held,
                           debug=debug, coalesce=coalesce, accel=accel,
                           chunk_cls=CompiledChunk if accel is not None else Chunk)
        self.core.late = self._release_after_close
        provider.watch_releases(self.core.queue)
        self._close_lock = threading.Lock()
        self._close_deferred = False  # close() was called inside an owner operation
        self._accounting: int | None = None  # the thread closing or accounting, under the lock
        #: Given the area once the receiver is closed and none of it is held: unmaps it, or
        #: keeps it for another receiver (zcnet.aio's loop ring). Called once: None after.
        self.area_done: Callable[[Area], object] | None = area_done or provider.area_done

    @property
    def debug(self) -> bool:
        return self.core.debug

    @property
    def coalesce(self) -> bool:
        return self.core.coalesce

    @property
    def stalled(self) -> str | None:
        """"backpressure" or "exhausted" while delivery is paused, else None."""
        return self.core.stalled

    @property
    def closed(self) -> bool:
        return self.core.closed

    @property
    def stats(self) -> Stats:
        """The counters, with the provider's refill-ring events folded in (owner thread)."""
        st = self.core.stats
        st.refill_full = int(self.provider.extra_stats().get("refill_full", 0))
        return st

    @property
    def ring(self) -> Ring | None:
        """The io_uring whose completions deliver this receiver's data, for an event loop to
        wait on; None when the provider reads the socket itself (devmem) or shares a ring."""
        return self.provider.ring

    def on_release(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once, from the releasing thread, when a chunk is next released (at
        once if one already is); None cancels. How an event loop waits out a pause
        (``stalled``) without blocking."""
        if self.core.closed:
            raise ClosedError.of(self, "on_release")
        self.core.notify(callback)

    # --- owner-thread operations ----------------------------------------------------------------
    def _check_owner(self, method: str) -> None:
        if self.core.closed:
            raise ClosedError.of(self, method)
        if _get_ident() != self.core.owner_tid:
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

    def _give_back(self) -> None:
        """Give everything released so far back to the provider in one batch (owner thread,
        inside an owner operation)."""
        got = self.core.returned()
        if got is not None:
            self.provider.recycle(*got)
        elif self.provider.held_back():
            self.provider.recycle([], [])

    def flush(self) -> None:
        """Give chunks released so far back to the kernel now (owner thread); ``recv`` does
        this itself, so call it only to settle the stats when no more receiving follows."""
        self._check_owner("flush")
        if self.core.busy:
            return  # inside a receive (a finalizer): it gives the releases back itself
        self.core.busy = True
        try:
            self._give_back()
        finally:
            self._op_end()

    def _op_end(self) -> None:
        self.core.busy = False
        if self._close_deferred:
            self.close()

    def recv(self, timeout: float | None = None) -> list[Chunk]:
        """Chunks received so far, waiting up to ``timeout`` seconds for at least one.

        Returns [] at EOF (then ``eof`` is True) or when nothing arrived in time; while the
        application holds too much (``stalled == "backpressure"``) or the provider ran out of
        buffers (``"exhausted"``) it waits for releases instead of entering the kernel.
        Raises the stream's OSError (ConnectionResetError, ...) after the data before it.
        """
        core = self.core
        if core.busy or core.closed or _get_ident() != core.owner_tid:
            self._refuse("recv")
        core.busy = True
        try:
            got = self._round(timeout, "recv", False)
            return got if got is not None else []  # type: ignore[return-value]
        finally:
            core.busy = False
            if self._close_deferred:
                self.close()

    def recv_batch(self, timeout: float | None = None) -> Batch | None:
        """Like ``recv`` but one Batch per kernel round (None instead of [])."""
        core = self.core
        if core.busy or core.closed or _get_ident() != core.owner_tid:
            self._refuse("recv_batch")
        core.busy = True
        try:
            return self._round(timeout, "recv_batch", True)  # type: ignore[return-value]
        finally:
            core.busy = False
            if self._close_deferred:
                self.close()

    def _round(self, timeout: float | None, method: str,
               batch: bool) -> list[Chunk] | Batch | None:
        """The next non-empty delivery as chunks (or one Batch), or None at EOF or timeout
        (see ``recv``): the core decides each step, this waits."""
        if timeout is not None and not 0 <= timeout < math.inf:
            if timeout != math.inf:  # NaN never reaches a deadline: it would wait forever
                raise UsageError(f"{method}() timeout must be seconds >= 0 or None, "
                                 f"got {timeout!r}", "pass None to wait without a limit")
            timeout = None
        deadline = None if timeout is None else time.monotonic() + timeout
        warned = False
        core, prov = self.core, self.provider
        while True:
            self._give_back()
            act = core.decide(prov.can_arm)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if act == _FINISH:
                core.finish()
                return None
            if act >= _PAUSED:  # backpressure or exhausted: wait for a release
                step = 1.0 if remaining is None else min(remaining, 1.0)
                if not core.wait_release(step):
                    if remaining is not None and remaining <= step:
                        return None
                    if not warned:
                        warned = True
                        st = core.stats
                        log.warning("%s receiver stalled (%s): the application holds %d of %d "
                                    "area bytes; release chunks to resume", self.name,
                                    core.stalled, st.delivered_bytes - st.released_bytes,
                                    self.area.size)
                continue
            if act != _REAP:  # ARM or REARM
                prov.arm()
                core.armed_now()
            d = prov.reap(remaining)
            got = core.deliver_batch(d) if batch else core.deliver(d)
            if got:
                return got
            if core.ended:
                core.finish()
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return None

    @property
    def eof(self) -> bool:
        return self.core.ended

    def __iter__(self) -> Iterator[Chunk]:
        """Chunks until EOF; raises the stream's error after the data before it. If the loop
        is left early, chunks received but not yet handed out are released (a chunk the loop
        body got is the application's to release)."""
        accel = self.core.accel
        if accel is not None:
            return accel.ChunkIter(self)  # type: ignore[no-any-return]  # the loop in C
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
    def release(self, chunk: Held) -> None:
        if chunk._rx is not self.core:
            if chunk._rx is None:
                raise ValueError(f"{chunk!r} released twice")
            raise ValueError("chunk belongs to another receiver")
        chunk.release()

    def release_many(self, chunks: Iterable[Held]) -> None:
        """Release several chunks with one queue operation; all are checked before any is
        released, so a bad one leaves the rest untouched."""
        self.core.release_many(list(chunks))

    # --- lifetime ------------------------------------------------------------------------------
    def stats_dict(self) -> dict[str, StatValue]:
        """Counters for reports (only consistent when read from the owner thread), with
        ``COPY_FIELDS``: how many of the delivered bytes the kernel copied (None: unknown,
        and ``kernel_copied_source`` says why), and the zero-copy share of them."""
        d: dict[str, StatValue] = dict(self.stats.as_dict())
        d.update(self.provider.extra_stats())
        d.update(copy_fields(self.provider.kernel_copy(), self.core.stats.delivered_bytes))
        d["provider"] = self.name
        d["why"] = self.why
        return d

    def close(self) -> None:
        """Stop receiving and free the kernel side. Chunks still held stay valid (and may be
        released); the area is unmapped when the last one is released. Afterwards receiving
        raises ClosedError; ``stats``, ``stats_dict`` and ``eof`` still read."""
        core = self.core
        if core.closed:
            return
        if _get_ident() != core.owner_tid:
            raise ZcnetError("close called from a thread that did not open the receiver")
        if core.busy:  # inside a receive (a finalizer): closed as that receive ends
            self._close_deferred = True
            return
        with self._close_lock:
            if core.closed:  # closed while this waited for the lock (a finalizer there)
                return
            core.closed = True
            self._accounting = _get_ident()
            with contextlib.ExitStack() as undo:  # each step even when one before fails
                undo.callback(setattr, self, "_accounting", None)
                undo.callback(self._account_closed)  # Ctrl-C in the cancel: the area too
                undo.callback(self._close_provider)
                # A provider that can stop receiving ahead of close (the soft ones) does so,
                # then gets back what was released: its buffers are whole at close, which a
                # loop's shared ring needs to keep them for the next receiver.
                if self.provider.quiesce(core.armed):
                    core.cancelled()
                self._give_back()

    def _close_provider(self) -> None:
        if self.provider.close(self.core.armed):
            self.core.cancelled()

    def _release_after_close(self) -> None:
        # The owner no longer drains; whoever releases last does the accounting.
        me = _get_ident()
        if self._accounting == me:
            return  # a finalizer inside this thread's close or accounting: that drains it
        with self._close_lock:
            self._accounting = me
            try:
                self._account_closed()
            finally:
                self._accounting = None

    def _account_closed(self) -> None:
        core = self.core
        while core.queue:  # until empty: a finalizer here may release more (module docstring)
            done = core.drain()
            core.stats.note_released(sum(held_parts(c) for c in done),
                                     sum(c.length for c in done))
            if done:  # buffers that outlive their receiver (an event loop's pool) go back
                self.provider.recycle_closed(tokens_of(done))
        done_cb = self.area_done
        if core.stats.in_flight == 0 and done_cb is not None:
            # Once: a kept area is not closed, and a later call (an empty release_many, a
            # release that waited for the lock during close) must not hand it on again.
            self.area_done = None
            done_cb(self.area)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Receiver {self.name} fd={self.fd} area={self.area.kind}:{self.area.size} "
                f"in_flight={self.core.stats.in_flight}>")


def held_parts(held: Held) -> int:
    """Kernel buffers in a held item: 1 for a chunk, more for a coalesced one or a batch."""
    return held.parts  # type: ignore[attr-defined,no-any-return]


def tokens_of(items: list[Held]) -> list[int]:
    """The provider tokens of released items, flattened (a chunk's one, a batch's all)."""
    out: list[int] = []
    for c in items:
        t = c._tok
        if type(t) is int:
            out.append(t)
        else:
            out.extend(int(b) for b in t)  # type: ignore[union-attr]
    return out
