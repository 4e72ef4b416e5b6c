"""The labs this process has up, torn down at interpreter exit and on SIGTERM/SIGHUP.

``with Lab()`` already cleans up on normal exit, exceptions and Ctrl-C (KeyboardInterrupt unwinds
through ``__exit__``). This registry covers the rest: a lab used without ``with``, and signals
whose default action would kill the process without running any Python.

Some facts that shape it:

- Forked children (multiprocessing workers, pyroute2 helpers) inherit the atexit list. Each lab
  remembers the pid that made it, and only that pid removes it, so a worker never tears down its
  parent's lab.
- A Python-level handler loses a signal that reaches a freshly forked child before the
  interpreter has re-initialised itself there (CPython clears the "tripped" flags after fork),
  so a worker terminated right after start would sleep on. With the default action the kernel
  kills it at once. Hence: our signals are blocked across fork, and the child puts the prior
  dispositions back before unblocking; a SIGTERM sent meanwhile stays pending and then kills.
- A signal handler runs in the main thread between bytecodes, possibly while that thread is inside
  ``Lab.up``/``down`` holding the lock: hence an RLock, and labs idempotent to tear down twice.
- Handlers can only be installed from the main thread; elsewhere only atexit is armed.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any, Protocol

from zcnet.errors import ZcnetError

log = logging.getLogger(__name__)


class _Teardown(Protocol):
    owner_pid: int

    def down(self) -> None: ...


# Signals whose default action kills us silently, and the shell-style status to exit with.
_EXIT_STATUS = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGHUP: 128 + signal.SIGHUP}

_lock = threading.RLock()
_live: dict[int, _Teardown] = {}
_atexit_armed = False
_signals_armed = False
_prior: dict[int, Any] = {}


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
    at exit and in signal handlers, where one bad lab must not keep the others alive."""
    for lab in live():
        try:
            lab.down()
        except (OSError, ZcnetError) as exc:
            log.warning("lab teardown failed: %s", exc)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    teardown_all()
    prior = _prior.get(signum)
    if callable(prior):
        prior(signum, frame)
        return
    # Raising SystemExit unwinds any `with Lab()` blocks (already down, so cheap) and runs atexit.
    raise SystemExit(_EXIT_STATUS[signum])


def _arm() -> None:
    global _atexit_armed, _signals_armed
    if not _atexit_armed:
        atexit.register(teardown_all)
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                            after_in_child=_after_fork_child)
        _atexit_armed = True
    if _signals_armed or threading.current_thread() is not threading.main_thread():
        return  # off the main thread only atexit can be armed; the next main-thread lab arms
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
    global _lock, _signals_armed
    _lock = threading.RLock()  # another parent thread may have held it at fork time
    _live.clear()
    for signum, prior in _prior.items():
        signal.signal(signum, prior if prior is not None else signal.SIG_DFL)
    _prior.clear()
    _signals_armed = False
    _after_fork_parent()
