"""More memory for a registered zcrx queue: ZCRX_CTRL_ADD_AREA (Linux 7.3).

Some facts that shape it:

- A registration fixes its first area. ADD_AREA registers another ``io_uring_zcrx_area_reg``
  on the same ifq (``zcrx_ctrl.zc_area.area_ptr`` points at it) and the kernel writes back its
  ``rq_area_token``: the area id in the bits above IORING_ZCRX_AREA_SHIFT. Its buffers join the
  free lists the kernel allocates from; a CQE's ``off`` names the area it landed in, and a
  refill entry must name it too. The kernel cannot take an area back: it goes with the ifq.
- zcnet keeps one range per queue: the queue's area is opened with a capacity of address space
  (``area_capacity``: PROT_NONE, nothing behind it) and each added area is mapped right after
  the last (zcnet.rx.zc.area.Area.grow). A chunk's offset then stays an offset into that one
  range (the area table of zcnet.rx.zc.zcrx_rings.RefillRing turns an ``off`` into it), so
  chunks, views and the shares of every connection work unchanged; the shares grow with it.
- Not built: added areas for a queue handed to other processes (zcnet.rx.zc.zcrx_procs maps
  a memfd of fixed size there), hugetlb or dma-buf areas.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Protocol

from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.zcrx_reg import Registration, kernel_offers, memlock_error
from zcnet.rx.zc.zcrx_rings import RefillRing
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring

ADD_AREA_SINCE = "7.3"


class Growable(Protocol):
    """What add_area uses of a zcnet.rx.zc.zcrx_queue.ZcrxQueue (which calls it)."""

    area: Area
    reg: Registration
    rq: RefillRing
    ifq_id: int
    owner_tid: int
    where: str

    @property
    def closed(self) -> bool: ...

    @property
    def ring(self) -> Ring | None: ...


def add_area(zq: Growable, size: int) -> int:
    """Register ``size`` more bytes of area on ``zq`` (its owner thread); returns the kernel's
    id for the new area. Its buffers are shared by the queue's connections from now on."""
    if zq.closed:
        raise ClosedError.of(zq, "add_area")
    if threading.get_ident() != zq.owner_tid:
        raise UsageError(f"add_area() on {zq.where}'s zcrx queue from a thread that did not open "
                         "it (its ring is single-issuer)", "call it in the queue's thread")
    if not kernel_offers().add_area:
        raise Unsupported(f"this kernel's zcrx cannot add areas to a queue (ZCRX_CTRL_ADD_AREA, "
                          f"Linux {ADD_AREA_SINCE}+)", "open the queue with the area it needs")
    if zq.rq.shared:
        raise UsageError(f"{zq.where} is handed to other processes, whose mappings of its area "
                         "cannot grow: adding areas to it is not built",
                         "open the queue with the area it needs")
    area = zq.area
    if not area.capacity:
        raise UsageError(f"{zq.where}'s area was opened without room to grow",
                         "open it with area_capacity= (open_zcrx_queue), address space the "
                         "added areas are mapped into")
    # What is locked now: the registration's first area and region, and what grew since.
    grown = zq.area.size - int(zq.reg.area.len)
    if err := memlock_error(zq.reg.locked_bytes() + grown + size):
        raise err
    at = area.grow(size)  # UsageError for a size that is not whole pages or does not fit
    with contextlib.ExitStack() as undo:
        undo.callback(area.ungrow, at)
        reg = u.io_uring_zcrx_area_reg(addr=area.addr + at, len=size)
        ctrl = u.zcrx_ctrl(zcrx_id=zq.ifq_id, op=u.ZCRX_CTRL_ADD_AREA)
        u.zcrx_ctrl_add_area.from_buffer(ctrl, 24).area_ptr = ctypes.addressof(reg)
        ring = zq.ring
        assert ring is not None
        try:
            ring.register(u.IORING_REGISTER_ZCRX_CTRL, ctrl, 0)
        except OSError as e:
            raise ZcnetError(f"adding {size} bytes of area to {zq.where} failed: "
                             f"{e.strerror}") from None
        undo.pop_all()
    area_id = int(reg.rq_area_token) >> u.IORING_ZCRX_AREA_SHIFT
    zq.rq.add_area(area_id, at)
    return area_id
