"""zcrx's two rings as user space sees them: the CQE32 completions of a RECV_ZC (parsed into
tokens, offsets and lengths) and the refill ring that gives buffers back (see zcrx.py's facts).

Both are the receive hot path: the common round is a fixed handful of numpy calls with no Python
object per buffer.
"""

from __future__ import annotations

import errno
from types import ModuleType

import numpy as np

from zcnet.rx.zc.accel import rx_accel_for
from zcnet.rx.zc.provider import RECV_UD, Delivery, note_final
from zcnet.rx.zc.provider import RING_FLAGS as PROVIDER_RING_FLAGS
from zcnet.uapi import io_uring as u
from zcnet.uring.members import repeated
from zcnet.uring.ring import Completions, Ring
from zcnet.uring.syscall import backend

RING_FLAGS = PROVIDER_RING_FLAGS | u.IORING_SETUP_CQE32  # a zcrx CQE carries a 16-byte tail

OFF_MASK = (1 << u.IORING_ZCRX_AREA_SHIFT) - 1  # offset bits of a zcrx cqe/rqe ``off``
_OFF_MASK = np.uint64(OFF_MASK)
ALL_BITS = (1 << 64) - 1  # push's mask once tokens name their areas
_NO_OFFS = np.zeros(0, dtype=np.uint64)
_NO_LENS = np.zeros(0, dtype=np.uint32)
# zcnet.rx.zc._rxaccel.zcrx_round's record per CQE.
_ROUND_RECORD = np.dtype({"names": ["token", "offset", "length"],
                          "formats": ["<u8", "<i8", "<i4"], "offsets": [0, 8, 16],
                          "itemsize": 24})
# A final CQE's errno that does not end the stream: -ENOSPC is a CQ overflow (data intact).
# -ENOMEM: no free buffer in the area for the kernel's copy (the data waits in the socket).
STOPS = {errno.ENOSPC: "rearm", errno.ECANCELED: "rearm", errno.ENOMEM: "exhausted"}


class RefillRing:
    """Our side of the refill queue over its shared memory (``mem``: the whole region as uint8).

    We own ``ktail``; the kernel owns ``khead``. ``push`` writes as many entries as fit and holds
    the rest; later calls send the held ones first, so order and count are preserved.
    """

    def __init__(self, mem: np.ndarray, head: int, tail: int, rqes: int, entries: int,
                 area_token: int) -> None:
        if entries & (entries - 1):
            raise ValueError("refill ring entries must be a power of two")
        self.entries = entries
        self.mask = entries - 1
        self.area_token = area_token
        self._khead = mem[head:head + 4].view(np.uint32)
        self._ktail = mem[tail:tail + 4].view(np.uint32)
        ring = mem[rqes:rqes + entries * 16]
        self._rqe_off = ring.view(np.uint64).reshape(entries, 2)[:, 0]
        self._rqe_len = ring.view(np.uint32).reshape(entries, 4)[:, 2]
        ring.view(np.uint32).reshape(entries, 4)[:, 3] = 0  # pad: zero once, never written
        self._tail = int(self._ktail[0])
        self._token = np.uint64(area_token)
        #: What push keeps of a token: its offset bits, ``area_token`` then naming the area.
        #: With added areas (add_area) the whole token, which names its area itself.
        self.push_mask = OFF_MASK
        self._mask = _OFF_MASK
        #: Where each area id's memory starts in the queue's one range (zcrx_areas), or None
        #: while the queue has its first area only.
        self.area_starts: np.ndarray | None = None
        self._held_off = _NO_OFFS  # what did not fit yet, sent first next time
        self._held_len = _NO_LENS
        self.full_events = 0
        self.produced = 0  # entries written over the ring's life
        #: Other processes write this ring too (zcrx_procs.py): the tail is read from the ring
        #: at each push (under their common lock), not kept.
        self.shared = False
        # The whole push in one C call when everything fits (None: the numpy path, which also
        # holds back what does not fit); the provider parses its rounds with it too.
        self.accel = rx_accel_for(backend())
        self._where = (mem, head, tail, rqes, entries)

    def _acquire_khead(self) -> int:
        # The kernel stores head with smp_store_release after reading the entries; on x86 a
        # plain load is an acquire (TSO). Weakly ordered CPUs would need a real one here.
        return int(self._khead[0])

    def _release_ktail(self) -> None:
        # Entries are written before this store and NAPI on another CPU reads them after its
        # smp_load_acquire of tail; on x86 program order is enough (TSO).
        self._ktail[0] = self._tail

    def space(self) -> int:
        used = (self._tail - self._acquire_khead()) & 0xFFFFFFFF
        return self.entries - used

    @property
    def tail(self) -> int:
        return self._tail

    def kernel_head(self) -> int:
        """The kernel's consumer index (for stats and tests)."""
        return self._acquire_khead()

    @property
    def held(self) -> int:
        return len(self._held_off)

    def add_area(self, area_id: int, start: int) -> None:
        """Area ``area_id`` (the kernel's, from its rq_area_token) starts ``start`` bytes into
        the queue's range. Tokens carry their area id, so from now on push gives them back as
        they came, and ``virtual`` reads offsets through the table."""
        tab = self.area_starts
        if tab is None:
            first = self.area_token >> u.IORING_ZCRX_AREA_SHIFT
            tab = np.full(first + 1, -1, np.int64)
            tab[first] = 0
        if area_id >= len(tab):
            tab = np.concatenate((tab, np.full(area_id + 1 - len(tab), -1, np.int64)))
        tab[area_id] = start
        self.area_starts = tab
        self.area_token, self._token = 0, np.uint64(0)
        self.push_mask, self._mask = ALL_BITS, np.uint64(ALL_BITS)

    def virtual(self, tokens: list[int] | np.ndarray) -> list[int] | np.ndarray:
        """The offsets in the queue's range of CQE ``off`` values (``tokens``) that name
        added areas; the same kind (list or array) as given."""
        assert self.area_starts is not None
        t = np.asarray(tokens, dtype=np.uint64)
        ids = (t >> np.uint64(u.IORING_ZCRX_AREA_SHIFT)).astype(np.intp)
        v = self.area_starts[ids] + (t & _OFF_MASK).astype(np.int64)
        return v if isinstance(tokens, np.ndarray) else v.tolist()

    def push(self, offs: list[int] | np.ndarray, lens: list[int] | np.ndarray) -> int:
        """Queue buffers (their CQE ``off`` values and lengths, lists or arrays) for the
        kernel; returns how many were written now. The rest stay held and go first next time.

        Vectorized: the entries are written with a few slice operations (two where the ring
        wraps), no Python object per buffer for arrays."""
        if self.shared:
            self._tail = int(self._ktail[0])
        if self.accel is not None and not len(self._held_off):
            t = self.accel.refill_push(*self._where, self._tail, offs, lens, self.area_token,
                                       self.push_mask)
            if t is not None:
                n = (t - self._tail) & 0xFFFFFFFF
                self._tail = t
                self.produced += n
                return n
        o = np.asarray(offs, dtype=np.uint64)
        ln = np.asarray(lens, dtype=np.uint32)
        if len(self._held_off):
            o = np.concatenate((self._held_off, o))
            ln = np.concatenate((self._held_len, ln))
        total = len(o)
        n = min(self.space(), total)
        if n < total:
            self.full_events += 1
            self._held_off, self._held_len = o[n:].copy(), ln[n:].copy()
        elif len(self._held_off):
            self._held_off, self._held_len = _NO_OFFS, _NO_LENS
        if n:
            t = self._tail & self.mask
            k = min(n, self.entries - t)  # up to the ring's end, the rest from its start
            for lo, src in ((t, slice(0, k)), (0, slice(k, n))):
                m = src.stop - src.start
                if m:
                    dst = self._rqe_off[lo:lo + m]
                    np.bitwise_and(o[src], self._mask, out=dst)
                    np.bitwise_or(dst, self._token, out=dst)
                    self._rqe_len[lo:lo + m] = ln[src]
            self._tail = (self._tail + n) & 0xFFFFFFFF
            self._release_ktail()
            self.produced += n
        return n


