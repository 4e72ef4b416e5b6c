"""The ring's shared memory: mapping the SQ ring, the CQ ring and the SQE array of an io_uring
fd, and the u32 views and word indices the ring's hot paths read and write."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from zcnet.uapi import io_uring as u
from zcnet.uring.mem import Mapping


class RingMemory:
    """The mappings of one io_uring fd and views over them.

    The mappings go into ``maps`` and the views into ``views`` as they are made (the caller's
    lists), so the caller releases whatever exists even when a later mmap fails.
    """

    def __init__(self, fd: int, p: u.io_uring_params, maps: list[Mapping],
                 views: list[memoryview]) -> None:
        cqe_size = 32 if p.flags & u.IORING_SETUP_CQE32 else 16
        sq_size = p.sq_off.array + p.sq_entries * 4
        cq_size = p.cq_off.cqes + p.cq_entries * cqe_size
        if p.features & u.IORING_FEAT_SINGLE_MMAP:
            sq_size = cq_size = max(sq_size, cq_size)
        sq = Mapping(sq_size, fd=fd, offset=u.IORING_OFF_SQ_RING)
        maps.append(sq)
        if p.features & u.IORING_FEAT_SINGLE_MMAP:
            cq = sq
        else:
            cq = Mapping(cq_size, fd=fd, offset=u.IORING_OFF_CQ_RING)
            maps.append(cq)
        sqe_size = 128 if p.flags & u.IORING_SETUP_SQE128 else 64
        sqes = Mapping(p.sq_entries * sqe_size, fd=fd, offset=u.IORING_OFF_SQES)
        maps.append(sqes)
        self.sq, self.cq, self.sqes = sq, cq, sqes

        sq_mv, cq_mv, sqes_mv = sq.memview(), cq.memview(), sqes.memview()
        self.sqm = sq_mv[:sq_size // 4 * 4].cast("I")  # u32 words of the SQ ring
        self.cqm = cq_mv[:cq_size // 4 * 4].cast("I")  # u32 words of the CQ ring
        self.sqes_mv = sqes_mv
        self.cqes_mv = cq_mv[p.cq_off.cqes:p.cq_off.cqes + p.cq_entries * cqe_size]
        views += [self.sqm, self.cqm, self.cqes_mv, sqes_mv, sq_mv, cq_mv]
        self.khead_i = p.sq_off.head // 4
        self.ktail_i = p.sq_off.tail // 4
        self.ksq_flags_i = p.sq_off.flags // 4
        self.kcq_head_i = p.cq_off.head // 4
        self.kcq_tail_i = p.cq_off.tail // 4
        self.sq_mask = self.sqm[p.sq_off.ring_mask // 4]
        self.cq_mask = self.cqm[p.cq_off.ring_mask // 4]
        # The SQ index array is the identity once: slot i always names SQE i.
        if not p.flags & u.IORING_SETUP_NO_SQARRAY:
            sq.view(np.uint32, p.sq_off.array, p.sq_entries)[:] = np.arange(p.sq_entries)
        self.sqe_size = sqe_size
        self.cqe_size = cqe_size


class CqAddresses(NamedTuple):
    """Raw addresses in a ring's shared memory, for compiled code that reaps its CQ itself
    (zcnet.aio._loopaccel's Router). They are valid until the ring is closed; whoever reads
    or writes through them must stop before that (and follows the ordering rules of this
    zcnet.uring.ring's docstring). Not for a CQE_MIXED ring (refused)."""

    cq_head: int   #: the CQ's u32 ``khead`` (the reader advances it)
    cq_tail: int   #: the CQ's u32 ``ktail`` (the kernel advances it)
    cqes: int      #: the first CQE of the CQ array
    cq_mask: int   #: ring index -> CQ array slot
    cqe_size: int  #: 16, or 32 with IORING_SETUP_CQE32
    sq_flags: int  #: the SQ ring's u32 flags word (IORING_SQ_TASKRUN, IORING_SQ_CQ_OVERFLOW)
