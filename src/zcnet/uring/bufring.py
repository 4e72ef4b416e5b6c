"""Provided buffer rings (IORING_REGISTER_PBUF_RING), registered buffers, and the opcode probe.

Some facts about provided buffer rings: the ring is an array of ``io_uring_buf`` {addr, len, bid}
whose entry 0 also carries the u16 tail in its ``resv`` field. We publish buffers by writing
entries at ``tail & mask`` and then storing the tail; the kernel consumes entries in ring order
from its private head. So the buffers a CQE consumed are always the next ones in ring order:
with bundles one CQE may consume several, and we find their ids from the entries we published,
indexed by our own copy of the head (the kernel writes an entry's addr and len, never its bid,
so the bid column is our record). Recycling is a few slice writes per batch, no per-buffer loop.

Some facts about incremental consumption (IOU_PBUF_RING_INC, Linux 6.12+):

- the kernel does not retire a buffer after one receive: it advances the head entry's addr/len
  by the bytes it used and puts the next receive right behind them. The CQE carries the buffer id
  and IORING_CQE_F_BUF_MORE while the kernel will write more into that buffer; a CQE without it
  means the kernel is done with the buffer (its head moved past it);
- the CQE does not say where in the buffer the data went, so we keep each buffer's fill position
  (reset when the buffer is provided again);
- without bundles a receive never spans buffers, and buffers still retire in ring order, so the
  same record of published bids checks that we are in step with the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable

import numpy as np

from zcnet.errors import ClosedError
from zcnet.uapi import io_uring as u
from zcnet.uring.completions import Completions
from zcnet.uring.mem import Mapping
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import accel_for

_TAIL_U16 = u.io_uring_buf.resv.offset // 2  # tail lives in entry 0's resv
#: A compiled round take_round runs (zcnet.rx.zc._rxaccel.soft_round): given the CQEs' copy,
#: their count and size, the request, the CQE flags it reads, and the ring's entries, head,
#: buffer size and base, it returns (records, count, final) or None.
RoundParser = Callable[..., "tuple[bytes, int, int | None] | None"]


class BufRing:
    """``entries`` buffers of ``buf_size`` bytes in one area, published to buffer group ``bgid``.

    ``incremental`` registers the ring with IOU_PBUF_RING_INC: completions are then accounted
    with ``filled`` (one per CQE) instead of ``consumed``.

    After ``close()``, or once its Ring is closed, every method but ``close`` raises
    ClosedError: the ring entries are unmapped (and the registration is gone).
    """

    # The fields a compiled round reads and writes in place (it is handed the ring once, see
    # zcnet.rx.zc.core): ``head`` is our copy of the kernel's consumption point, ``tail``
    # what we published, ``in_ring`` the buffers the kernel may still fill, ``registered``
    # False once closed. The rest lives in the instance dict.
    __slots__ = ("__dict__", "__weakref__", "head", "in_ring", "registered", "tail")

    def __init__(self, ring: Ring, bgid: int, entries: int, buf_size: int, *,
                 area: Mapping | None = None, area_offset: int = 0,
                 incremental: bool = False) -> None:
        if entries <= 0 or entries & (entries - 1) or entries > 32768:
            raise ValueError("buffer ring entries must be a power of two <= 32768")
        self.registered = False
        if ring.closed:
            raise ClosedError("cannot register a buffer ring on a closed io_uring")
        self.ring, self.bgid, self.entries, self.buf_size = ring, bgid, entries, buf_size
        self.incremental = incremental
        self.mask = entries - 1
        self._own_area = area is None
        self.area = area or Mapping.anonymous(entries * buf_size)
        self.area_offset = area_offset
        self.base = self.area.addr + area_offset
        self._mem = Mapping.anonymous(entries * ctypes.sizeof(u.io_uring_buf))
        with contextlib.ExitStack() as undo:
            undo.callback(self._release_memory)  # unless the kernel took the ring
            reg = u.io_uring_buf_reg(ring_addr=self._mem.addr, ring_entries=entries, bgid=bgid,
                                     flags=u.IOU_PBUF_RING_INC if incremental else 0)
            ring.register(u.IORING_REGISTER_PBUF_RING, reg, 1)
            undo.pop_all()
        self.registered = True
        #: Where the ring's entries are (a compiled round writes them).
        self.entries_addr = self._mem.addr
        self._addr = self._mem.view(np.uint64, 0, entries * 2).reshape(entries, 2)[:, 0]
        self._len = self._mem.view(np.uint32, 0, entries * 4).reshape(entries, 4)[:, 2]
        self._bid = self._mem.view(np.uint16, 0, entries * 8).reshape(entries, 8)[:, 6]
        self._ktail = self._mem.view(np.uint16, 0, 8)
        # The same entries through memoryview casts, for provide_few's element stores (a
        # memoryview item store costs a third of a numpy one): entry i's addr is u64 2i, its
        # len u32 4i+2, its bid u16 8i+6.
        mv = self._mem.memview()
        self._mv64, self._mv32, self._mv16 = mv.cast("Q"), mv.cast("I"), mv.cast("H")
        # The batch writes and the in-step check in one C call each (None: the numpy path),
        # as the ring's backend says; providers read it too for their own choices. The C calls
        # get the entries as ``mv`` only after the same open checks as the numpy path.
        self._mv = mv
        self.accel = accel_for(ring.backend)
        self.tail = 0
        self.head = 0  # our copy of the kernel's consumption point
        # area address of each buffer id, so publishing is one take per batch
        self._addr_of = np.uint64(self.base) + np.arange(entries, dtype=np.uint64) * np.uint64(
            buf_size)
        # incremental: bytes the kernel has written into each buffer (a list: read per CQE)
        self._pos = [0] * entries if incremental else None
        self.in_ring = 0  # buffers the kernel may still fill
        self.provide(np.arange(entries, dtype=np.uint16))

    def _check_open(self) -> None:
        if not self.registered:
            raise ClosedError("the buffer ring is closed")
        if self.ring.fd < 0:
            raise ClosedError("the buffer ring's io_uring is closed, and its registration with it")

    def buffer(self, bid: int, length: int | None = None) -> np.ndarray:
        """The bytes of buffer ``bid`` as a uint8 view into the area."""
        self._check_open()
        if not 0 <= bid < self.entries:
            raise ValueError(f"buffer id {bid} is outside 0..{self.entries - 1}")
        if length is not None and not 0 <= length <= self.buf_size:
            raise ValueError(f"length {length} is outside 0..{self.buf_size}")
        return self.area.view(np.uint8, self.area_offset + bid * self.buf_size,
                               self.buf_size if length is None else length)

    def _spans(self, start: int, n: int) -> tuple[tuple[int, int], ...]:
        """Ring index ranges [lo, hi) of ``n`` entries from ``start``: one, or two where the
        ring wraps."""
        lo = start & self.mask
        hi = lo + n
        if hi <= self.entries:
            return ((lo, hi),)
        return ((lo, self.entries), (0, hi - self.entries))

    def provide(self, bids: np.ndarray | list[int]) -> None:
        """Give buffers (back) to the kernel: slice writes of the entries, then one tail store."""
        if not self.registered or self.ring.fd < 0:
            self._check_open()
        n = len(bids)
        if n == 0:
            return
        if self.in_ring + n > self.entries:
            raise ValueError("more buffers provided than the ring holds (double release?)")
        if self.accel is not None and self._pos is None:
            t = self.accel.buf_provide(self._mv, self.entries, self.tail, bids, self.base,
                                         self.buf_size)
            if t is not None:
                self.tail = t
                self.in_ring += n
                return
        bids = np.asarray(bids, dtype=np.uint16)
        k = 0
        for lo, hi in self._spans(self.tail, n):
            part = bids[k:k + hi - lo]
            self._addr[lo:hi] = self._addr_of.take(part)  # IndexError: an id outside the ring
            self._len[lo:hi] = self.buf_size  # the kernel may have shortened it (bundles, inc)
            self._bid[lo:hi] = part
            k += hi - lo
        if self._pos is not None:
            pos = self._pos
            for b in np.asarray(bids).tolist():
                pos[b] = 0
        self.tail = (self.tail + n) & 0xFFFF
        self.in_ring += n
        self._ktail[_TAIL_U16] = self.tail  # release: entries above are written first

    def provide_few(self, bids: list[int]) -> None:
        """``provide`` for a few ids in a list: element stores, no numpy call, which costs more
        than the work itself for a handful of buffers (request/response traffic)."""
        if not self.registered or self.ring.fd < 0:
            self._check_open()
        n = len(bids)
        if self.in_ring + n > self.entries:
            raise ValueError("more buffers provided than the ring holds (double release?)")
        m64, m32, m16 = self._mv64, self._mv32, self._mv16
        mask, size, pos, base, entries = (self.mask, self.buf_size, self._pos, self.base,
                                          self.entries)
        t = self.tail
        for b in bids:
            if not 0 <= b < entries:
                raise IndexError(f"buffer id {b} is outside 0..{entries - 1}")
            i = t & mask
            m64[2 * i] = base + b * size
            m32[4 * i + 2] = size
            m16[8 * i + 6] = b
            t += 1
            if pos is not None:
                pos[b] = 0
        self.tail = t & 0xFFFF
        self.in_ring += n
        self._ktail[_TAIL_U16] = self.tail  # release: entries above are written first

    def _next(self, count: int) -> tuple[tuple[int, int], ...]:
        """Where the next ``count`` buffers in ring order are (whole-buffer accounting): the
        ones the kernel consumed, if we are in step with it. Checks, then ``_spans``."""
        if not self.registered or self.ring.fd < 0:
            self._check_open()
        if self.incremental:
            raise ValueError("an incremental buffer ring is accounted with filled()")
        if count > self.in_ring:
            raise RuntimeError(f"buffer ring out of step: {count} buffers consumed, "
                               f"{self.in_ring} were in the ring")
        return self._spans(self.head, count)

    def _retire(self, count: int) -> None:
        self.head = (self.head + count) & 0xFFFF
        self.in_ring -= count

    def take(self, bids: np.ndarray) -> None:
        """Account completions that consumed exactly the buffers ``bids`` (one whole buffer
        each, no bundles): they must be the next ones in ring order."""
        n = len(bids)
        spans = self._next(n)
        if self.accel is not None:
            ok = self.accel.buf_in_step(self._mv, self.entries, self.head, bids)
        else:
            ok = (b"".join([self._bid[lo:hi].tobytes() for lo, hi in spans])
                  == np.asarray(bids, np.uint16).tobytes())
        if not ok:
            raise RuntimeError("buffer ring out of step with completions")
        self._retire(n)

    def take_round(self, c: Completions, user_data: int, parse: RoundParser | None
                   ) -> tuple[bytes, int, int | None] | None:
        """A round of CQEs (their copy in ``c``) that each filled one buffer of request
        ``user_data``, the next ones in ring order, checked by ``parse`` (the receive core's
        compiled round, zcnet.rx.zc._rxaccel.soft_round, handed the ring's entries) and
        accounted here. The last may end the multishot (no F_MORE). Returns ``parse``'s
        records (bytes), their count and that last CQE's res if it ended the multishot (else
        None); None when the round is anything else or ``parse`` is None: then nothing is
        accounted and the caller takes its own path. ClosedError once the ring is closed, as
        every method."""
        if not self.registered or self.ring.fd < 0:
            self._check_open()
        raw, n = c.raw, len(c)
        if parse is None or raw is None or self.incremental or n > self.in_ring:
            return None
        got = parse(raw, n, c.cqe_size, user_data, u.IORING_CQE_F_MORE, u.IORING_CQE_F_BUFFER,
                    u.IORING_CQE_BUFFER_SHIFT, self._mv, self.entries, self.head,
                    self.buf_size, self.area_offset)
        if got is None:
            return None
        self._retire(got[1])
        return got

    def _consume(self, nbytes: int, first_bid: int) -> tuple[tuple[int, int], ...]:
        """Retire the buffers a completion of ``nbytes`` from ``first_bid`` consumed; where
        their ids are in the ring."""
        count = max(1, -(-nbytes // self.buf_size))
        spans = self._next(count)
        expected = int(self._bid[spans[0][0]])
        if expected != first_bid:
            raise RuntimeError(f"buffer ring out of step: expected bid {expected}, "
                               f"got {first_bid}")
        self._retire(count)
        return spans

    def consumed(self, nbytes: int, first_bid: int) -> np.ndarray:
        """Buffer ids a completion of ``nbytes`` consumed starting at ``first_bid`` (bundles)."""
        return np.concatenate([self._bid[lo:hi] for lo, hi in self._consume(nbytes, first_bid)])

    def consumed_ids(self, nbytes: int, first_bid: int) -> list[int]:
        """``consumed`` as a list, with no numpy arithmetic: for rounds of a few completions,
        where a handful of list operations beat numpy's per-call cost."""
        if nbytes <= self.buf_size and self.registered and self.ring.fd >= 0 \
                and not self.incremental and self.in_ring:
            # One buffer (every completion without bundles): the checks of _consume, inline.
            head = self.head
            expected = int(self._bid[head & self.mask])
            if expected != first_bid:
                raise RuntimeError(f"buffer ring out of step: expected bid {expected}, "
                                   f"got {first_bid}")
            self.head = (head + 1) & 0xFFFF
            self.in_ring -= 1
            return [first_bid]
        bids: list[int] = []
        for lo, hi in self._consume(nbytes, first_bid):
            bids += self._bid[lo:hi].tolist()
        return bids

    def took(self, n: int) -> None:
        """``n`` buffers left the ring, each named by its own completion: a group shared by
        several receives whose completions are read per receive, not in CQ order
        (zcnet.aio.pool; one buffer per completion, no bundles). Our head is not followed."""
        if not self.registered or self.ring.fd < 0:
            self._check_open()
        if n > self.in_ring:
            raise RuntimeError(f"buffer ring out of step: {n} buffers taken, {self.in_ring} "
                               "were in it")
        self.in_ring -= n

    def filled(self, nbytes: int, bid: int, more: bool) -> int:
        """Incremental mode: a completion wrote ``nbytes`` into buffer ``bid`` right behind its
        earlier data; returns where in the buffer they start. ``more`` is the CQE's
        IORING_CQE_F_BUF_MORE: without it the kernel is done with the buffer, which leaves the
        ring until it is provided again."""
        if not self.registered or self.ring.fd < 0:
            self._check_open()
        pos = self._pos
        if pos is None:
            raise ValueError("filled() is for incremental buffer rings; use consumed()")
        at = pos[bid]
        if at + nbytes > self.buf_size:
            raise RuntimeError(f"buffer ring out of step: {nbytes} bytes past the end of bid {bid}")
        pos[bid] = at + nbytes
        if not more:
            expected = int(self._bid[self.head & self.mask])
            if expected != bid:
                raise RuntimeError(
                    f"buffer ring out of step: expected bid {expected} to retire, got {bid}")
            self.head = (self.head + 1) & 0xFFFF
            self.in_ring -= 1
        return at

    def kernel_head(self) -> int:
        """The kernel's consumption point, a u16 (IORING_REGISTER_PBUF_STATUS, Linux 6.8+;
        OSError before). Equal to ``head`` when we have seen every buffer it took."""
        self._check_open()
        st = u.io_uring_buf_status(buf_group=self.bgid)
        self.ring.register(u.IORING_REGISTER_PBUF_STATUS, st, 1)
        return int(st.head)

    def _release_memory(self) -> None:
        self._mem.close()
        if self._own_area:
            self.area.close()

    def close(self) -> None:
        """Unregister and unmap; idempotent."""
        if not self.registered:
            return
        try:
            if self.ring.fd >= 0:
                reg = u.io_uring_buf_reg(bgid=self.bgid)
                self.ring.register(u.IORING_UNREGISTER_PBUF_RING, reg, 1)
        finally:  # the kernel pinned the ring's pages, so unmapping is safe either way
            self.registered = False
            self._release_memory()

    @property
    def closed(self) -> bool:
        return not self.registered

    def __enter__(self) -> BufRing:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _iovec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