def parse_completions(c: Completions, user_data: int = RECV_UD,
                      fast: ModuleType | None = None) -> Delivery:
    """Data fragments and the stream's state from CQE32 completions of one RECV_ZC.

    The common round (every CQE is data of our RECV_ZC) gives arrays with no Python object per
    buffer: tokens (the CQEs' ``off``), offsets and lengths; in one C call with ``fast`` (the
    accelerator), else with a fixed handful of numpy calls. Anything else (other user_data,
    the final CQE) takes the filtering path."""
    out = Delivery()
    n = len(c)
    if not n:
        return out
    raw = c.raw
    if fast is not None and raw is not None and c.cqe_size == 32:
        got = fast.zcrx_round(raw, n, user_data, u.IORING_CQE_F_MORE, OFF_MASK)
        if got is not None:
            rec = np.frombuffer(got, _ROUND_RECORD)
            out.tokens, out.offsets, out.lengths = rec["token"], rec["offset"], rec["length"]
            return out
    extra = c.extra
    assert extra is not None, "zcrx needs a CQE32 ring"
    # Only the last CQE of a multishot can lack F_MORE, and every CQE that ends it lacks it:
    # with F_MORE on the last one every res is data.
    if c.flags.item(n - 1) & u.IORING_CQE_F_MORE and (
            c.user_data.tobytes() == repeated(user_data, n)):
        off = extra[:, 0]
        out.tokens = off
        out.offsets = off & _OFF_MASK
        out.lengths = c.res
        return out
    keep = c.user_data == user_data
    res, flags, extra = c.res[keep], c.flags[keep], c.extra[keep]
    data = res > 0
    if data.any():
        off = extra[data, 0]
        out.tokens = off.tolist()
        out.offsets = (off & np.uint64(OFF_MASK)).tolist()
        out.lengths = res[data].tolist()
    if len(res) and not flags[-1] & u.IORING_CQE_F_MORE:
        note_final(out, int(res[-1]), STOPS)
    return out


def total_bytes(lengths: list[int] | np.ndarray, accel: ModuleType | None) -> int:
    """The bytes of a round's buffers (a list, or an array: summed in C where built)."""
    if type(lengths) is list:
        return sum(lengths)
    if accel is None or (n := accel.int_sum(lengths)) is None:
        return int(np.add.reduce(lengths))
    return int(n)


def queue_ring(rq_entries: int, cqe_mixed: bool = False) -> Ring:
    """A zcrx queue's ring: room for two CQEs per refill entry. ``cqe_mixed``: CQEs of 16 and
    32 bytes (IORING_SETUP_CQE_MIXED, 6.18; zcnet.uring.mixed) in twice the slots, as each
    RECV_ZC completion takes two; the ring's other completions (cancels, and whatever an
    application adds) take one."""
    cq = max(1024, 2 * rq_entries)
    if not cqe_mixed:
        return Ring(64, flags=RING_FLAGS, cq_entries=cq)
    flags = RING_FLAGS & ~u.IORING_SETUP_CQE32 | u.IORING_SETUP_CQE_MIXED
    return Ring(64, flags=flags, cq_entries=2 * cq)
