"""Reading the CQ of a ring set up with IORING_SETUP_CQE_MIXED (Linux 6.18): completions of 16
and 32 bytes in one array of 16-byte slots.

Some facts about that CQ (include/uapi/linux/io_uring.h): a 32-byte entry has IORING_CQE_F_32
in its flags and takes two slots; it never straddles the wrap: when one slot is left before
it, the kernel fills that slot with an IORING_CQE_F_SKIP entry, which carries nothing and is
stepped over. The kernel publishes both halves of an entry before moving ``ktail`` past them.

A reap hands the entries on widened to 32 bytes (a 16-byte entry's second half zero, pads
dropped), so whatever reads a reap (the zcrx parsers, the routers by user_data) sees a CQE32
ring's layout and needs no second code path. The price is that copy, which the compiled Core
makes in C (``cqes_widen`` in zcnet/_cqe.h, the twin of :func:`widen`).
"""

from __future__ import annotations

import struct
from typing import Protocol

from zcnet.errors import ClosedError
from zcnet.uapi import io_uring as u
from zcnet.uring.completions import Completions

SLOT = 16                   #: bytes per CQ slot of a mixed ring
_FLAGS = struct.Struct("<I")  # cqe->flags, at byte 12 of an entry
_CQE = struct.Struct("<QiI")
_ZERO = bytes(SLOT)
_F32, _SKIP = u.IORING_CQE_F_32, u.IORING_CQE_F_SKIP
_U32 = 0xFFFFFFFF


class Ring(Protocol):
    """What a reap reads of zcnet.uring.ring.Ring (which imports this module)."""

    fd: int
    cq_mask: int
    _cqm: memoryview    # u32 words of the CQ ring
    _cqes: memoryview   # the CQ array
    _kcq_head_i: int
    _kcq_tail_i: int


def reap(ring: Ring, max_n: int | None) -> Completions:
    """Ring.reap of a mixed ring: the ready entries (up to ``max_n``), widened."""
    cq = ring._cqm
    head = cq[ring._kcq_head_i]
    slots = (cq[ring._kcq_tail_i] - head) & _U32  # acquire of ktail (zcnet.uring.ring)
    try:
        raw, n, used = widen(ring._cqes, head, slots, ring.cq_mask, max_n)
        cq[ring._kcq_head_i] = (head + used) & _U32  # release: the copy above is done
    except ValueError:
        if ring.fd < 0:  # another thread closed the ring meanwhile: its views are released
            raise ClosedError.of(ring, "reap") from None
        raise
    return Completions.from_raw(raw, n, True)


def reap_one(ring: Ring, head: int) -> tuple[int, int, int] | None:
    """Ring.reap_one of a mixed ring, whose CQ head is ``head`` (the caller catches a
    closed ring's ValueError)."""
    cq = ring._cqm
    cqe, used = first(ring._cqes, head, (cq[ring._kcq_tail_i] - head) & _U32, ring.cq_mask)
    cq[ring._kcq_head_i] = (head + used) & _U32
    return cqe


def widen(cqes: memoryview, head: int, slots: int, mask: int,
          max_n: int | None = None) -> tuple[bytearray, int, int]:
    """The entries in the ``slots`` ready slots from ring index ``head`` (at most ``max_n``),
    as 32-byte entries: (raw, entries, slots used). The caller moves the head by the slots
    used once it is done with ``cqes``."""
    raw = bytearray()
    n = i = 0
    limit = slots if max_n is None else max(0, max_n)
    while i < slots and n < limit:
        off = ((head + i) & mask) * SLOT
        flags = _FLAGS.unpack_from(cqes, off + 12)[0]
        if flags & _SKIP:
            i += 1
            continue
        raw += cqes[off:off + SLOT]
        if flags & _F32:
            if i + 1 >= slots:  # half an entry: the kernel never publishes one
                del raw[-SLOT:]
                break
            tail_off = ((head + i + 1) & mask) * SLOT
            raw += cqes[tail_off:tail_off + SLOT]
            i += 2
        else:
            raw += _ZERO
            i += 1
        n += 1
    return raw, n, i


def first(cqes: memoryview, head: int, slots: int,
          mask: int) -> tuple[tuple[int, int, int] | None, int]:
    """The oldest entry's (user_data, res, flags), or None, and the slots it and the pads
    before it take."""
    i = 0
    while i < slots:
        cqe = _CQE.unpack_from(cqes, ((head + i) & mask) * SLOT)
        if cqe[2] & _SKIP:
            i += 1
            continue
        if cqe[2] & _F32:
            return (cqe, i + 2) if i + 1 < slots else (None, i)
        return cqe, i + 1
    return None, i
