"""One zcrx queue received by several threads: ZCRX_CTRL_EXPORT and ZCRX_REG_IMPORT (6.19+).

A queue's ring is single-issuer, so another thread cannot receive through it; it can receive
through a ring of its own that imports the same ifq. Some facts (io_uring/zcrx.c, 7.3.4):

- EXPORT is a register call on the owner's ring (single-issuer: only its thread may make it).
  It makes an anonymous "[zcrx]" file holding a reference to the ifq and returns its fd.
- IMPORT registers that fd on another ring (DEFER_TASKRUN and 32-byte CQEs required, every
  other field 0). That ring gets its own zcrx id for the same ifq: the same area, refill ring
  and buffers. Each ring gets the completions of its own RECV_ZCs.
- The ifq lives until its last ring and last "[zcrx]" file are gone; an open file keeps the
  NIC queue bound, so the fd is closed as soon as it is imported.
- Threads share the address space: the importer uses the area and the refill ring where the
  owner mapped them, and their writers to the refill ring take one lock (IfqMemory.lock).

Another process cannot use the owner's addresses: zcrx_procs.py puts the area and the refill
region in a memfd it maps too, and the fd travels over a unix socket.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import threading

from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError
from zcnet.rx.zc.zcrx_queue import ZcrxQueue
from zcnet.rx.zc.zcrx_reg import Offers, kernel_offers
from zcnet.rx.zc.zcrx_rings import queue_ring
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring

#: The kernel release that brought EXPORT and IMPORT.
IMPORT_SINCE = "6.19"


def refuse_without_import(offers: Offers, where: str) -> None:
    """The refusal on a kernel without EXPORT/IMPORT, naming what is needed and the way out."""
    if not offers.imports:
        raise Unsupported(
            f"receiving {where} in another thread needs ZCRX_CTRL_EXPORT and ZCRX_REG_IMPORT "
            f"(Linux {IMPORT_SINCE}+; this is {platform.release()})",
            "receive every connection of the queue in the thread that opened it")


class ZcrxExport:
    """A queue's ifq handed to one other thread: ``open()`` there gives that thread's queue.
    Made by ``export_queue`` in the queue's own thread; used once."""

    def __init__(self, source: ZcrxQueue, box_fd: int) -> None:
        self.source = source
        self._fd = box_fd
        self._lock = threading.Lock()

    def open(self, *, shared: bool = True) -> ZcrxQueue:
        """This thread's queue on the same ifq (its own ring): connections of this thread join
        it, and ``open_zcrx`` here finds it. ``shared`` as for open_zcrx_queue."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            raise ClosedError("open() on a used or closed ZcrxExport",
                              "export the queue again for each thread")
        src = self.source
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, fd)  # imported or not: an open box keeps the queue bound
            mixed = bool(src.ring and src.ring.cqe_mixed)  # the source ring's kind of CQ
            ring = queue_ring(src.rq.entries, mixed)
            with contextlib.ExitStack() as fail:
                fail.callback(ring.close)
                ifq_id = int(import_box(ring, fd, src.where).zcrx_id)
                zq = ZcrxQueue.adopt(src, ring, ifq_id, shared=shared)
                fail.pop_all()
        return zq

    def close(self) -> None:
        """Give the export up unused (the queue's ifq is no longer held by it)."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> ZcrxExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def export_queue(zq: ZcrxQueue, offers: Offers) -> ZcrxExport:
    """``zq``'s ifq for another thread (call in ``zq``'s thread; ``offers``: the kernel's)."""
    refuse_without_import(offers, zq.where)
    return ZcrxExport(zq, export_box(zq))


def export_box(zq: ZcrxQueue) -> int:
    """A new "[zcrx]" file holding ``zq``'s ifq (ZCRX_CTRL_EXPORT, in ``zq``'s thread): its fd,
    the caller's to import elsewhere or close."""
    ring = zq.ring
    if ring is None:
        raise ClosedError.of(zq, "export")
    if threading.get_ident() != zq.owner_tid:
        raise UsageError(f"export() of {zq.where}'s zcrx queue from a thread that did not open "
                         "it (its ring is single-issuer)", "export it in the thread that opened "
                         "it and hand the export over")
    ctrl = u.zcrx_ctrl(zcrx_id=zq.ifq_id, op=u.ZCRX_CTRL_EXPORT)
    try:
        ring.register(u.IORING_REGISTER_ZCRX_CTRL, ctrl, 0)
    except OSError as e:
        raise ZcnetError(f"exporting {zq.where}'s zcrx queue failed: {os.strerror(e.errno)}"
                         ) from e
    return int(u.zcrx_ctrl_export.from_buffer(ctrl, 24).zcrx_fd)  # the union member written


def import_box(ring: Ring, fd: int, where: str) -> u.io_uring_zcrx_ifq_reg:
    """Register the "[zcrx]" file ``fd`` on ``ring`` (ZCRX_REG_IMPORT): what the kernel wrote
    back (``ring``'s zcrx id for the ifq, the refill ring's offsets). ``fd`` stays the
    caller's (close it: an open one keeps the queue bound)."""
    reg = u.io_uring_zcrx_ifq_reg(if_idx=fd, flags=u.ZCRX_REG_IMPORT)
    try:
        ring.register(u.IORING_REGISTER_ZCRX_IFQ, reg, 1)
    except OSError as e:
        raise ZcnetError(f"importing {where}'s zcrx queue failed: {os.strerror(e.errno)}",
                         f"the kernel needs ZCRX_REG_IMPORT (Linux {IMPORT_SINCE}+)"
                         if e.errno == errno.EINVAL else None) from e
    return reg


def export_zcrx_queue(zq: ZcrxQueue) -> ZcrxExport:
    """``zq`` for another thread of this process (call in ``zq``'s thread, then ``.open()`` in
    the other): its own ring on the same ifq, area and refill ring. Needs ZCRX_CTRL_EXPORT /
    ZCRX_REG_IMPORT (6.19+); refused clearly before."""
    return export_queue(zq, kernel_offers())
