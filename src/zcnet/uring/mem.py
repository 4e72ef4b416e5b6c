"""Memory mappings with a known address: ring memory, buffer areas, hugetlb pages.

Some facts about Python's ``mmap`` module: it hides the address, and refuses to close while a
numpy view exists, so an error path can leak the mapping. We call libc mmap/munmap ourselves and
hand out numpy views over the address; ``close()`` unmaps unconditionally, so views must not be
used after it (owners drop their views first). Tests count io_uring mappings to prove release.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import weakref

import numpy as np

from zcnet.uapi.mman import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_HUGE_2MB,
    MAP_HUGETLB,
    MAP_NORESERVE,
    MAP_POPULATE,
    MAP_PRIVATE,
    MAP_SHARED,
    PROT_NONE,
    PROT_READ,
    PROT_WRITE,
)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.munmap.restype = ctypes.c_int

MAP_FAILED = ctypes.c_void_p(-1).value
PAGE_SIZE = mmap.PAGESIZE
HUGE_PAGE_SIZE = 2 << 20  # the hugetlb page size Mapping.anonymous asks for (MAP_HUGE_2MB)


def page_align(n: int, page: int = PAGE_SIZE) -> int:
    return (n + page - 1) // page * page


class Mapping:
    """One mmap'd range; ``close()`` is idempotent."""

    def __init__(self, size: int, *, fd: int = -1, offset: int = 0, flags: int = 0,
                 prot: int = PROT_READ | PROT_WRITE) -> None:
        if size <= 0:
            raise ValueError("mapping size must be positive")
        base = MAP_SHARED if fd >= 0 else MAP_PRIVATE | MAP_ANONYMOUS
        addr = _libc.mmap(None, size, prot, base | flags, fd, offset)
        if addr in (None, MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {size} bytes: {os.strerror(err)}")
        self.addr: int = addr
        self.size = size

    @classmethod
    def anonymous(cls, size: int, *, hugetlb: bool = False, populate: bool = True) -> Mapping:
        flags = (MAP_POPULATE if populate else 0) | (MAP_HUGETLB | MAP_HUGE_2MB if hugetlb else 0)
        return cls(page_align(size, HUGE_PAGE_SIZE if hugetlb else PAGE_SIZE), flags=flags)

    @classmethod
    def reserved(cls, size: int, capacity: int) -> Mapping:
        """``capacity`` bytes of address space (PROT_NONE, nothing reserved behind it) whose
        first ``size`` are normal memory, populated; ``commit`` turns more of it into memory.
        One range, so offsets into it stay valid as it grows (a zcrx queue's added areas)."""
        m = cls(page_align(capacity), prot=PROT_NONE, flags=MAP_NORESERVE)
        try:
            m.commit(0, page_align(size))
        except OSError:
            m.close()
            raise
        return m

    def commit(self, offset: int, size: int) -> None:
        """Map ``size`` bytes of populated memory at ``offset`` of a ``reserved`` range."""
        if offset % PAGE_SIZE or size <= 0 or size % PAGE_SIZE or offset + size > self.size:
            raise ValueError(f"commit of {size} bytes at {offset} outside the reserved range")
        self._fixed(offset, size, PROT_READ | PROT_WRITE, MAP_POPULATE)

    def decommit(self, offset: int, size: int) -> None:
        """Give ``commit``ted memory back, leaving the address space reserved."""
        self._fixed(offset, size, PROT_NONE, MAP_NORESERVE)

    def _fixed(self, offset: int, size: int, prot: int, flags: int) -> None:
        addr = _libc.mmap(self.addr + offset, size, prot,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | flags, -1, 0)
        if addr in (None, MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {size} bytes at +{offset}: {os.strerror(err)}")

    def view(self, dtype: np.typing.DTypeLike = np.uint8, offset: int = 0,
             count: int | None = None) -> np.ndarray:
        """A numpy view of ``count`` items of ``dtype`` starting ``offset`` bytes in."""
        if self.addr == 0:
            raise ValueError("mapping is closed")
        dt = np.dtype(dtype)
        if count is None:
            count = (self.size - offset) // dt.itemsize
        if offset < 0 or offset + count * dt.itemsize > self.size:
            raise ValueError("view outside the mapping")
        raw = (ctypes.c_char * (count * dt.itemsize)).from_address(self.addr + offset)
        return np.frombuffer(raw, dtype=dt, count=count)

    def memview(self) -> memoryview:
        """A writable byte memoryview of the whole mapping (release it before ``close``)."""
        if self.addr == 0:
            raise ValueError("mapping is closed")
        return memoryview((ctypes.c_char * self.size).from_address(self.addr)).cast("B")

    @property
    def closed(self) -> bool:
        return self.addr == 0

    def close(self) -> None:
        if self.addr:
            _libc.munmap(self.addr, self.size)
            self.addr = 0

    def __enter__(self) -> Mapping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lasting_view(mapping: Mapping) -> memoryview:
    """A writable byte view of all of ``mapping`` that keeps it mapped: the view's exporter
    unmaps it once neither the view nor anything made from it (slices, numpy arrays) is alive,
    so memory never vanishes under a live view. The owner drops its own view at close and
    leaves the unmapping to the exporter."""
    raw = type("_MappedBytes", (ctypes.c_char * mapping.size,), {}).from_address(mapping.addr)
    # Not at interpreter exit: a daemon thread may still read a view then, and the process exit
    # unmaps anyway.
    weakref.finalize(raw, mapping.close).atexit = False
    return memoryview(raw).cast("B")