def register_buffers(ring: Ring, buffers: list[tuple[int, int]]) -> None:
    """Register (address, length) pairs as fixed buffers 0..n-1."""
    iovs = (_iovec * len(buffers))(*(_iovec(a, n) for a, n in buffers))
    ring.register(u.IORING_REGISTER_BUFFERS, iovs, len(buffers))


def unregister_buffers(ring: Ring) -> None:
    ring.register(u.IORING_UNREGISTER_BUFFERS, None, 0)


def probe(ring: Ring | None = None) -> frozenset[int]:
    """Opcodes this kernel supports (IORING_REGISTER_PROBE)."""
    own = ring is None
    r = ring or Ring(2)
    try:
        nops = u.IORING_OP_LAST + 64
        buf = (ctypes.c_uint8 * (ctypes.sizeof(u.io_uring_probe)
                                 + nops * ctypes.sizeof(u.io_uring_probe_op)))()
        r.register(u.IORING_REGISTER_PROBE, buf, nops)
        head = u.io_uring_probe.from_buffer(buf)
        ops = (u.io_uring_probe_op * head.ops_len).from_buffer(buf, ctypes.sizeof(head))
        return frozenset(o.op for o in ops if o.flags & u.IO_URING_OP_SUPPORTED)
    finally:
        if own:
            r.close()


def unsupported(*ops: int) -> str | None:
    """Why io_uring (or one of ``ops``) cannot be used here, or None when all are available."""
    try:
        have = probe()
    except OSError as e:
        return f"io_uring unavailable: {e.strerror} (kernel.io_uring_disabled or seccomp?)"
    missing = [u.OP_NAMES.get(op, str(op)) for op in ops if op not in have]
    return f"kernel lacks io_uring op(s) {', '.join(missing)}" if missing else None
