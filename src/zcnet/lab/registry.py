"""The labs this process has up, and the signal handling that guarantees their teardown.

``with Lab()`` cleans up on normal exit and exceptions. This module covers the rest: labs used
without ``with`` (removed at interpreter exit), and SIGTERM/SIGHUP, whose default action would end
the process without running any Python: they become ``SystemExit(128 + signum)``, which unwinds
``with`` blocks and then runs the atexit teardown. A handler the program installed earlier is
called instead, and then owns the decision to exit.

Some facts that shape it:

- A signal handler runs in the main thread between bytecodes, wherever that thread is: possibly
  inside pyroute2's event loop, or between creating a namespace and recording its name. An
  exception raised there leaves a namespace nobody knows about, and netlink work done there
  re-enters an event loop that is already running. So lab code marks its steps with ``deferred()``:
  a signal arriving inside is held and delivered when the step is complete. SIGINT is held the
  same way (its prior handler raises KeyboardInterrupt once the step is done).
- The handler itself never touches netlink; teardown happens in ``Lab.down`` while unwinding, or
  in the atexit hook, both outside any half-done step.
- Forked children (multiprocessing workers, pyroute2 helpers) inherit the atexit list. Each lab
  remembers the pid that made it, and only that pid removes it, so a worker never tears down its
  parent's lab.
- A Python-level handler loses a signal that reaches a freshly forked child before the
  interpreter has re-initialised itself there (CPython clears the "tripped" flags after fork),
  so a worker terminated right after start would sleep on. With the default action the kernel
  kills it at once. Hence our signals are blocked across fork, and the child puts the prior
  dispositions back before unblocking; a SIGTERM sent meanwhile stays pending and then kills.
- Handlers can only be installed from the main thread; a lab made elsewhere arms atexit only,
  until a lab is made on the main thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Protocol, TypeAlias

from zcnet.errors import ZcnetError

log = logging.getLogger(__name__)


class _Teardown(Protocol):
    owner_pid: int

    def down(self) -> None: ...


# The signals we handle, and the shell-style status to exit with when nobody handled them before.
_EXIT_STATUS = {
    signal.SIGTERM: 128 + signal.SIGTERM,
    signal.SIGHUP: 128 + signal.SIGHUP,
    signal.SIGINT: 128 + signal.SIGINT,
}

_lock = threading.RLock()
_live: dict[int, _Teardown] = {}
_atexit_armed = False
_signals_armed = False
# A signal's disposition, as signal.getsignal gives it: a handler, SIG_DFL/SIG_IGN, or None
# (set outside Python).
Disposition: TypeAlias = "Callable[[int, FrameType | None], object] | int | None"
_prior: dict[int, Disposition] = {}
_depth = 0  # how deep the main thread is in deferred() sections
_held: list[int] = []  # signals that arrived meanwhile


def register(lab: _Teardown) -> None:
    with _lock:
        _arm()
        _live[id(lab)] = lab


def unregister(lab: _Teardown) -> None:
    with _lock:
        _live.pop(id(lab), None)


def live() -> list[_Teardown]:
    with _lock:
        return [lab for lab in _live.values() if lab.owner_pid == os.getpid()]


def teardown_all() -> None:
    """Take down every lab this process still has up. Errors are logged, never raised: this runs
    at exit, where one bad lab must not keep the others alive."""
    for lab in live():
        try:
            lab.down()
        except (OSError, ZcnetError) as exc:
            log.warning("lab teardown failed: %s", exc)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold our signals while the block runs on the main thread; deliver them after it."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield  # the handler runs on the main thread, so it cannot interrupt this one
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _held:
            signum = _held[0]
            _held.clear()
            _on_signal(signum, None)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _depth:
        _held.append(signum)
        return
    prior = _prior.get(signum)
    if callable(prior):
        prior(signum, frame)
        return
    # Unwinds `with Lab()` blocks, then the atexit hook takes down whatever is left.
    raise SystemExit(_EXIT_STATUS[signum])


def _arm() -> None:
    global _atexit_armed, _signals_armed
    if not _atexit_armed:
        atexit.register(teardown_all)
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                            after_in_child=_after_fork_child)
        _atexit_armed = True
    if _signals_armed or threading.current_thread() is not threading.main_thread():
        return
    _signals_armed = True
    for signum in _EXIT_STATUS:
        prior = signal.getsignal(signum)
        if prior == signal.SIG_IGN:
            continue  # the process survives this signal, so its labs must too
        _prior[signum] = prior
        signal.signal(signum, _on_signal)


_fork_state = threading.local()


def _before_fork() -> None:
    if _prior:
        _fork_state.mask = signal.pthread_sigmask(signal.SIG_BLOCK, list(_prior))


def _after_fork_parent() -> None:
    mask = getattr(_fork_state, "mask", None)
    if mask is not None:
        _fork_state.mask = None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _after_fork_child() -> None:
    """The child owns no lab: forget ours, give back the prior handlers, then unblock."""
    global _lock, _signals_armed, _depth
    _lock = threading.RLock()  # another parent thread may have held it at fork time
    _live.clear()
    for signum, prior in _prior.items():
        if signal.getsignal(signum) is _on_signal:  # the program may have replaced ours since
            signal.signal(signum, prior if prior is not None else signal.SIG_DFL)
    _prior.clear()
    _held.clear()
    _depth = 0
    _signals_armed = False
    _after_fork_parent()
