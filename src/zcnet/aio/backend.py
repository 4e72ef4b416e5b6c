"""The event loops zcnet.aio runs on: asyncio's (and uvloop's) as they are, trio's through a
small adapter with the same shape.

The receive and send logic touches its loop through a few calls: ``create_future`` (a task
waits for the next completion), ``add_reader``/``remove_reader`` (the ring's eventfd),
``add_writer``/``remove_writer`` (a transport's write buffer), ``call_soon`` (the batched pass
at the end of the loop's current iteration), ``call_soon_threadsafe`` (a chunk released on
another thread wakes a paused receiver), ``call_later`` (the pool's retry while it is
dry), ``is_closed`` and ``call_exception_handler``. That subset is :class:`Loop`. On asyncio
and uvloop the loop object itself is the implementation, so their hot paths call the loop's
own methods with no layer in between. Under trio (directly or as anyio's trio backend)
:class:`TrioLoop`, one per ``trio.run``, implements the same subset:

- an fd watch is a system task looping on ``trio.lowlevel.wait_readable`` (or
  ``wait_writable``) and calling the callback in the run's thread; removing it cancels the
  task's scope, which trio aborts at once, so the fd may be closed right after;
- ``call_soon`` queues the callback for one system task that runs the queue after a
  checkpoint: callbacks queued during a scheduling batch run together in a later one, as the
  asyncio loop runs them at the end of its iteration; the task parks (no wake-up syscall) when
  the queue is empty;
- ``call_soon_threadsafe`` is the run's ``TrioToken.run_sync_soon``;
- futures are :class:`TrioFuture`: ``trio.lowlevel.wait_task_rescheduled`` for the waiting task,
  ``reschedule`` to wake it. A waiter that is cancelled leaves the future pending, so awaiting
  one is already shielded. A future cancelled by its owner (an object closed under a waiting
  task) makes the waiter raise :class:`~zcnet.errors.ClosedError`: trio has no cancellation
  that one task sends another.
- the queue task is also the shutdown guard: trio cancels system tasks once the main task has
  returned (every user task has ended by then), and its ``finally`` closes what owners left
  open, with a ResourceWarning, as :mod:`zcnet.aio.loop` does for asyncio.

trio is imported only when a trio run is found (trio >= 0.22); anyio on its asyncio backend
runs on an asyncio loop and needs nothing here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import warnings
from collections.abc import Awaitable, Callable, Generator
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar, cast

from zcnet.aio.looptypes import Event, Future, Loop, LoopBound, Pending, Scope
from zcnet.errors import ClosedError, UsageError, ZcnetError

log = logging.getLogger(__name__)

T = TypeVar("T")


class _RunVar(Protocol):
    """trio.lowlevel.RunVar holding the run's loop."""

    def get(self) -> TrioLoop: ...
    def set(self, value: TrioLoop) -> object: ...


def close_leftovers(open_: dict[int, LoopBound], when: str) -> None:
    """Close what is still open as its loop ends, each with a ResourceWarning, never raising:
    a forgotten receiver costs a warning, not a traceback or a leaked ring."""
    for obj in list(open_.values()):
        warnings.warn(f"{obj!r} was still open when {when}; closed it (use `async with` or "
                      "aclose())", ResourceWarning, stacklevel=1)
        try:
            obj._shutdown()
        except (OSError, ZcnetError, ValueError) as e:  # free the others regardless
            log.warning("closing %r when %s failed: %s", obj, when, e)
    open_.clear()


# --- which loop is running ------------------------------------------------------------------

def running_library() -> str | None:
    """"asyncio", "trio" or None: which kind of loop runs here. sniffio (trio brings it) says
    "trio" inside trio tasks even where an asyncio loop runs the thread (trio's guest mode);
    otherwise a running asyncio loop, found also from a plain loop callback (where sniffio
    finds no task), then a trio run seen without sniffio."""
    trio = sys.modules.get("trio")  # not imported: no trio run can be going on
    sniffio = sys.modules.get("sniffio")
    if trio is not None and sniffio is not None:
        try:
            if sniffio.current_async_library() == "trio":
                return "trio"
        except sniffio.AsyncLibraryNotFoundError:
            pass
    try:
        asyncio.get_running_loop()
        return "asyncio"
    except RuntimeError:
        pass
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
            return "trio"
        except RuntimeError:
            pass
    return None


