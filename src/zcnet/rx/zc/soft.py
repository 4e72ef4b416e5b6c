"""Provider "soft": zero-copy semantics on any kernel with provided buffer rings.

A soft provider is a :class:`~zcnet.rx.zc.soft_group.SoftGroup` (the multishot RECV on a
provided-buffer group, and its round) on a ring of its own; soft_group.py has the facts.
"""

from __future__ import annotations

import contextlib
import errno

from zcnet.errors import ClosedError, ZcnetError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import (
    BGID,
    RECV_UD,
    RING_FLAGS,
    SOFT_COPIES,
    CopyCount,
    Delivery,
    IntSeq,
    ProviderBase,
    buffer_count,
    build_or_close,
    close_ring,
    reap_ready,
    soft_ring_flags,
)
from zcnet.rx.zc.soft_group import SoftGroup
from zcnet.rx.zc.soft_inc import IncrementalSoftProvider
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing
from zcnet.uring.ring import Ring


def bundles(ring: Ring, bundle: bool | None) -> bool:
    """Whether a group on ``ring`` receives with bundles: as asked, else when the kernel has
    them (IORING_FEAT_RECVSEND_BUNDLE)."""
    return bool(ring.features & u.IORING_FEAT_RECVSEND_BUNDLE) if bundle is None else bundle


class SoftProvider(ProviderBase):
    """The soft provider: a SoftGroup on a ring of its own."""

    name = "soft"

    def __init__(self, fd: int, area: Area, buf_size: int, *, bundle: bool | None = None) -> None:
        self.area = area
        entries = buffer_count(area.size, buf_size)
        self.note = f"{entries} buffers of {buf_size} bytes"
        # Enough CQ room for one CQE per buffer plus the final ones, so a full ring of
        # completions never overflows the CQ (an overflow would end the multishot).
        ring = Ring(64, flags=soft_ring_flags(), cq_entries=max(64, 2 * entries))
        with contextlib.ExitStack() as undo:
            undo.callback(ring.close)
            buf = BufRing(ring, BGID, entries, buf_size, area=area.mapping)
            undo.callback(buf.close)
            #: The receive itself (public: a test or a replay reads its buffer ring).
            self.group = SoftGroup(fd, area, buf_size, ring, buf, bundle=bundles(ring, bundle),
                                   round_cqes=ring.cq_entries)
            undo.pop_all()
        self._ring: Ring | None = ring

    @property
    def ring(self) -> Ring | None:
        return self._ring

    @property
    def buf(self) -> BufRing:
        """The provided-buffer ring (closed with the provider)."""
        return self.group.buf

    @property
    def buf_size(self) -> int:
        return self.group.buf_size

    @property
    def entries(self) -> int:
        return self.group.entries

    @property
    def bundle(self) -> bool:
        return self.group.bundle

    def _open(self, method: str) -> SoftGroup:
        if self._ring is None:  # closed: the ring and the buffer ring are unmapped
            raise ClosedError.of(self, method)
        return self.group

    def can_arm(self) -> bool:
        return self._open("can_arm").buf.in_ring > 0

    def arm(self) -> None:
        self._open("arm").arm()

    def reap(self, timeout: float | None) -> Delivery:
        ring = self._ring
        if ring is None:
            raise ClosedError.of(self, "reap")
        return self.group.round(reap_ready(ring, timeout))

    def recycle(self, tokens: IntSeq, lengths: IntSeq) -> None:
        if self._ring is None:
            raise ClosedError.of(self, "recycle")
        self.group.recycle(tokens)

    def extra_stats(self) -> dict[str, int]:
        d = self.group.stats()
        if self._ring is None:
            d["in_ring"] = 0
        return d

    def kernel_copy(self) -> CopyCount:
        return CopyCount(None, SOFT_COPIES, every_byte=True)

    def quiesce(self, armed: bool) -> bool:
        """Cancel the receive ahead of close: Receiver.close then gives back what was released
        with nothing left to fill it, so the group is whole at close (a loop's shared ring
        keeps such a group for the next receiver, zcnet.aio.shared)."""
        return not armed or self._open("quiesce").cancel()

    def close(self, armed: bool = False) -> bool:
        ring, self._ring = self._ring, None
        if ring is None:
            return not armed
        return close_ring(ring, armed, self.group.buf.close)


def open_soft(fd: int, area_size: int, buf_size: int, *, hugetlb: bool = False,
              bundle: bool | None = None, incremental: bool = False,
              dmabuf_fd: int | None = None) -> SoftProvider | IncrementalSoftProvider:
    """The soft provider; ``incremental`` fills big buffers receive after receive
    (IOU_PBUF_RING_INC, see soft_inc), falling back to whole buffers on kernels without it."""
    area = Area(area_size, hugetlb=hugetlb, dmabuf_fd=dmabuf_fd)

    def build() -> SoftProvider | IncrementalSoftProvider:
        if area.addr == 0:
            raise ZcnetError("the soft provider needs a dma-buf the CPU can map",
                             "use zcrx/devmem for device memory, or omit dmabuf_fd")
        if incremental:
            try:
                return IncrementalSoftProvider(fd, area, buf_size)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        return SoftProvider(fd, area, buf_size, bundle=bundle)

    return build_or_close(build, area.close)


__all__ = ["RECV_UD", "RING_FLAGS", "SoftProvider", "buffer_count", "open_soft"]
