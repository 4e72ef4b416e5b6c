"""The async receiver: zcnet.rx.zc's Receiver driven by the event loop instead of a blocking wait.

Every kernel round is the synchronous receiver's own ``recv(timeout=0)``: one enter that runs
the ring's task work and reaps, so buffer lifetimes, back-pressure (``max_held``), stats and
errors are exactly those of :mod:`zcnet.rx.zc.api`. (On the loop's shared ring with the compiled
pass, a chunk round's common case is its C version, ``Round.take`` in zcnet.aio._loopaccel: the
same chunks and counts, every other case left to that round.) What this module adds is where to
sleep:
on the loop, until the ring's eventfd fires (see :mod:`zcnet.aio.wakeup`) or, while delivery is
paused because the application holds too much, until a chunk is released.

Cancellation is safe by construction: a task sleeps only where nothing has been reaped, and
chunks reaped but not yet handed out by ``async for`` wait in the receiver (released at close).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
from collections import deque
from collections.abc import Awaitable
from typing import Any

from zcnet.aio.loop import LoopResource, Owner, ResourceState, running_loop, track, untrack
from zcnet.aio.loop_soft import OnLoopRing, open_shared_soft
from zcnet.aio.loop_zcrx import ZcrxMember, open_zcrx_receiver
from zcnet.aio.looptypes import Loop
from zcnet.aio.pool import POOL_SIZE, open_pooled_soft
from zcnet.aio.shared import ROUND_DONE, MemberRing, compiled_round
from zcnet.aio.sockets import check_tcp_socket
from zcnet.aio.taskrun import taskrun_flag
from zcnet.aio.wakeup import Wakeup
from zcnet.errors import ClosedError, UsageError
from zcnet.rx.zc import api
from zcnet.rx.zc.api import Batch, Chunk, Receiver
from zcnet.rx.zc.provider import SOFT_TASKRUN
from zcnet.rx.zc.providers import Option, provider_info
from zcnet.rx.zc.receiver import StatValue
from zcnet.sockcheck import set_rcvlowat

#: Defaults sized for many connections per process: the area is populated at open.
AREA_SIZE = 4 << 20
BUF_SIZE = 64 << 10


class AsyncReceiver(LoopResource):
    """Zero-copy receive on one TCP socket inside an event loop.

    ``async for chunk in rx`` yields :class:`~zcnet.rx.zc.Chunk` views until EOF and raises the
    stream's error (ConnectionResetError, ...) after the data before it; ``await rx.recv()``
    returns the chunks of one kernel round ([] at EOF); ``await rx.recv_batch()`` one Batch (None
    at EOF). Release as with the synchronous API: ``chunk.release()``, from any thread.
    """

    def __init__(self, rx: Receiver, sock: socket.socket | None = None,
                 member: ZcrxMember | None = None) -> None:
        self._owner = Owner("zcnet.aio receiver")
        self.rx = rx
        self.sock = sock
        self._pending: deque[Chunk] = deque()
        self._state = ResourceState()
        provider = rx.provider
        #: Where it waits: its place on the loop's shared ring, or (zcrx, ``member``) on its
        #: loop thread's queue (zcnet.aio.loop_zcrx); None: a ring of its own (``_wake``).
        self._member: MemberRing | ZcrxMember | None = (
            provider.member if isinstance(provider, OnLoopRing) else member)
        self._wake = (None if self._member is not None
                      else Wakeup(self._owner.loop, rx.ring, sock_fd=rx.fd))
        self._kick = self._member.kick if self._wake is None else self._wake.kick
        #: The compiled round's take (zcnet.aio._loopaccel) for chunk rounds on the shared
        #: ring, or None: the Python round only.
        fast = None if self._member is None else compiled_round(None, rx, self._member)
        self._take = None if fast is None else fast.take
        self._take_batch = None if fast is None else fast.take_batch
        #: ``__anext__`` in C (zcnet.aio._loopaccel.Anext) with the compiled round on an asyncio
        #: loop; it hands whatever is not the common case to ``_anext``.
        self._cnext: Any = None
        if fast is not None and self._owner.is_running is not None:
            self._cnext = self._member.lr.accel.Anext(
                fast, self._state, self._member, self._owner.thread, self._owner.is_running,
                self._owner.loop.create_future, self._pending, self._anext, self._drop_pending,
                ClosedError)
        track(self._owner.loop, self)

    # --- receiving -------------------------------------------------------------------------
    async def _round(self, batch: bool) -> Any:
        """One kernel round's worth, sleeping on the loop until there is one (or EOF)."""
        self._owner.check()
        if self._state.closed:
            raise ClosedError("receive on a closed zcnet.aio receiver")
        rx = self.rx
        core = rx.core
        m = self._member
        take = self._take_batch if batch else self._take
        while True:
            if self._state.closed:  # by another task while this one slept: the ring is unmapped
                raise ClosedError("the zcnet.aio receiver was closed while a receive waited")
            if take is not None:
                # The common case in C: releases back, this member's completions made into
                # chunks (or one Batch). DONE: none yet; FALLBACK: the Python round below,
                # with its checks.
                got = take()
                if got.__class__ is not int:
                    return got
                if got == ROUND_DONE:
                    # No pass from here: the loop's eventfd pass reaps for every member at
                    # once (one enter per loop iteration, not one per message and task).
                    await self._wait()
                    continue
                if self._state.closed:  # by a finalizer inside the round: the check above says so
                    continue
            if m is not None and m.inbox:
                pass  # completions are here: the round below flushes releases and takes them
            elif core.reaping():
                # The common case, without the synchronous receiver's timed wait: a zero
                # timeout there still costs the kernel a timer and often a context switch.
                # Releases go back first, so the kernel has the buffers before it runs.
                rx.flush()
                if not (m.has_data() if m is not None else self._data_own()):
                    await self._wait()
                    continue
            got = rx.recv_batch(0) if batch else rx.recv(0)
            if got:
                if self._wake is not None:
                    self._wake.swallow()
                return got
            if rx.eof:
                return got
            stalled = core.stalled
            if stalled is None and not core.armed:
                continue  # the multishot ended without ending the stream: re-arm now
            if stalled is not None:
                rx.on_release(self._kick_threadsafe)
            try:
                await self._wait()
            finally:
                if stalled is not None and not self._state.closed:
                    rx.on_release(None)

    def _data_own(self) -> bool:
        ring = self.rx.ring
        if ring is None:  # the provider reads the socket itself (devmem): ask it
            return True
        if not ring.cq_ready():
            ring.get_events()  # runs the task work: data lands, CQEs are posted
        return bool(ring.cq_ready())

    async def _wait(self) -> None:
        if self._state.closed:  # by what this round ran (GC in arm()): nothing would ever wake it
            raise ClosedError("the zcnet.aio receiver was closed while a receive waited")
        m = self._member
        if m is not None:
            fut = m.wait()
            try:
                await fut
            finally:  # an abandoned await must not stay the waiter (MemberRing.wait)
                if m.waiter is fut:
                    m.waiter = None
        else:
            assert self._wake is not None
            await self._wake.wait()

    def _kick_threadsafe(self) -> None:
        """Wake the waiting task from any thread (a release); a no-op once the loop closed."""
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._owner.loop.call_soon_threadsafe(self._kick)

    async def recv(self) -> list[Chunk]:
        """The chunks of the next kernel round; [] at EOF."""
        if self._pending:
            self._owner.check()
            out = list(self._pending)
            self._pending.clear()
            return out
        got: list[Chunk] = await self._round(False)
        return got

    async def recv_batch(self) -> Batch | None:
        """The next kernel round as one Batch (no object per buffer); None at EOF."""
        if self._pending:
            raise UsageError("chunks taken for `async for` are still waiting in the receiver",
                             "finish the `async for` or drain them with recv() first")
        got: Batch | None = await self._round(True)
        return got

    def __aiter__(self) -> AsyncReceiver:
        return self

    def __anext__(self) -> Awaitable[Chunk]:
        cnext = self._cnext
        return self._anext() if cnext is None else cnext()  # type: ignore[no-any-return]

    async def _anext(self) -> Chunk:
        pending = self._pending
        if pending:
            self._owner.check()
            return pending.popleft()
        got: list[Chunk] = await self._round(False)  # not through recv(): a frame fewer
        if not got:
            raise StopAsyncIteration
        if len(got) > 1:
            pending.extend(itertools.islice(got, 1, None))
            if self._state.closed:  # by a finalizer inside the round: nobody will take them now
                self._drop_pending()
        return got[0]

    # --- state ---------------------------------------------------------------------------------
    @property
    def eof(self) -> bool:
        return self.rx.eof and not self._pending

    def flush(self) -> None:
        """Give released chunks back to the kernel now (receiving does this itself)."""
        self._owner.check()
        self.rx.flush()

    @property
    def stats(self) -> api.Stats:
        return self.rx.stats

    def stats_dict(self) -> dict[str, StatValue]:
        return self.rx.stats_dict()

    # --- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop receiving and free the ring, eventfd and (once no chunk is held) the area.
        Chunks still held stay valid until released. Closes the socket if the receiver was
        opened on one with ``own_socket``."""
        super().close()

    def _drop_pending(self) -> None:
        """Release the chunks taken for ``async for`` but not handed out (at close)."""
        pending = list(self._pending)
        self._pending.clear()
        if pending:
            self.rx.release_many(pending)

    def _free(self) -> None:
        self._state.closed = True
        untrack(self._owner.loop, self)
        try:
            self._drop_pending()
            if self._wake is not None:
                self._wake.close()
            elif self._member is not None:
                self._member.kick()  # a task waiting on it sees the receiver closed
        finally:
            try:
                self.rx.close()
            finally:
                if isinstance(self._member, ZcrxMember):
                    self._member.leave()
                if self.sock is not None:
                    self.sock.close()

    def __repr__(self) -> str:
        state = "closed" if self._state.closed else "open"
        return f"<zcnet.aio receiver {self.rx.name} fd={self.rx.fd} {state}>"


#: Options the shared-ring soft receiver takes; any other sends it down the own-ring path.
_SHARED_OPTIONS = frozenset({"hugetlb", "max_held", "coalesce", "debug"})


def open_shared_receiver(sock: socket.socket, area_size: int, buf_size: int,
                         kw: dict[str, Option], what: str, pool: bool | int = False) -> Receiver:
    """A soft-provider Receiver on the running loop's shared ring; ``kw`` holds only
    ``_SHARED_OPTIONS``. ``pool``: on the loop's pool instead of an area of its own."""
    loop = running_loop(what)  # a clear error before anything is allocated
    extra = set(kw) - _SHARED_OPTIONS
    if extra:
        raise UsageError(f"{what} does not take {', '.join(sorted(extra))}",
                         f"it takes area_size, buf_size, {', '.join(sorted(_SHARED_OPTIONS))}")
    if pool is not False:
        return _open_pooled(loop, sock, pool, buf_size, kw, what)
    debug = kw.get("debug", False)
    p = open_shared_soft(loop, sock.fileno(), area_size, buf_size, kw.get("hugetlb", False),
                         reuse=not debug)
    with contextlib.ExitStack() as undo:  # a failure: the provider and its area go
        undo.callback(p.area.close)
        undo.callback(p.close)
        # No Receiver will hand the area back: the group goes with it.
        undo.callback(setattr, p, "reuse", False)
        rx = Receiver(sock, p, max_held=kw.get("max_held", 0.75), debug=debug,
                      coalesce=kw.get("coalesce", False), why="soft provider requested",
                      area_done=None if debug else p.retire_area)  # debug poisons memory
        undo.pop_all()
    return rx


