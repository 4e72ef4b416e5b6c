"""A server's scratch directory: where multiprocessing's temporary files go, and how the ones of
dead servers are swept.

Some facts about multiprocessing's temporary files: the forkserver listens on a Unix socket in
a ``pymp-*`` directory that multiprocessing makes with ``tempfile.mkdtemp`` and removes at a
clean exit. A SIGKILLed process runs no exit code, so the directory stays. The server therefore
points ``tempfile`` at a directory of its own (``zcnet-server-*`` in the system temp
directory) while the forkserver starts (unless the temp directory's path is so long that the
socket's would not fit), so ``pymp-*`` lands inside it, and holds an exclusive
``flock`` on a ``lock`` file there for as long as it lives. The kernel drops that lock when the
process dies, however it dies: the next server that starts finds every such directory of its
user whose lock it can take, i.e. whose owner is gone, and removes it. A lock, not a PID, so a
reused PID never makes a live server's directory look dead. At a clean exit the server removes
its directory itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.util import Finalize
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "zcnet-server-"
LOCK = "lock"
STALE = 3600.0   # seconds after which a directory that never got its lock is a leftover
# sun_path holds 108 bytes with its NUL; multiprocessing adds "/pymp-XXXXXXXX/listener-XXXXXXXX".
_SUN_PATH = 107
_MP_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def fits() -> bool:
    """Whether the forkserver's socket path still fits below a scratch directory here."""
    return len(os.path.join(tempfile.gettempdir(), PREFIX + "XXXXXXXX")) + _MP_SUFFIX <= _SUN_PATH


class Scratch:
    """This process's scratch directory, locked while it lives."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX))
        # Locked under a private name, then renamed into place: a sweeper only ever sees a
        # "lock" that is already held.
        tmp = self.path / f".{LOCK}"
        self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, self.path / LOCK)
        # Removed at exit after multiprocessing's own pymp-* removal (exit priority -100; lower
        # runs later), which would fail, and print a traceback, were its directory gone first.
        Finalize(None, _remove, args=(shutil.rmtree, str(self.path), self._fd), exitpriority=-200)

    @contextlib.contextmanager
    def as_tempdir(self) -> Iterator[None]:
        """``tempfile`` creates its files here inside the block (single-threaded use only)."""
        old, tempfile.tempdir = tempfile.tempdir, str(self.path)
        try:
            yield
        finally:
            tempfile.tempdir = old



def _remove(rmtree: Callable[..., None], path: str, fd: int) -> None:
    rmtree(path, ignore_errors=True)
    os.close(fd)


def sweep() -> list[Path]:
    """Remove the scratch directories of this user's dead servers; return what was removed."""
    removed = []
    for d in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue   # not ours (or a symlink someone planted): never touched
        if _owner_alive(d / LOCK, st.st_mtime):
            continue
        shutil.rmtree(d, ignore_errors=True)
        log.info("removed %s, left by a server that is gone", d)
        removed.append(d)
    return removed


def _owner_alive(lock: Path, made: float) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        # No lock yet: a server is creating it (a moment), or one died doing so (long ago).
        return time.time() - made < STALE
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