def current_loop() -> Loop | None:
    """The running asyncio loop, or the :class:`TrioLoop` of the running trio run (made on
    first use), or None (see :func:`running_library`)."""
    lib = running_library()
    if lib == "asyncio":
        return asyncio.get_running_loop()
    if lib == "trio":
        return _trio_loop(sys.modules["trio"])
    return None


def identity(loop: Loop) -> tuple[Callable[[], object], object]:
    """How to tell, cheaply and from any thread, whether ``loop`` is the one running: a
    function to call (raising RuntimeError outside any loop) and the value it returns there."""
    if isinstance(loop, TrioLoop):
        return loop.trio.lowlevel.current_trio_token, loop.token
    return asyncio.get_running_loop, loop


# --- helpers the send side needs in both worlds ------------------------------------------------

def event(loop: Loop) -> Event:
    """An event with set/clear/is_set/wait for ``loop``."""
    return TrioEvent() if isinstance(loop, TrioLoop) else asyncio.Event()


def shield(loop: Loop, fut: Future[T]) -> Awaitable[T]:
    """An awaitable of ``fut`` whose waiter's cancellation leaves ``fut`` running (a
    :class:`TrioFuture` is never cancelled by its waiter)."""
    return fut if isinstance(loop, TrioLoop) else asyncio.shield(fut)


async def wait_for(loop: Loop, aw: Awaitable[object], timeout: float) -> None:
    """Await ``aw`` for at most ``timeout`` s; raises the builtin TimeoutError after that."""
    if isinstance(loop, TrioLoop):
        with loop.trio.move_on_after(timeout) as scope:
            await aw
        if scope.cancelled_caught:
            raise TimeoutError
        return
    try:
        await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:  # not the builtin one before 3.11
        raise TimeoutError from None


# --- trio -------------------------------------------------------------------------------------

_PENDING, _DONE, _CANCELLED = 0, 1, 2


def check_one_waiter(fut: Pending | None) -> None:
    """Refuse a second task's wait while ``fut`` (the first task's) is awaited: the second
    would replace it, and the first would never wake (not by data, not by close). A cancelled
    asyncio waiter cancels its future; a trio waiter whose scope was cancelled leaves a
    TrioFuture pending, with no waiter."""
    if fut is None or fut.done() or (isinstance(fut, TrioFuture) and not fut._waiters):
        return
    raise UsageError("a zcnet.aio receiver is already awaited by another task",
                     "receive from one task and hand chunks to others (a queue)")


class TrioFuture(Generic[T]):
    """A one-shot result for trio tasks, shaped like asyncio.Future (see the module docstring).
    Callbacks run at once when it is settled (in the run's thread)."""

    __slots__ = ("_callbacks", "_exc", "_result", "_state", "_trio", "_waiters")

    def __init__(self, trio: ModuleType) -> None:
        self._trio = trio
        self._state = _PENDING
        self._result: T | None = None
        self._exc: BaseException | None = None
        self._waiters: list[object] = []  # trio tasks
        self._callbacks: list[Callable[[TrioFuture[T]], object]] = []

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def _settle(self, state: int, result: T | None, exc: BaseException | None) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError(f"{self!r} is already settled")
        self._state, self._result, self._exc = state, result, exc
        waiters, self._waiters = self._waiters, []
        for task in waiters:
            self._trio.lowlevel.reschedule(task)
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def set_result(self, result: T, /) -> None:
        self._settle(_DONE, result, None)

    def set_exception(self, exception: BaseException, /) -> None:
        self._settle(_DONE, None, exception)

    def cancel(self, msg: object = None) -> bool:
        if self._state != _PENDING:
            return False
        self._settle(_CANCELLED, None, None)
        return True

    def result(self) -> T:
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("the result is not set yet")
        if self._state == _CANCELLED:
            raise ClosedError("the zcnet.aio object was closed while a task waited on it")
        if self._exc is not None:
            raise self._exc
        return cast(T, self._result)  # set_result gave a T

    def exception(self) -> BaseException | None:
        if self._state == _CANCELLED:
            return self.result()  # raises
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("the result is not set yet")
        return self._exc

    def add_done_callback(self, fn: Callable[[TrioFuture[T]], object], /) -> None:
        if self._state != _PENDING:
            fn(self)
        else:
            self._callbacks.append(fn)

    async def _wait(self) -> T:
        if self._state == _PENDING:
            lowlevel = self._trio.lowlevel
            task = lowlevel.current_task()
            self._waiters.append(task)

            def abort(_: object) -> object:
                self._waiters.remove(task)
                return lowlevel.Abort.SUCCEEDED

            try:
                await lowlevel.wait_task_rescheduled(abort)
            finally:
                # Left without trio's abort and unsettled: the awaitable was closed, thrown
                # into or dropped after a step. A task kept here would be rescheduled by the
                # settle while it waits on something else (trio's internal error), and
                # check_one_waiter would refuse every later wait.
                if task in self._waiters:
                    self._waiters.remove(task)
        return self.result()

    def __await__(self) -> Generator[object, None, T]:
        return self._wait().__await__()