def _open_pooled(loop: Loop, sock: socket.socket, pool: bool | int, buf_size: int,
                 kw: dict[str, Option], what: str) -> Receiver:
    if set(kw) - {"max_held"}:
        raise UsageError(f"{what} with pool= does not take "
                         f"{', '.join(sorted(set(kw) - {'max_held'}))}",
                         "a pooled receiver takes max_held only: its buffers are the loop's pool")
    size = POOL_SIZE if pool is True else pool
    if type(size) is not int or size <= 0:
        raise UsageError(f"{what}: pool must be True or a size in bytes, got {pool!r}",
                         "pass pool=True (8 MiB), or a size such as pool=4 << 20")
    p = open_pooled_soft(loop, sock.fileno(), size, buf_size)
    with contextlib.ExitStack() as undo:  # a bad max_held: the pool loses this holder again
        undo.callback(p.pool.holder_done)
        undo.callback(p.close)
        rx = Receiver(sock, p, max_held=kw.get("max_held", 0.75),
                      why="soft provider requested, on the event loop's pool",
                      area_done=p.pool.holder_done)
        undo.pop_all()
    p.pool.receivers[id(p)] = rx
    return rx


def open_receiver(sock: socket.socket, provider: str = "soft", *, own_socket: bool = False,
                  area_size: int = AREA_SIZE, buf_size: int = BUF_SIZE, shared_ring: bool = True,
                  rcvlowat: int = 0, pool: bool | int = False, **kw: Option) -> AsyncReceiver:
    """Open a zero-copy receiver on a connected TCP socket, for use in the running loop::

        async with zcnet.aio.open_receiver(sock, "soft") as rx:
            async for chunk in rx:
                consume(chunk.data)
                chunk.release()

    Options are those of :func:`zcnet.rx.zc.open_receiver` (``provider`` "auto" works too);
    the default area is small (4 MiB) because a service opens one per connection.
    ``own_socket``: close ``sock`` with the receiver (what the adopt helpers want).
    ``rcvlowat``: for bulk ingest, the socket's SO_RCVLOWAT in bytes (e.g.
    :data:`zcnet.rx.engine.RCVLOWAT`, 1 MiB): the loop is woken once that much is queued, not
    per segment (:func:`zcnet.sockcheck.set_rcvlowat`); 0 (the default) wakes on any data,
    which request/response protocols need. Give the area at least twice ``rcvlowat``: a
    receive that empties the buffer ring ends the multishot (``stats.rearms``; docs/aio.md).
    ``shared_ring``: soft receivers share one io_uring per loop (:mod:`zcnet.aio.shared`);
    False gives this one a ring of its own, as devmem (and soft with ``incremental`` or
    ``dmabuf_fd``) always has.
    "zcrx": every zcrx receiver of the loop's thread on one NIC queue (or in copy mode, where
    the socket's device cannot do zcrx) shares that queue's ring and area
    (:mod:`zcnet.aio.loop_zcrx`); ``area_size`` is the queue's area when this receiver opens
    the queue (it is shared: give it at least 64 KiB per connection), and each connection may
    hold its share of it.
    ``pool``: True (8 MiB) or a size in bytes: no area of its own, but the loop's
    buffer group that every pooled receiver fills in turn (:mod:`zcnet.aio.pool`), for many
    bulk streams on one loop; ``area_size`` is then unused and only ``max_held`` (a share of
    the pool) is taken.
    """
    check_tcp_socket(sock, "zcnet.aio.open_receiver")
    set_rcvlowat(sock, rcvlowat, "zcnet.aio.open_receiver")
    info = provider_info(provider)
    if info is not None and info.loop_queue:
        return _open_on_queue(sock, own_socket, area_size, shared_ring, pool, kw)
    on_loop_ring = info is not None and info.loop_ring and shared_ring
    if pool is not False and not on_loop_ring:
        raise UsageError("zcnet.aio.open_receiver: pool= is for soft receivers on the loop's "
                         "shared ring", "drop pool=, or open with provider='soft' and "
                         "shared_ring=True")
    if on_loop_ring and (pool is not False or set(kw) <= _SHARED_OPTIONS):
        rx = open_shared_receiver(sock, area_size, buf_size, kw, "zcnet.aio.open_receiver",
                                  pool)
    else:
        running_loop("zcnet.aio.open_receiver")  # a clear error before anything is allocated
        # A ring of its own, woken through its eventfd: the task-run mode that signals it at
        # once on this kernel (zcnet.aio.taskrun).
        token = SOFT_TASKRUN.set(taskrun_flag())
        try:
            rx = api.open_receiver(sock, provider, area_size=area_size, buf_size=buf_size, **kw)
        finally:
            SOFT_TASKRUN.reset(token)
    with contextlib.ExitStack() as undo:
        undo.callback(rx.close)
        arx = AsyncReceiver(rx, sock if own_socket else None)
        undo.pop_all()
    return arx


def _open_on_queue(sock: socket.socket, own_socket: bool, area_size: int, shared_ring: bool,
                   pool: bool | int, kw: dict[str, Option]) -> AsyncReceiver:
    """open_receiver for zcrx: on the loop thread's queue (zcnet.aio.loop_zcrx)."""
    what = "zcnet.aio.open_receiver"
    if pool is not False or not shared_ring:
        raise UsageError(f"{what}: pool= and shared_ring=False are for soft receivers",
                         "drop them: a zcrx receiver always shares its loop thread's queue")
    rx, member = open_zcrx_receiver(running_loop(what), sock, area_size, kw, what)
    with contextlib.ExitStack() as undo:
        undo.callback(member.leave)
        undo.callback(rx.close)
        arx = AsyncReceiver(rx, sock if own_socket else None, member)
        undo.pop_all()
    return arx
