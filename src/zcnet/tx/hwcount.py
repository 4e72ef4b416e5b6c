"""Hardware instruction and cycle counters for the calling thread, via perf_event_open(2).

The ABI (linux/perf_event.h) is in ``zcnet.uapi.perf_event``.

Some facts about the counters: with pid=0, cpu=-1 and no ``inherit`` a counter follows this one
thread across CPUs and counts user and kernel mode (kernel mode needs perf_event_paranoid <= 1 or
CAP_PERFMON; we ask for it because the send path's cost is mostly kernel). Virtual machines often
expose no PMU: the open fails with ENOENT/EOPNOTSUPP and callers report
``n/a: no hardware counters``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct

from zcnet.errors import ClosedError
from zcnet.uapi import perf_event as pe

NO_COUNTERS = "n/a: no hardware counters"


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _open(type_: int, config: int) -> int:
    nr = pe.__NR_perf_event_open.get(platform.machine())
    if nr is None:
        raise OSError(0, f"perf_event_open number unknown on {platform.machine()}")
    attr = pe.perf_event_attr(type=type_, size=pe.PERF_ATTR_SIZE_VER0, config=config,
                           flags=pe.ATTR_DISABLED | pe.ATTR_EXCLUDE_HV)
    fd = _libc.syscall(nr, ctypes.byref(attr), 0, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def _ioctl(fd: int, request: int) -> None:
    if _libc.ioctl(fd, request, 0) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


HW_EVENTS = {"instructions": (pe.PERF_TYPE_HARDWARE, pe.PERF_COUNT_HW_INSTRUCTIONS),
             "cycles": (pe.PERF_TYPE_HARDWARE, pe.PERF_COUNT_HW_CPU_CYCLES)}


class HwCounters:
    """Counts of this thread between :meth:`start` and :meth:`stop`: by default instructions
    and cycles; ``events`` maps names to (perf type, config) for others (software events work
    on every kernel, which is how the tests exercise this code).

    ``HwCounters.open()`` returns None where an event cannot be opened (no PMU: ``NO_COUNTERS``).
    Close with :meth:`close` or use as a context manager.
    """

    def __init__(self, fds: dict[str, int]) -> None:
        self._fds = fds
        self._closed = False

    @classmethod
    def open(cls, events: dict[str, tuple[int, int]] | None = None) -> HwCounters | None:
        fds: dict[str, int] = {}
        try:
            for name, (type_, config) in (events or HW_EVENTS).items():
                fds[name] = _open(type_, config)
        except OSError:
            for fd in fds.values():
                os.close(fd)
            return None
        return cls(fds)

    def start(self) -> None:
        if self._closed:
            raise ClosedError.of(self, "start")
        for fd in self._fds.values():
            _ioctl(fd, pe.PERF_EVENT_IOC_RESET)
            _ioctl(fd, pe.PERF_EVENT_IOC_ENABLE)

    def stop(self) -> dict[str, int]:
        if self._closed:  # no counters left: an empty result would read as a measurement
            raise ClosedError.of(self, "stop")
        out = {}
        for name, fd in self._fds.items():
            _ioctl(fd, pe.PERF_EVENT_IOC_DISABLE)
            out[name] = struct.unpack("<Q", os.read(fd, 8))[0]
        return out

    def close(self) -> None:
        self._closed = True
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> HwCounters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
