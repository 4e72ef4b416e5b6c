"""Waiting for completions with a timeout (IORING_ENTER_EXT_ARG).

TODO(lead): ``Ring.submit``/``Ring.wait`` take no timeout yet; this is the one place that enters
with an ``io_uring_getevents_arg`` timespec. Move it into zcnet.uring.ring when it grows one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _timespec(ctypes.Structure):  # struct __kernel_timespec
    _fields_ = (("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64))


def wait_cqes(ring: Ring, timeout: float | None, wait_nr: int = 1) -> None:
    """Submit what is pending and wait for ``wait_nr`` CQEs or ``timeout`` seconds (None: no
    limit). Deferred task work (DEFER_TASKRUN) runs inside this call; EINTR and ETIME return."""
    if timeout is None:
        ring.submit(wait_nr)
        return
    if ring.sq_space() < ring.sq_entries:
        ring.submit()  # SQEs are pending (an arm or a cancel): publish them first
    ts = _timespec(int(timeout), int((timeout % 1) * 1e9))
    arg = u.io_uring_getevents_arg(ts=ctypes.addressof(ts))
    flags = u.IORING_ENTER_GETEVENTS | u.IORING_ENTER_EXT_ARG
    ret = _syscall(u.__NR_io_uring_enter, ctypes.c_int(ring.fd), ctypes.c_uint(0),
                   ctypes.c_uint(wait_nr), ctypes.c_uint(flags), ctypes.byref(arg),
                   ctypes.c_size_t(ctypes.sizeof(arg)))
    if ret < 0:
        err = ctypes.get_errno()
        if err not in (errno.ETIME, errno.EINTR, errno.EAGAIN, errno.EBUSY):
            raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