class TrioEvent:
    """asyncio.Event's set/clear/is_set/wait for trio tasks (trio.Event cannot be cleared)."""

    __slots__ = ("_fut", "_set")

    def __init__(self) -> None:
        self._set = False
        self._fut: TrioFuture[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        fut, self._fut = self._fut, None
        if fut is not None:
            fut.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        if self._fut is None:
            self._fut = TrioFuture(sys.modules["trio"])
        await self._fut


class _Watch:
    """One fd watched by a system task until ``active`` is cleared."""

    __slots__ = ("active", "callback", "fd", "scope")

    def __init__(self, fd: int, callback: Callable[[], object], scope: Scope) -> None:
        self.fd = fd
        self.callback = callback
        self.scope = scope
        self.active = True


class TrioTimer:
    """What TrioLoop.call_later returns: asyncio's TimerHandle, as far as zcnet.aio uses it."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def cancel(self) -> None:
        self.scope.cancel()


class TrioLoop:
    """The :class:`Loop` of one trio run (see the module docstring). Made by
    :func:`current_loop` on first use in a run and kept in a RunVar for the rest of it."""

    def __init__(self, trio: ModuleType) -> None:
        self.trio = trio
        self.token = trio.lowlevel.current_trio_token()
        self._ready: collections.deque[tuple[Callable[..., object], tuple[object, ...]]] = (
            collections.deque())
        self._parked: object | None = None  # the queue task, while it waits for callbacks
        self._readers: dict[int, _Watch] = {}
        self._writers: dict[int, _Watch] = {}
        self._closed = False
        self.open: dict[int, LoopBound] = {}
        trio.lowlevel.spawn_system_task(self._run_queue, name="zcnet.aio callbacks and guard")

    def __repr__(self) -> str:
        return f"<zcnet.aio trio loop {'closed' if self._closed else 'running'}>"

    # --- callbacks ------------------------------------------------------------------------------
    def _call(self, callback: Callable[..., object], args: tuple[object, ...]) -> None:
        """Run a callback; an exception is logged as asyncio's loop does, never let out (an
        exception in a system task would end the whole run)."""
        try:
            callback(*args)
        except Exception as e:
            self.call_exception_handler({"message": f"exception in callback {callback!r}",
                                         "exception": e})

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        if self._closed:
            raise RuntimeError("the trio run that zcnet.aio was used in is ending")
        self._ready.append((callback, args))
        task = self._parked
        if task is not None:
            self._parked = None
            self.trio.lowlevel.reschedule(task)

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: object) -> None:
        """From any thread; RuntimeError (trio.RunFinishedError) once the run has ended."""
        self.token.run_sync_soon(self._call, callback, args)

    def call_later(self, delay: float, callback: Callable[..., object],
                   *args: object) -> TrioTimer:
        """``callback`` after ``delay`` seconds, from a system task of its own; ``cancel()``
        on the handle stops it (and so does the run's end)."""
        if self._closed:
            raise RuntimeError("the trio run that zcnet.aio was used in is ending")
        timer = TrioTimer(self.trio.CancelScope())

        async def fire() -> None:
            with timer.scope:
                await self.trio.sleep(delay)
                self._call(callback, args)

        self.trio.lowlevel.spawn_system_task(fire, name="zcnet.aio timer")
        return timer

    def _unpark(self, _: object) -> object:
        self._parked = None
        return self.trio.lowlevel.Abort.SUCCEEDED

    async def _run_queue(self) -> None:
        lowlevel = self.trio.lowlevel
        ready = self._ready
        try:
            while True:
                if ready:
                    await lowlevel.checkpoint()  # let this scheduling batch finish first
                else:
                    self._parked = lowlevel.current_task()
                    await lowlevel.wait_task_rescheduled(self._unpark)
                for _ in range(len(ready)):  # what is queued meanwhile waits for the next round
                    callback, args = ready.popleft()
                    self._call(callback, args)
        finally:
            self._shutdown()

    # --- fds ------------------------------------------------------------------------------------
    def _watch(self, table: dict[int, _Watch], fd: int, callback: Callable[..., object],
               args: tuple[object, ...], wait: Callable[[int], Awaitable[object]]) -> None:
        cb = (lambda: callback(*args)) if args else callback
        w = table.get(fd)
        if w is not None:  # asyncio replaces the callback of a watched fd
            w.callback = cb
            return
        if self._closed:
            raise RuntimeError("the trio run that zcnet.aio was used in is ending")
        w = table[fd] = _Watch(fd, cb, self.trio.CancelScope())
        self.trio.lowlevel.spawn_system_task(self._watching, w, wait, name=f"zcnet.aio fd {fd}")

    async def _watching(self, w: _Watch, wait: Callable[[int], Awaitable[object]]) -> None:
        trio = self.trio
        try:
            with w.scope:
                while w.active:
                    await wait(w.fd)
                    if w.active:
                        self._call(w.callback, ())
        except (OSError, trio.ClosedResourceError, trio.BusyResourceError) as e:
            if w.active:  # an fd closed under its watch, or watched twice: a bug, not fatal
                log.error("zcnet.aio: watching fd %d failed: %r", w.fd, e)

    @staticmethod
    def _unwatch(table: dict[int, _Watch], fd: int) -> bool:
        w = table.pop(fd, None)
        if w is None:
            return False
        w.active = False
        w.scope.cancel()  # a task blocked in the wait is aborted now: the fd may be closed next
        return True

    def add_reader(self, fd: int, callback: Callable[..., object], *args: object) -> None:
        self._watch(self._readers, fd, callback, args, self.trio.lowlevel.wait_readable)

    def remove_reader(self, fd: int) -> bool:
        return self._unwatch(self._readers, fd)

    def add_writer(self, fd: int, callback: Callable[..., object], *args: object) -> None:
        self._watch(self._writers, fd, callback, args, self.trio.lowlevel.wait_writable)

    def remove_writer(self, fd: int) -> bool:
        return self._unwatch(self._writers, fd)

    # --- the rest of the slice ------------------------------------------------------------------
    def create_future(self) -> TrioFuture[Any]:
        return TrioFuture(self.trio)

    def is_closed(self) -> bool:
        return self._closed

    def call_exception_handler(self, context: dict[str, object]) -> None:
        exc = context.get("exception")
        log.error("%s", context.get("message", "zcnet.aio callback failed"),
                  exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None)

    # --- the shutdown guard ---------------------------------------------------------------------
    def track(self, obj: LoopBound) -> None:
        if self._closed:
            raise ZcnetError("the trio run is ending: zcnet.aio objects cannot be opened now",
                             "open them from the run's tasks")
        self.open[id(obj)] = obj

    def untrack(self, obj: LoopBound) -> None:
        self.open.pop(id(obj), None)

    def _shutdown(self) -> None:
        """The run is ending (its system tasks are being cancelled): stop every watch, then
        close what is still open, with a warning."""
        self._closed = True
        for table in (self._readers, self._writers):
            for fd in list(table):
                self._unwatch(table, fd)
        ready, self._ready = list(self._ready), collections.deque()
        for callback, args in ready:  # a pass asked for before the end: submits, frees
            self._call(callback, args)
        close_leftovers(self.open, "its trio run ended")


# The trio.lowlevel.RunVar holding each run's TrioLoop, made on first use.
_run_var: _RunVar | None = None


def _trio_loop(trio: ModuleType) -> TrioLoop:
    global _run_var
    if _run_var is None:
        _run_var = trio.lowlevel.RunVar("zcnet.aio loop")
    try:
        loop: TrioLoop = _run_var.get()
    except LookupError:
        loop = TrioLoop(trio)
        _run_var.set(loop)
    return loop
