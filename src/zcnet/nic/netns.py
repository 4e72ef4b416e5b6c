"""Open sockets inside a named network namespace.

Some facts: a socket belongs to the namespace its creating thread was in, for the socket's whole
life; ``setns(CLONE_NEWNET)`` switches only the calling thread. So the control plane switches the
thread, creates its sockets and switches back at once. (zcnet.lab.netns offers the same for the
lab; this copy keeps the nic layer free of a dependency on the lab.)
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

from zcnet.errors import ZcnetError

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Run the block with this thread in namespace ``name`` (None: stay where we are)."""
    if name is None:
        yield
        return
    try:
        target = os.open(os.path.join(NETNS_RUN_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ZcnetError(f"network namespace {name!r} does not exist",
                         "list them with 'ip netns list'") from None
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(home)
    finally:
        os.close(target)
