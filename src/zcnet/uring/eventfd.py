"""An eventfd registered with a ring (IORING_REGISTER_EVENTFD): how an event loop hears of it.

Some facts about what signals it: the kernel adds to the eventfd when it posts CQEs, and on a
DEFER_TASKRUN ring also when it queues task work on an empty list, i.e. when there is something
an ``io_uring_enter(GETEVENTS)`` would turn into CQEs. The ring holds its own reference to the
eventfd, so the fd may be closed before or after the ring.
"""

from __future__ import annotations

import ctypes
import os

from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring


def register_eventfd(ring: Ring, efd: int) -> None:
    ring.register(u.IORING_REGISTER_EVENTFD, ctypes.c_int32(efd), 1)


def unregister_eventfd(ring: Ring) -> None:
    ring.register(u.IORING_UNREGISTER_EVENTFD, None, 0)


def drain(efd: int) -> int:
    """Reset a non-blocking eventfd; returns the count it held (0 when it was not signalled)."""
    try:
        return os.eventfd_read(efd)
    except BlockingIOError:
        return 0
