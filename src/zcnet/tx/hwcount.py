"""Hardware instruction and cycle counters for the calling thread, via perf_event_open(2).

The ABI below (linux/perf_event.h) belongs in ``zcnet.uapi.perf_event``; it lives here until that
module exists. Only the first 64 bytes of ``struct perf_event_attr`` (PERF_ATTR_SIZE_VER0) are
passed, which every kernel accepts.

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

# linux/perf_event.h
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_HW_INSTRUCTIONS = 1
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_COUNT_SW_CONTEXT_SWITCHES = 3
PERF_ATTR_SIZE_VER0 = 64
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
_ATTR_DISABLED = 1 << 0
_ATTR_EXCLUDE_HV = 1 << 6

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}

NO_COUNTERS = "n/a: no hardware counters"


class perf_event_attr(ctypes.Structure):
    _fields_ = (
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
    )


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _open(type_: int, config: int) -> int:
    nr = _NR_PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        raise OSError(0, f"perf_event_open number unknown on {platform.machine()}")
    attr = perf_event_attr(type=type_, size=PERF_ATTR_SIZE_VER0, config=config,
                           flags=_ATTR_DISABLED | _ATTR_EXCLUDE_HV)
    fd = _libc.syscall(nr, ctypes.byref(attr), 0, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def _ioctl(fd: int, request: int) -> None:
    if _libc.ioctl(fd, request, 0) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


HW_EVENTS = {"instructions": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS),
             "cycles": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES)}


class HwCounters:
    """Counts of this thread between :meth:`start` and :meth:`stop`: by default instructions
    and cycles; ``events`` maps names to (perf type, config) for others (software events work
    on every kernel, which is how the tests exercise this code).

    ``HwCounters.open()`` returns None where an event cannot be opened (no PMU: ``NO_COUNTERS``).
    Close with :meth:`close` or use as a context manager.
    """

    def __init__(self, fds: dict[str, int]) -> None:
        self._fds = fds

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
        for fd in self._fds.values():
            _ioctl(fd, PERF_EVENT_IOC_RESET)
            _ioctl(fd, PERF_EVENT_IOC_ENABLE)

    def stop(self) -> dict[str, int]:
        out = {}
        for name, fd in self._fds.items():
            _ioctl(fd, PERF_EVENT_IOC_DISABLE)
            out[name] = struct.unpack("<Q", os.read(fd, 8))[0]
        return out

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> HwCounters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
