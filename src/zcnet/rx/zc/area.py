"""The registered area: the one block of memory received payload lands in.

Some facts about the memory kinds:

- anonymous: private, page-aligned mmap; what the kernel pins for zcrx and what the soft provider
  carves into buffers. Default.
- hugetlb: 2 MiB pages (MAP_HUGETLB | MAP_HUGE_2MB) cut IOTLB/TLB pressure for large areas. The
  pool is finite (/proc/sys/vm/nr_hugepages); when it is empty the mmap fails with ENOMEM and we
  fall back to anonymous memory with a warning rather than failing the receiver.
- dma-buf: memory exported by a driver (or udmabuf from a memfd). zcrx takes it with
  IORING_ZCRX_AREA_DMABUF, devmem binds it to a queue. The CPU view is an mmap of the dma-buf fd,
  bracketed by DMA_BUF_IOCTL_SYNC so caches are coherent with the device.
- shared (a memfd): normal memory other processes can map too, so a zcrx queue's area can be
  read by the processes that import the queue (zcrx_procs.py). zcrx pins its pages like
  anonymous ones (shmem takes long-term pins).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import numpy as np

from zcnet.errors import ClosedError, UsageError, ZcnetError, require_int
from zcnet.uapi import dmabuf as udmabuf_sync
from zcnet.uring.dmabuf import UDMABUF_DEV, sync, udmabuf_create
from zcnet.uring.mem import HUGE_PAGE_SIZE, PAGE_SIZE, Mapping, lasting_view, page_align

__all__ = ["HUGE_2MB", "PAGE_SIZE", "UDMABUF_DEV", "Area", "udmabuf_create"]

log = logging.getLogger(__name__)

HUGE_2MB = HUGE_PAGE_SIZE


class Area:
    """Page-aligned memory the receive path writes into; ``view`` is a writable memoryview and
    ``array`` a uint8 numpy view of all of it.

    Some facts about its lifetime: slices of ``view`` and ``array`` handed to the application
    (chunks, and whatever the application made of them) all hold the one ctypes object that
    exports the mapping. ``close()`` drops the area's own references; the mapping is unmapped
    when that object dies, at once when nothing else holds it, else when the last view does,
    so memory never vanishes under a live view.
    """

    def __init__(
        self,
        size: int,
        *,
        hugetlb: bool = False,
        dmabuf_fd: int | None = None,
        memfd: int | None = None,
        capacity: int | None = None,
    ) -> None:
        """``memfd``: map the first ``size`` bytes of that memfd (shared memory; the caller
        keeps the fd). ``capacity``: reserve that much address space (normal pages only), so
        ``grow`` can add memory right after what there is (a zcrx queue's added areas)."""
        require_int("area size", size, "pass a whole number of bytes, e.g. area_size=64 << 20")
        if size <= 0:
            raise UsageError(f"area size must be positive, got {size}")
        #: Address space reserved for ``grow`` (0: the area cannot grow).
        self.capacity = 0
        if capacity is not None:
            require_int("area capacity", capacity, "pass a whole number of bytes")
            if capacity < size:
                raise UsageError(f"area capacity {capacity} is below its size {size}",
                                 "pass a capacity of at least the area size, or none")
            if hugetlb or dmabuf_fd is not None or memfd is not None:
                raise UsageError("an area with a capacity to grow is of normal pages",
                                 "drop capacity, or hugetlb/dmabuf_fd/memfd")
        self.dmabuf_fd: int | None = None
        self._owns_fd = False
        self._closed = False
        self._mapping: Mapping | None
        if dmabuf_fd is not None:
            self.kind = "dmabuf"
            try:
                self.size = os.lseek(dmabuf_fd, 0, os.SEEK_END)
            except OSError as e:  # EBADF: not open; ESPIPE: a pipe or socket
                raise UsageError(f"dma-buf fd {dmabuf_fd} cannot be used: {e.strerror}",
                                 "pass an open dma-buf fd (or omit dmabuf_fd)") from None
            if self.size < size:
                raise UsageError(
                    f"dma-buf fd {dmabuf_fd} holds {self.size} bytes, area needs {size}",
                    "export a larger dma-buf or ask for a smaller area",
                )
            self.dmabuf_fd = dmabuf_fd
            try:
                self._mapping = Mapping(self.size, fd=dmabuf_fd)
            except OSError as e:
                # Device memory (a GPU's, say) may refuse CPU mappings: the area still works
                # for zcrx/devmem, chunks then carry offsets for the device's own API.
                log.info("dma-buf fd %d cannot be mapped by the CPU (%s)", dmabuf_fd, e.strerror)
                self._mapping = None
        elif memfd is not None:
            try:
                self._mapping = Mapping(page_align(size), fd=memfd)
            except OSError as e:
                raise ZcnetError(f"cannot map a shared area of {size} bytes: {e.strerror}",
                                 "ask for a smaller area") from None
            self.size = self._mapping.size
            self.kind = "shared"
        elif hugetlb:
            try:
                self._mapping = Mapping.anonymous(size, hugetlb=True)
                self.kind = "hugetlb"
            except OSError as e:
                warnings.warn(
                    f"no 2 MiB hugetlb pages for a {page_align(size, HUGE_2MB) >> 20} MiB area "
                    f"({e.strerror}); using normal pages (raise /proc/sys/vm/nr_hugepages to get "
                    "them)", RuntimeWarning, stacklevel=2)
                self._mapping = _anon(size)
                self.kind = "anon"
            self.size = self._mapping.size
        elif capacity is not None:
            try:
                self._mapping = Mapping.reserved(size, capacity)
            except OSError as e:
                raise ZcnetError(f"cannot map an area of {size} bytes in {capacity} of address "
                                 f"space: {e.strerror}", "ask for a smaller area") from None
            self.size = page_align(size)
            self.capacity = self._mapping.size
            self.kind = "anon"
        else:
            self._mapping = _anon(size)
            self.size = self._mapping.size
            self.kind = "anon"
        if self._mapping is None:
            self.addr = 0
            self.view = _Unmapped(self.size)  # type: ignore[assignment]
            self.array = np.empty(0, np.uint8)
            return
        self.addr = self._mapping.addr
        self.view = lasting_view(self._mapping)
        self.array = np.frombuffer(self.view, dtype=np.uint8)

    def grow(self, extra: int) -> int:
        """Map ``extra`` more bytes (page-aligned) right after the area's end, within its
        capacity; returns where they start. The area's views already cover them."""
        if self._closed:
            raise ClosedError.of(self, "grow")
        require_int("extra area size", extra, "pass a whole number of bytes")
        if extra <= 0 or extra % PAGE_SIZE:
            raise UsageError(f"an added area must be a positive multiple of {PAGE_SIZE} bytes, "
                             f"got {extra}")
        if self.size + extra > self.capacity:
            raise UsageError(
                f"the area's capacity is {self.capacity} bytes, {self.size} in use: "
                f"{extra} more do not fit" if self.capacity else
                "this area was made without a capacity to grow",
                "open the queue with a larger area_capacity")
        at = self.size
        try:
            self.mapping.commit(at, extra)
        except OSError as e:
            raise ZcnetError(f"cannot map {extra} more bytes of area: {e.strerror}",
                             "add a smaller area") from None
        self.size += extra
        return at

    def ungrow(self, at: int) -> None:
        """Give back what ``grow`` added from ``at`` on (it was never registered)."""
        if self._closed:
            raise ClosedError.of(self, "ungrow")
        if at < self.size:
            self.mapping.decommit(at, self.size - at)
            self.size = at

    @property
    def mapping(self) -> Mapping:
        """The CPU mapping (for a buffer ring over the area); ZcnetError when there is none."""
        if self._mapping is None:
            raise ZcnetError("this dma-buf cannot be mapped by the CPU",
                             "use zcrx/devmem for device memory")
        return self._mapping

    @classmethod
    def udmabuf(cls, size: int) -> Area:
        """An area backed by a memfd turned into a dma-buf through /dev/udmabuf."""
        fd = udmabuf_create(page_align(size))
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, fd)
            area = cls(size, dmabuf_fd=fd)
            undo.pop_all()
        area.kind = "udmabuf"
        area._owns_fd = True
        return area

    def sync(self, start: bool) -> None:
        """Bracket CPU reads of a dma-buf area (no-op for normal memory)."""
        if self._closed:  # an fd we owned is closed, and its number may name another file now
            raise ClosedError.of(self, "sync")
        if self.dmabuf_fd is None:
            return
        sync(self.dmabuf_fd, udmabuf_sync.DMA_BUF_SYNC_READ | (
            udmabuf_sync.DMA_BUF_SYNC_START if start else udmabuf_sync.DMA_BUF_SYNC_END))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> bool:
        """Drop the area's views; True when that unmapped it, False when views handed to the
        application are still alive (the last one to go unmaps it)."""
        if self._closed:
            return True
        self._closed = True
        with contextlib.ExitStack() as undo:
            undo.callback(self._close_fd)
            if self._mapping is None:
                return True
            self.array = np.empty(0, np.uint8)
            self.view.release()
            if not self._mapping.closed:
                log.debug("area %#x still exported by application views; unmapped when they die",
                          self.addr)
                return False
        return True

    def _close_fd(self) -> None:
        if self._owns_fd and self.dmabuf_fd is not None:
            os.close(self.dmabuf_fd)
            self._owns_fd = False

    def __enter__(self) -> Area:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _anon(size: int) -> Mapping:
    try:
        return Mapping.anonymous(size)
    except OSError as e:
        raise ZcnetError(f"cannot map an area of {size} bytes: {e.strerror}",
                         "ask for a smaller area") from None


class _Unmapped:
    """Stands in for the view of an area the CPU cannot map."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __getitem__(self, key: object) -> memoryview:
        raise ZcnetError("this dma-buf cannot be mapped by the CPU, so chunks have no bytes view",
                         "use chunk.offset and chunk.length with the device's own API")

    def release(self) -> None:
        pass
