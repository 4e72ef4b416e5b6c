"""linux/udmabuf.h: turn a sealed memfd into a dma-buf. Names as in the header."""

from __future__ import annotations

import ctypes

UDMABUF_FLAGS_CLOEXEC = 0x01


class udmabuf_create(ctypes.Structure):
    _fields_ = (
        ("memfd", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("offset", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
    )


# _IOW('u', 0x42, struct udmabuf_create): dir=1 (write) << 30 | size << 16 | type << 8 | nr
UDMABUF_CREATE = (1 << 30) | (ctypes.sizeof(udmabuf_create) << 16) | (ord("u") << 8) | 0x42
