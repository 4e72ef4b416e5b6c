"""What every ring that holds one zcrx ifq shares (``IfqMemory``), what a device queue keeps for
itself (``device_reserve``), and where each thread finds its queues (``QueueRegistry``): the
parts of zcrx_queue.py that know no queue object."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Generic, TypeVar

from zcnet.errors import ZcnetError
from zcnet.nic import ethtool
from zcnet.nic.device import Device
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.zcrx_reg import Registration
from zcnet.uring.mem import Mapping

# Buffers a device's page pool keeps besides its RX ring: its alloc cache (PP_ALLOC_CACHE_SIZE,
# include/net/page_pool/types.h). Held by no connection, so kept out of the shares.
PP_ALLOC_CACHE_SIZE = 128


def device_reserve(ifname: str) -> int:
    """Buffers a device queue keeps to receive into: its RX ring (ethtool rings "rx") and the
    page pool's cache. Without the ring size (no ethtool rings), the cache only."""
    try:
        with Device.open(ifname) as dev:
            ring = int(ethtool.rings_get(dev).get("rx", 0))
    except (ZcnetError, OSError):
        ring = 0
    return ring + PP_ALLOC_CACHE_SIZE


class IfqMemory:
    """What every ring holding one ifq shares (the registering queue and the queues of threads
    that imported it): the registration (whose region holds the refill ring), the area, the
    count of connections (the shares split the area over all of them) and the lock that
    serialises refill-ring writers (the kernel does not order several producers). The
    region and area stay mapped until the last holder is done with them."""

    def __init__(self, reg: Registration, area: Area) -> None:
        self.reg = reg
        self.area = area
        self.region_map: Mapping | None = None  # a kernel region, mapped through a ring fd
        self.lock = threading.Lock()
        self.starved = False  # a receive stopped with -ENOMEM: arm again only after a flush
        self.members = 0      # connections on every ring of the ifq
        self.holders = 1      # queues (rings) holding the ifq
        self.area_users = 1   # those queues, then one per member until its chunks are back
        #: Buffers released after their connection (or its whole queue) closed, from any
        #: thread: back through the refill ring at the next enter of any queue on the ifq.
        self.closed_tokens: list[list[int]] = []

    def count(self, delta: int) -> None:
        """A connection joined (+1) or left (-1); the caller holds ``lock``."""
        self.members += delta

    @property
    def gone(self) -> bool:
        """No ring holds the ifq any more: the kernel took every buffer back with it."""
        return self.holders == 0

    def release(self) -> None:
        """A queue closed its ring: the last one unmaps the region."""
        with self.lock:
            self.holders -= 1
            last = self.holders == 0
        if last:
            region, self.region_map = self.region_map, None
            with contextlib.ExitStack() as undo:
                undo.callback(self.reg.release)
                if region is not None:
                    region.close()

    def area_done(self) -> None:
        with self.lock:
            self.area_users -= 1
            last = self.area_users == 0
        if last:
            self.area.close()


T = TypeVar("T")


def queue_key(ifindex: int, queue: int) -> tuple[int, ...]:
    """A device queue as seen from this thread's network namespace; ``ifindex`` 0: copy mode."""
    if not ifindex:
        return (0,)
    return (os.stat("/proc/thread-self/ns/net").st_ino, ifindex, queue)


class QueueRegistry(Generic[T]):
    """Each thread's open queues by key (a queue's ring is single-issuer, so a connection joins
    its own thread's), and which thread registered each device queue (an EEXIST from another
    thread of this process is then told apart from another program's binding)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.owners: dict[tuple[int, ...], int] = {}

    def mine(self) -> dict[tuple[int, ...], T]:
        try:
            return self._local.queues  # type: ignore[no-any-return]
        except AttributeError:
            self._local.queues = {}
            return self._local.queues  # type: ignore[no-any-return]

    def add(self, key: tuple[int, ...], q: T, *, own: bool) -> None:
        """``q`` is this thread's queue for ``key``; ``own``: it registered the ifq."""
        self.mine().setdefault(key, q)
        if own:
            self.owners.setdefault(key, threading.get_ident())

    def remove(self, key: tuple[int, ...], q: T) -> None:
        if self.mine().get(key) is q:
            del self.mine()[key]
            if self.owners.get(key) == threading.get_ident():
                del self.owners[key]
