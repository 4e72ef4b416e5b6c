"""Binding an object to the event loop that opened it, and freeing it when that loop ends.

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
import logging
import threading
import warnings
import weakref
from typing import Protocol

from zcnet.errors import ZcnetError

log = logging.getLogger(__name__)


class LoopBound(Protocol):
    def _shutdown(self) -> None:
        """Free everything; called by the guard when the loop ends with this still open."""

    def __repr__(self) -> str: ...


def running_loop(what: str) -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise ZcnetError(f"{what} needs a running asyncio event loop",
                         "call it from a coroutine (inside asyncio.run or uvloop.run)") from None


class Owner:
    """The loop and thread an object belongs to; ``check`` refuses use from anywhere else."""

    __slots__ = ("loop", "thread", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.loop = running_loop(what)
        self.thread = threading.get_ident()

    def check(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self.loop:
            where = ("another thread" if threading.get_ident() != self.thread
                     else "another event loop" if loop is not None else "outside the event loop")
            raise ZcnetError(f"{self.what} used from {where}: it belongs to the loop that "
                             "opened it",
                             "use it only from tasks of that loop; other threads may only "
                             "release chunks")


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
            for obj in list(self.open.values()):
                warnings.warn(f"{obj!r} was still open when its event loop shut down; closed "
                              "it (use `async with` or aclose())", ResourceWarning, stacklevel=1)
                try:
                    obj._shutdown()
                except (OSError, ZcnetError, ValueError) as e:  # free the others regardless
                    log.warning("closing %r at loop shutdown failed: %s", obj, e)
            self.open.clear()


_guards: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Guard] = (
    weakref.WeakKeyDictionary())


def track(loop: asyncio.AbstractEventLoop, obj: LoopBound) -> None:
    guard = _guards.get(loop)
    if guard is None or guard.task.done():
        guard = _guards[loop] = _Guard(loop)
    guard.open[id(obj)] = obj


def untrack(loop: asyncio.AbstractEventLoop, obj: LoopBound) -> None:
    guard = _guards.get(loop)
    if guard is None:
        return
    guard.open.pop(id(obj), None)
    if not guard.open and not guard.task.done() and not loop.is_closed():
        del _guards[loop]
        guard.task.cancel()
