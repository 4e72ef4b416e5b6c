"""Provider "soft" with incrementally consumed buffers (IOU_PBUF_RING_INC, Linux 6.12+).

Some facts about incremental buffer consumption:

- With IOU_PBUF_RING_INC the kernel does not retire a provided buffer after one receive: it
  advances the ring entry's addr/len by the bytes it used and keeps filling the same buffer with
  the next receives. A CQE carries the buffer id; IORING_CQE_F_BUF_MORE says the kernel will
  write more into that buffer. Without F_BUF_MORE the kernel is done with it.
- The CQE does not say where in the buffer the data went: it follows the previous data, so the
  buffer ring (zcnet.uring.bufring.BufRing in incremental mode) keeps each buffer's fill
  position, in the owner thread like everything else.
- So big buffers (cheap for the kernel: one ring entry per MiB) hold many small receives
  back to back: consecutive chunks are neighbours in the area (coalescing), and a 100-byte
  message costs 100 bytes of area, not a whole buffer.
- A buffer goes back to the ring only when the kernel is done with it and every chunk in it is
  released: a per-buffer count of held chunks, written only by the owner thread (one writer
  per counter, see bookkeeping.py), decremented in batches when releases are drained.
"""

from __future__ import annotations

import numpy as np

from zcnet.errors import ClosedError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import (
    BGID,
    RECV_UD,
    SOFT_COPIES,
    SOFT_STOPS,
    CopyCount,
    Delivery,
    ProviderBase,
    buffer_count,
    build_or_close,
    close_ring,
    note_final,
    reap_ready,
    soft_ring_flags,
)
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing
from zcnet.uring.prep import prep_recv_multishot
from zcnet.uring.ring import Ring


class IncrementalSoftProvider(ProviderBase):
    name = "soft"

    def __init__(self, fd: int, area: Area, buf_size: int) -> None:
        self.fd = fd
        self.area = area
        self.buf_size = buf_size
        self.entries = buffer_count(area.size, buf_size)
        self.note = f"{self.entries} incrementally filled buffers of {buf_size} bytes"
        # Per buffer: chunks the application holds, and whether the kernel is done with it.
        # Lists, not arrays: they are read and written a few entries per round, where a list
        # index costs tens of nanoseconds and a numpy call a microsecond.
        self._refs = [0] * self.entries
        self._done = [False] * self.entries
        ring = Ring(64, flags=soft_ring_flags(), cq_entries=4096)
        self._ring: Ring | None = ring
        self.buf = build_or_close(
            lambda: BufRing(ring, BGID, self.entries, buf_size, area=area.mapping,
                            incremental=True),
            ring.close)

    def can_arm(self) -> bool:
        if self._ring is None:
            raise ClosedError.of(self, "can_arm")
        return self.buf.in_ring > 0

    def arm(self) -> None:
        if self._ring is None:
            raise ClosedError.of(self, "arm")
        prep_recv_multishot(self._ring, self.fd, BGID, RECV_UD)
        self._ring.submit()

    @property
    def ring(self) -> Ring | None:
        return self._ring

    def reap(self, timeout: float | None) -> Delivery:
        ring = self._ring
        if ring is None:  # closed: the ring and the buffer ring are unmapped
            raise ClosedError.of(self, "reap")
        c = reap_ready(ring, timeout)
        out = Delivery()
        keep = c.user_data == RECV_UD
        res = c.res[keep].tolist()
        flags = c.flags[keep].tolist()
        filled, bs = self.buf.filled, self.buf_size
        offsets, lengths, tokens = out.offsets, out.lengths, out.tokens
        refs, done = self._refs, self._done
        for r, f in zip(res, flags, strict=True):
            if r <= 0:
                continue
            bid = f >> u.IORING_CQE_BUFFER_SHIFT
            more = bool(f & u.IORING_CQE_F_BUF_MORE)
            offsets.append(bid * bs + filled(r, bid, more))
            lengths.append(r)
            tokens.append(bid)
            refs[bid] += 1
            if not more:
                done[bid] = True
        if res and not flags[-1] & u.IORING_CQE_F_MORE:
            note_final(out, res[-1], SOFT_STOPS)
        return out

    def recycle(self, tokens: list[int] | np.ndarray, lengths: list[int] | np.ndarray) -> None:
        if self._ring is None:  # closed: the buffer ring's memory is unmapped
            raise ClosedError.of(self, "recycle")
        if not len(tokens):
            return
        refs, done = self._refs, self._done
        ready = []
        for t in (tokens.tolist() if isinstance(tokens, np.ndarray) else tokens):
            n = refs[t] - 1
            refs[t] = n
            if not n and done[t]:
                done[t] = False
                ready.append(t)
        if ready:
            self.buf.provide(np.array(ready, dtype=np.uint16))

    def extra_stats(self) -> dict[str, int]:
        return {"buffers": self.entries, "buf_size": self.buf_size, "in_ring": self.buf.in_ring,
                "incremental": 1}

    def kernel_copy(self) -> CopyCount:
        return CopyCount(None, SOFT_COPIES, every_byte=True)

    def close(self, armed: bool = False) -> bool:
        ring, self._ring = self._ring, None
        if ring is None:
            return not armed
        return close_ring(ring, armed, self.buf.close)
