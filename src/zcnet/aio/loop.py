"""Binding an object to the event loop that opened it, and freeing it when that loop ends.

The loop is asyncio's (or uvloop's), or a trio run's :class:`~zcnet.aio.backend.TrioLoop`,
whose own system task is its guard (:mod:`zcnet.aio.backend`).

Some facts about asyncio loop shutdown: ``asyncio.run`` (and ``uvloop.run``, and
``asyncio.Runner``, which pytest-asyncio uses) cancel every pending task and run the loop until
they finish before closing it; nothing else tells a library that a loop is going away. So each
loop with open zcnet objects gets one guard task that sleeps until it is cancelled and then
closes whatever its owners left open, with a ResourceWarning: a forgotten receiver costs a
warning at shutdown, never a traceback or a leaked ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from typing import TypeVar

from zcnet.aio.backend import (
    TrioLoop,
    close_leftovers,
    current_loop,
    identity,
    running_library,
)
from zcnet.aio.looptypes import Loop, LoopBound
from zcnet.errors import ZcnetError


def running_loop(what: str) -> Loop:
    loop = current_loop()
    if loop is None:
        raise ZcnetError(f"{what} needs a running asyncio event loop or trio run",
                         "call it from a coroutine (inside asyncio.run, uvloop.run, anyio.run "
                         "or trio.run)")
    return loop


class Owner:
    """The loop and thread an object belongs to; ``check`` refuses use from anywhere else."""

    __slots__ = ("_current", "_ident", "is_running", "loop", "thread", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.loop = running_loop(what)
        self.thread = threading.get_ident()
        # asyncio.get_running_loop and the loop, or trio's current_trio_token and the token
        self._current, self._ident = identity(self.loop)
        #: The asyncio loop's is_running (None under trio): with ``thread``, the fast check.
        self.is_running = None if isinstance(self.loop, TrioLoop) else self.loop.is_running

    def check(self) -> None:
        # The hot path skips asyncio.get_running_loop, which costs a getpid syscall on Python
        # 3.11 (twice per echoed message): our thread with our loop running is enough, since a
        # thread runs one asyncio loop at a time.
        running = self.is_running
        if running is not None and threading.get_ident() == self.thread and running():
            return
        try:
            loop = self._current()
        except RuntimeError:
            loop = None
        if loop is not self._ident:
            where = {None: "outside the event loop", "trio": "another trio run"}.get(
                running_library(), "another event loop")
            if threading.get_ident() != self.thread:
                where = "another thread"
            raise ZcnetError(f"{self.what} used from {where}: it belongs to the loop that "
                             "opened it",
                             "use it only from tasks of that loop; other threads may only "
                             "release chunks")


R = TypeVar("R", bound="LoopResource")


class ResourceState:
    """Whether a loop resource is closed, as a record of its own: a compiled half is handed the
    record once and reads ``closed`` in place (an AsyncReceiver's: zcnet.aio._loopaccel.Anext,
    aio/_c/anext.c), never the resource's own attributes. Its ``_free`` sets it, once."""

    __slots__ = ("closed",)

    def __init__(self) -> None:
        self.closed = False


class LoopResource:
    """What a zcnet.aio object open on a loop shares: ``close()`` (once, from its owner),
    ``aclose()`` and ``async with``, ``closed``, and the guard's ``_shutdown``. A subclass sets
    ``_owner`` and ``_state`` (a ResourceState) and frees itself in ``_free``, which sets
    ``_state.closed`` first."""

    _owner: Owner
    _state: ResourceState

    @property
    def closed(self) -> bool:
        """close() ran (or the loop's shutdown closed it)."""
        return self._state.closed

    def close(self) -> None:
        if self._state.closed:
            return
        self._owner.check()
        self._free()

    def _free(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        if not self._state.closed:
            self._free()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self: R) -> R:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class _Guard:
    """One per loop: the objects still open on it and the task that frees them at shutdown."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.open: dict[int, LoopBound] = {}
        self.task = loop.create_task(self._wait(), name="zcnet.aio shutdown guard")

    async def _wait(self) -> None:
        try:
            await self.loop.create_future()
        finally:
            if self.open and not self.loop.is_closed():
                # Owners cancelled in the same sweep close their objects in their own
                # ``async with``; give them a few steps to do so before calling them leaked.
                for _ in range(3):
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0)
            close_leftovers(self.open, "its event loop shut down")


_guards: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Guard] = (
    weakref.WeakKeyDictionary())


def track(loop: Loop, obj: LoopBound) -> None:
    if isinstance(loop, TrioLoop):
        loop.track(obj)
        return
    guard = _guards.get(loop)
    if guard is None or guard.task.done():
        guard = _guards[loop] = _Guard(loop)
    guard.open[id(obj)] = obj


def untrack(loop: Loop, obj: LoopBound) -> None:
    if isinstance(loop, TrioLoop):
        loop.untrack(obj)
        return
    guard = _guards.get(loop)
    if guard is None:
        return
    guard.open.pop(id(obj), None)
    if not guard.open and not guard.task.done() and not loop.is_closed():
        del _guards[loop]
        guard.task.cancel()
