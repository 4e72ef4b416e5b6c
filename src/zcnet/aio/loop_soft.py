"""The soft provider on an event loop's shared ring (zcnet.aio.shared): its buffer group and
area registered there, its receive a SoftGroup (zcnet.rx.zc.soft_group) whose completions come
through its member's inbox."""

from __future__ import annotations

import contextlib

from zcnet.aio.looptypes import Loop
from zcnet.aio.shared import MemberRing, loop_ring
from zcnet.errors import ClosedError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import (
    SOFT_COPIES,
    CopyCount,
    Delivery,
    IntSeq,
    ProviderBase,
    buffer_count,
    reap_ready,
)
from zcnet.rx.zc.soft import bundles
from zcnet.rx.zc.soft_group import SoftGroup
from zcnet.uring.bufring import BufRing


class OnLoopRing(ProviderBase):
    """A provider whose receive runs on the loop's shared ring: a SoftGroup (zcnet.rx.zc.
    soft_group) whose requests go through its ``member``; its completions come through the
    member's inbox, and a task or transport waits on the member."""

    name = "soft"
    member: MemberRing
    group: SoftGroup

    @property
    def ring(self) -> None:
        return None  # the loop's, shared: the member's inbox is where its completions go

    def extra_stats(self) -> dict[str, int]:
        return self.group.stats()

    def kernel_copy(self) -> CopyCount:
        return CopyCount(None, SOFT_COPIES, every_byte=True)


class SharedSoftProvider(OnLoopRing):
    """The soft provider with its buffer group (and area) of its own on the loop's ring."""

    def __init__(self, fd: int, area: Area, buf_size: int, member: MemberRing, *,
                 buf: BufRing | None = None, reuse: bool = True) -> None:
        entries = buffer_count(area.size, buf_size)
        self.area = area
        self.member = member
        self.note = f"{entries} buffers of {buf_size} bytes, on the loop's shared io_uring"
        ring = member.lr.ring
        with contextlib.ExitStack() as undo:
            if buf is None:
                buf = BufRing(ring, member.bgid, entries, buf_size, area=area.mapping)
                undo.callback(buf.close)
            # A shared ring's round of one receiver holds at most a CQE per buffer plus the
            # final one.
            self.group = SoftGroup(fd, area, buf_size, member, buf, bundle=bundles(ring, None),
                                   round_cqes=2 * entries + 8)
            undo.pop_all()
        #: The Receiver hands the area back through ``retire_area`` (not a debug receiver),
        #: so a settled buffer group may stay registered with it for the next receiver.
        self.reuse = reuse
        self._kept: BufRing | None = None  # that group, between close and retire_area
        self._closed = False
        self._live = False  # closed with a receive whose cancel the kernel did not confirm

    def _check(self, method: str) -> SoftGroup:
        if self._closed:
            raise ClosedError.of(self, method)
        return self.group

    def can_arm(self) -> bool:
        return self._check("can_arm").buf.in_ring > 0

    def arm(self) -> None:
        self._check("arm").arm()

    def reap(self, timeout: float | None) -> Delivery:
        """A pass of a few CQEs arrives as (user_data, res, flags) tuples: the round takes
        them as they are, with no arrays built and taken apart."""
        g = self._check("reap")
        m = self.member
        box = m.inbox
        if len(box) == 1 and type(box[0]) is list:
            m.inbox = []
            return g.round(box[0])
        return g.round(reap_ready(m, timeout))  # type: ignore[arg-type]

    def recycle(self, tokens: IntSeq, lengths: IntSeq) -> None:
        self._check("recycle").recycle(tokens)

    def quiesce(self, armed: bool) -> bool:
        return not armed or self._check("quiesce").cancel()

    def retire_area(self, area: Area) -> None:
        """The Receiver's ``area_done``: the area goes to the loop's spares, unless a receive
        whose cancel was not confirmed may still write to it (then it is unmapped)."""
        buf, self._kept = self._kept, None
        if self._live:
            area.close()
        else:
            self.member.lr.keep_area(area, buf)

    def close(self, armed: bool = False) -> bool:
        if self._closed:
            return not self._live
        self._closed = True
        self._live = armed  # until the cancel says otherwise (Ctrl-C in its wait: unknown)
        with contextlib.ExitStack() as undo:  # the group (unless kept), then the member
            undo.callback(self.member.close)
            undo.callback(self._drop_group)
            if armed:
                self._live = not self.group.cancel()
            if self.reuse and not self._live and self.member.lr.settled(self.group.buf):
                self._kept = self.group.buf  # still registered: retire_area keeps it
        return not self._live

    def _drop_group(self) -> None:
        if self._kept is not None:
            return
        self.group.buf.close()  # raises when the kernel refuses: then the id stays unused
        # A receive whose cancel was not confirmed may still pick buffers from its group id:
        # that id is never given to another receiver. A kept group's id goes with it.
        if not self._live:
            self.member.lr.free_bgid(self.member.bgid)


def open_shared_soft(loop: Loop, fd: int, area_size: int, buf_size: int, hugetlb: bool,
                     reuse: bool = True) -> SharedSoftProvider:
    """A soft provider on ``loop``'s shared ring (opened now if this is its first member), on
    a kept area (and its registered group) where one fits; ``reuse``: see SharedSoftProvider."""
    lr = loop_ring(loop)
    spare = lr.spare_area(area_size, hugetlb, buf_size)
    area, buf = spare or (None, None)
    with contextlib.ExitStack() as undo:  # on failure (a bad buf_size, no id left): undone
        if spare is not None:
            undo.callback(lr.keep_area, area, buf)  # the spare goes back, with its group
        m = lr.join(None if buf is None else buf.bgid)
        if buf is None:  # a new id (a kept group's goes with it)
            undo.callback(lr.free_bgid, m.bgid)
        undo.callback(m.close)
        if area is None:
            area = Area(area_size, hugetlb=hugetlb)
            undo.callback(area.close)
        p = SharedSoftProvider(fd, area, buf_size, m, buf=buf, reuse=reuse)
        undo.pop_all()
    return p
