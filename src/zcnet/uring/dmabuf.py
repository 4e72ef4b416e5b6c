"""Host-memory dma-bufs: udmabuf over a sealed memfd, its CPU view, and the CPU access brackets.

Some facts about udmabuf (drivers/dma-buf/udmabuf.c, linux/dma-buf.h):

- ``/dev/udmabuf``'s UDMABUF_CREATE turns pages of a memfd into a dma-buf. The memfd must be
  sealed against shrinking (F_SEAL_SHRINK) and must not be sealed against writes; the module's
  ``size_limit_mb`` caps the size (EINVAL beyond it). The dma-buf holds the pages, so the memfd
  may be closed once it and any mapping of it exist.
- The CPU reaches the memory through a shared mapping of the memfd (what the kernel's
  ncdevmem does) or of the dma-buf fd. Accesses are bracketed with DMA_BUF_IOCTL_SYNC on the
  dma-buf (START then END, with READ and/or WRITE) so a device that mapped it stays coherent:
  END|WRITE after the CPU wrote is what makes the bytes the device's to read.
- Debian's 7.x kernels build udmabuf in; this host's kernel has no udmabuf module at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator

from zcnet.errors import ClosedError, UsageError, ZcnetError, require_int
from zcnet.uapi import dmabuf, udmabuf
from zcnet.uring.mem import Mapping, lasting_view, page_align

UDMABUF_DEV = "/dev/udmabuf"


def _memfd(size: int) -> int:
    """A memfd of ``size`` bytes sealed as udmabuf wants it."""
    memfd = os.memfd_create("zcnet-dmabuf", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    with contextlib.ExitStack() as undo:
        undo.callback(os.close, memfd)
        os.ftruncate(memfd, size)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        undo.pop_all()
    return memfd


def _udmabuf_of(memfd: int, size: int) -> int:
    """A dma-buf fd over the first ``size`` bytes of ``memfd``; ZcnetError naming the fix when
    udmabuf is missing or refuses."""
    try:
        dev = os.open(UDMABUF_DEV, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ZcnetError(f"{UDMABUF_DEV} does not exist",
                         "load it with `modprobe udmabuf` or pass a dma-buf fd") from None
    try:
        req = udmabuf.udmabuf_create(memfd=memfd, flags=udmabuf.UDMABUF_FLAGS_CLOEXEC,
                                     offset=0, size=size)
        # A mutable argument makes ioctl() return the syscall's result: the new fd.
        return fcntl.ioctl(dev, udmabuf.UDMABUF_CREATE, bytearray(req), True)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise ZcnetError(f"udmabuf refused a {size}-byte buffer ({e.strerror})",
                             "check /sys/module/udmabuf/parameters/size_limit_mb") from e
        raise
    finally:
        os.close(dev)


def udmabuf_create(size: int) -> int:
    """A dma-buf fd of ``size`` bytes (page-aligned) from a sealed memfd; ZcnetError when
    udmabuf is missing."""
    memfd = _memfd(size)
    try:
        return _udmabuf_of(memfd, size)
    finally:
        os.close(memfd)


def sync(fd: int, flags: int) -> None:
    """DMA_BUF_IOCTL_SYNC on dma-buf ``fd``: one side of a CPU access bracket."""
    fcntl.ioctl(fd, dmabuf.DMA_BUF_IOCTL_SYNC, bytes(dmabuf.dma_buf_sync(flags)))


@contextlib.contextmanager
def cpu_write(fd: int) -> Iterator[None]:
    """Bracket CPU writes to dma-buf ``fd``: SYNC START|WRITE before, END|WRITE after (also
    when the writes fail), so a device that mapped it reads what the CPU wrote."""
    sync(fd, dmabuf.DMA_BUF_SYNC_START | dmabuf.DMA_BUF_SYNC_WRITE)
    try:
        yield
    finally:
        sync(fd, dmabuf.DMA_BUF_SYNC_END | dmabuf.DMA_BUF_SYNC_WRITE)


class Udmabuf:
    """``size`` bytes (rounded up to pages) of host memory as a dma-buf: ``fd`` is the dma-buf,
    ``view`` a writable memoryview of the same pages (a shared mapping of its memfd).

    Write through ``view`` inside ``with buf.cpu_write():`` so a device that mapped the dma-buf
    sees the bytes. ``close()`` closes the fd; the mapping goes with the last view of it (a
    sender's slots keep it alive), and a binding of the dma-buf keeps the pages in the kernel.
    """

    def __init__(self, size: int) -> None:
        require_int("dma-buf size", size, "pass a whole number of bytes, e.g. 8 << 20")
        if size <= 0:
            raise UsageError(f"dma-buf size must be positive, got {size}")
        self.size = page_align(size)
        with contextlib.ExitStack() as undo:
            memfd = _memfd(self.size)
            undo.callback(os.close, memfd)  # always: the dma-buf and the mapping hold the pages
            self.fd = _udmabuf_of(memfd, self.size)
            with contextlib.ExitStack() as on_error:
                on_error.callback(os.close, self.fd)
                self.view = lasting_view(Mapping(self.size, fd=memfd))
                on_error.pop_all()
        self._closed = False

    def cpu_write(self) -> contextlib.AbstractContextManager[None]:
        """Bracket CPU writes through ``view`` (see :func:`cpu_write`)."""
        if self._closed:
            raise ClosedError.of(self, "cpu_write")
        return cpu_write(self.fd)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the dma-buf fd and drop this object's view; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.view.release()
        os.close(self.fd)

    def __enter__(self) -> Udmabuf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
