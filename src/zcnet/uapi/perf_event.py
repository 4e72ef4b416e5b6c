"""linux/perf_event.h: the part of the perf_event_open ABI zcnet uses. Names as in the header.

Only the first 64 bytes of ``struct perf_event_attr`` (PERF_ATTR_SIZE_VER0) are defined; every
kernel accepts that size.
"""

from __future__ import annotations

import ctypes

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

# perf_event_attr bitfield flags (bit positions in the u64 after read_format)
ATTR_DISABLED = 1 << 0
ATTR_EXCLUDE_HV = 1 << 6

__NR_perf_event_open = {"x86_64": 298, "aarch64": 241}


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
