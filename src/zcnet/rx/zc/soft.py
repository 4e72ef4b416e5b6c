"""Provider "soft": zero-copy semantics on any kernel with provided buffer rings.

Some facts about multishot RECV with a provided buffer ring:

- the registered area is carved into ``entries`` buffers of ``buf_size`` bytes; buffer id ``bid``
  lives at area offset ``bid * buf_size``, so the id is the token and the offset follows from it;
- one armed RECV keeps posting CQEs (F_MORE set) until the ring runs dry (final CQE -ENOBUFS),
  the peer closes (res 0), the socket fails (-errno), or a CQE cannot be posted (final CQE
  without F_MORE): the first is exhaustion, the last asks for a re-arm;
- with IORING_RECVSEND_BUNDLE one CQE may fill several buffers, always the next ones in ring
  order, each full except the last;
- the kernel copies into the buffers (it is "soft"), but from there on the application reads
  them in place and hands them back, exactly as with zcrx: everything above is the same code.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from typing import Any

import numpy as np

from zcnet.errors import ClosedError, ZcnetError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import (
    BGID,
    CANCEL_UD,
    RECV_UD,
    RING_FLAGS,
    SOFT_COPIES,
    CopyCount,
    Delivery,
    buffer_count,
    build_or_close,
    cancel_multishot,
    close_ring,
    note_final,
    reap_ready,
)
from zcnet.rx.zc.provider import SOFT_STOPS as STOPS
from zcnet.rx.zc.soft_inc import IncrementalSoftProvider
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing
from zcnet.uring.prep import prep_recv_multishot
from zcnet.uring.ring import Ring

_maximum = np.maximum.reduce
# Rounds of at most this many CQEs take the plain-Python path, whose cost grows per CQE, where
# the vectorized one's is mostly fixed. With warm caches (zc_replay) they cross at 3-4 CQEs with
# the compiled ring writes (zcnet.uring._accel) and at about 8 on the pure path. On real
# traffic the kernel's copy has just evicted numpy's code and data: with the crossover at 3,
# zc_rx's soft-zc (rounds of 1-3 CQEs) took 33 ms of user CPU per GiB instead of 15. So the
# thresholds sit at about twice the warm crossover.
FEW = 8
FEW_PURE = 16


class SoftProvider:
    name = "soft"
    # Slots for what zcnet.aio._loopaccel reads and writes every pass (in place, no dict lookup);
    # the rest lives in the instance dict.
    __slots__ = ("__dict__", "__weakref__", "_buf", "armed")

    def __init__(self, fd: int, area: Area, buf_size: int, *, bundle: bool | None = None) -> None:
        self._init_buffers(fd, area, buf_size)
        # Enough CQ room for one CQE per buffer plus the final ones, so a full ring of
        # completions never overflows the CQ (an overflow would end the multishot).
        ring = Ring(64, flags=RING_FLAGS, cq_entries=max(64, 2 * self.entries))
        build_or_close(lambda: self._attach(ring, BGID, bundle=bundle), ring.close)

    def _attach(self, ring: Ring, bgid: int, requests: Any = None,
                bundle: bool | None = None, buf: BufRing | None = None) -> None:
        """Register the buffer group ``bgid`` on ``ring``, or take ``buf``, a group already
        registered there over this area with every buffer in it. Requests and completions go
        through ``requests``: ``ring`` itself, or a view of a ring shared with other providers
        (an event loop's, zcnet.aio.shared: local user_data, the slice of Ring used here)."""
        self._ring = ring if requests is None else requests
        # RECV_UD as the user_data of a full round: the hot path compares bytes with it. A
        # shared ring's round of one provider holds at most a CQE per buffer plus the final one.
        n = ring.cq_entries if requests is None else 2 * self.entries + 8
        self._ud_ok = np.full(n, RECV_UD, np.uint64).tobytes()
        self.bundle = (bool(ring.features & u.IORING_FEAT_RECVSEND_BUNDLE)
                       if bundle is None else bundle)
        self._buf = buf or BufRing(ring, bgid, self.entries, self.buf_size,
                                   area=self.area.mapping, area_offset=0)

    def _init_buffers(self, fd: int, area: Area, buf_size: int) -> None:
        """The fields of a soft provider whichever ring its buffer group goes on (its own, or an
        event loop's shared one: zcnet.aio)."""
        self.fd = fd
        self.area = area
        self.buf_size = buf_size
        self.entries = buffer_count(area.size, buf_size)
        self.note = f"{self.entries} buffers of {buf_size} bytes"
        self.armed = False
        self._ring: Ring | None = None
        self._buf: BufRing | None = None
        self._off_of = np.arange(self.entries, dtype=np.int64) * buf_size  # offset of each bid

    # --- Provider protocol ----------------------------------------------------------------------
    def can_arm(self) -> bool:
        if self._ring is None or self._buf is None:  # close() drops the ring first
            raise ClosedError.of(self, "can_arm")
        return self._buf.in_ring > 0

    def arm(self) -> None:
        if self._ring is None:
            raise ClosedError.of(self, "arm")
        prep_recv_multishot(self._ring, self.fd, BGID, RECV_UD, bundle=self.bundle,
                            limit=self._receive_cap())
        self._ring.submit()
        self.armed = True

    def _receive_cap(self) -> int:
        """Bytes after which a receive ends (its SQE's ``optlen``); 0: none."""
        return 0

    def reap(self, timeout: float | None) -> Delivery:
        """What the kernel delivered, as arrays: offsets, lengths and tokens (buffer ids).

        The common round (every CQE is data of our RECV, one buffer each) costs a fixed
        handful of numpy calls whatever its size; anything else takes ``_take`` (bundles) or
        the filtering path (other user_data, errors, the final CQE).
        """
        ring, buf = self._ring, self._buf
        if ring is None or buf is None:  # closed: the ring and the buffer ring are unmapped
            raise ClosedError.of(self, "reap")
        c = reap_ready(ring, timeout)
        out = Delivery()
        n = len(c)
        if not n:
            return out
        if n <= (FEW if buf.accel is not None else FEW_PURE):  # the ring's hot path decides
            self._take_few(c.tuples(), out)
            return out
        if (got := buf.take_round(c, RECV_UD)) is not None:  # the common round, in C
            rec, final = got
            out.tokens, out.offsets, out.lengths = rec["bid"], rec["offset"], rec["length"]
            if final is not None:
                self.armed = False
                note_final(out, final, STOPS)
            return out
        res, flags = c.res, c.flags
        # Only the last CQE of a multishot can lack F_MORE, and every CQE that ends it (EOF,
        # error, no buffers) lacks it: with F_MORE on the last one, every res is data. Without
        # bundles a CQE fills at most one buffer; with them, the max says whether one did.
        if (flags.item(n - 1) & u.IORING_CQE_F_MORE
                and c.user_data.tobytes() == self._ud_ok[:8 * n]
                and (not self.bundle or _maximum(res) <= self.buf_size)):
            bids = c.bids()
            buf.take(bids)
            out.tokens = bids
            out.offsets = self._off_of.take(bids)
            out.lengths = res
            return out
        keep = c.user_data == RECV_UD
        res = res[keep]
        flags = flags[keep]
        data = res > 0
        if data.any():
            self._take(res[data], flags[data], out)
        if len(res) and not flags[-1] & u.IORING_CQE_F_MORE:
            self.armed = False
            note_final(out, int(res[-1]), STOPS)
        return out

    def _take_few(self, cqes: Iterable[tuple[int, int, int]], out: Delivery) -> None:
        """A round of a few CQEs (big buffers, bundles) in plain Python: each numpy call costs
        about a microsecond, more with the caches cold from the kernel's copy, so below
        ``FEW`` CQEs list operations are cheaper than the vectorized path."""
        buf = self._buf
        assert buf is not None
        bs = self.buf_size
        offsets, lengths, tokens = out.offsets, out.lengths, out.tokens
        last = None
        for ud, r, f in cqes:  # (user_data, res, flags)
            if ud != RECV_UD:
                continue
            last = (r, f)
            if r > 0:
                bids = buf.consumed_ids(r, f >> u.IORING_CQE_BUFFER_SHIFT)
                if r <= bs:  # one buffer (always, without bundles)
                    b = bids[0]
                    tokens.append(b)
                    offsets.append(b * bs)
                    lengths.append(r)
                    continue
                tokens += bids
                offsets += [b * bs for b in bids]
                lengths += [bs] * (len(bids) - 1)
                lengths.append(r - (len(bids) - 1) * bs)
        # Only the last CQE of the multishot can lack F_MORE.
        if last is not None and not last[1] & u.IORING_CQE_F_MORE:
            self.armed = False
            note_final(out, last[0], STOPS)

    def _take(self, res: np.ndarray, flags: np.ndarray, out: Delivery) -> None:
        """Turn data CQEs into per-buffer (offset, length, bid), vectorized."""
        bs = self.buf_size
        buf = self._buf
        assert buf is not None
        counts = (res.astype(np.int64) + bs - 1) // bs
        total = int(counts.sum())
        first = int(flags[0]) >> u.IORING_CQE_BUFFER_SHIFT
        # Buffers are consumed in ring order across CQEs, so one call accounts for all of them.
        bids = buf.consumed(total * bs, first)
        heads = np.cumsum(counts) - counts
        if not np.array_equal(bids[heads], flags >> u.IORING_CQE_BUFFER_SHIFT):
            raise RuntimeError("buffer ring out of step with completions")
        lengths = np.full(total, bs, dtype=np.int64)
        lengths[heads + counts - 1] = res - (counts - 1) * bs
        out.tokens = bids
        out.offsets = self._off_of.take(bids)
        out.lengths = lengths

    def recycle(self, tokens: list[int] | np.ndarray, lengths: list[int] | np.ndarray) -> None:
        buf = self._buf
        if buf is None:
            raise ClosedError.of(self, "recycle")
        if buf.accel is None and type(tokens) is list and len(tokens) <= FEW_PURE:
            if tokens:
                buf.provide_few(tokens)
        elif len(tokens):
            buf.provide(tokens)  # compiled: one C call, cheaper than provide_few from one id

    def held_back(self) -> int:
        return 0

    def extra_stats(self) -> dict[str, int]:
        return {"buffers": self.entries, "buf_size": self.buf_size,
                "in_ring": self._buf.in_ring if self._buf else 0}

    def kernel_copy(self) -> CopyCount:
        return CopyCount(None, SOFT_COPIES, every_byte=True)

    def quiesce(self) -> None:
        """Cancel the receive ahead of close: Receiver.close then gives back what was released
        with nothing left to fill it, so the group is whole at close (a loop's shared ring
        keeps such a group for the next receiver, zcnet.aio.shared)."""
        if self._ring is None:
            raise ClosedError.of(self, "quiesce")
        if self.armed:
            self.armed = not self._cancel(self._ring)

    def _cancel(self, ring: Any) -> bool:
        """Cancel the receive and wait for its end (cancel_multishot); True when it ended."""
        return cancel_multishot(ring, RECV_UD, CANCEL_UD)

    def close(self) -> None:
        ring, self._ring = self._ring, None
        if ring is None:
            return
        buf, self._buf = self._buf, None
        self.armed = not close_ring(ring, self.armed, *(() if buf is None else (buf.close,)))


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


__all__ = ["SoftProvider", "buffer_count", "open_soft"]
