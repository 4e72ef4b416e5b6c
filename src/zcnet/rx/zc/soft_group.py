"""A soft provider's receive: one socket's multishot RECV on a provided-buffer group over an
area, whatever ring it runs on. The soft provider puts it on a ring of its own; zcnet.aio on
an event loop's shared ring (each group its own buffers) or on the loop's pool (one group
every pooled receive selects from). This is the soft provider's round function, and where the
provider model's API for building such providers lives.

Some facts about multishot RECV with a provided buffer ring:

- the area is carved into ``entries`` buffers of ``buf_size`` bytes; buffer id ``bid`` lives at
  area offset ``bid * buf_size``, so the id is the token and the offset follows from it;
- one armed RECV keeps posting CQEs (F_MORE set) until the ring runs dry (final CQE -ENOBUFS),
  the peer closes (res 0), the socket fails (-errno), or a CQE cannot be posted (final CQE
  without F_MORE): the first is exhaustion, the last asks for a re-arm;
- with IORING_RECVSEND_BUNDLE one CQE may fill several buffers, always the next ones in ring
  order, each full except the last;
- a group shared by several receives (``named``: an event loop's pool) cannot follow ring
  order: the receives' completions interleave. Without bundles each CQE names its one
  buffer, which is all such a group needs;
- the kernel copies into the buffers (it is "soft"), but from there on the application reads
  them in place and hands them back, exactly as with zcrx: everything above is the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from zcnet.rx.zc.accel import rx_accel_for
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import (
    BGID,
    CANCEL_UD,
    RECV_UD,
    SOFT_STOPS,
    Delivery,
    IntSeq,
    buffer_count,
    cancel_multishot,
    note_final,
)
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing
from zcnet.uring.prep import prep_recv_multishot
from zcnet.uring.ring import Completions

_maximum = np.maximum.reduce
_SHIFT = u.IORING_CQE_BUFFER_SHIFT
_F_MORE = u.IORING_CQE_F_MORE
# Rounds of at most this many CQEs take the plain-Python path, whose cost grows per CQE, where
# the vectorized one's is mostly fixed. With warm caches (zc_replay) they cross at 3-4 CQEs with
# the compiled ring writes (zcnet.uring._accel) and at about 8 on the pure path. On real
# traffic the kernel's copy has just evicted numpy's code and data: with the crossover at 3,
# zc_rx's soft-zc (rounds of 1-3 CQEs) took 33 ms of user CPU per GiB instead of 15. So the
# thresholds sit at about twice the warm crossover.
#: One record of the compiled round (zcnet.rx.zc._rxaccel.soft_round) per buffer: its offset
#: in the area, the bytes in it and its id.
SOFT_RECORD = np.dtype({"names": ["offset", "length", "bid"], "formats": ["<i8", "<i4", "<u2"],
                        "offsets": [0, 8, 12], "itemsize": 16})
_SOFT_ROUND = getattr(rx_accel_for("c"), "soft_round", None)
FEW = 8
FEW_PURE = 16

#: (user_data, res, flags) of one CQE, as Completions.tuples() and a loop's router give them.
Cqe = tuple[int, int, int]


class Requests(Protocol):
    """Where a group's requests go and its completions come from: a Ring of its own, or one
    member's view of a ring shared with other receivers (local user_data)."""

    def prep(self, opcode: int, fd: int = -1, addr: int = 0, length: int = 0, off: int = 0,
             user_data: int = 0, **fields: int) -> int: ...

    def submit(self, wait_nr: int = 0, timeout: float | None = None) -> int: ...

    def cq_ready(self) -> int: ...

    def reap(self) -> Completions: ...


class SoftGroup:
    """One socket's multishot RECV on buffer group ``buf`` over ``area``, its requests through
    ``requests``. ``round_cqes``: the most CQEs one round can hold (the vectorized path's
    compare buffer). ``named``: completions name their buffer and are taken out of ring order
    (a group shared by several receives; no bundles then)."""

    def __init__(self, fd: int, area: Area, buf_size: int, requests: Requests, buf: BufRing,
                 *, bundle: bool, round_cqes: int, named: bool = False) -> None:
        self.fd = fd
        self.area = area
        self.buf_size = buf_size
        self.entries = buffer_count(area.size, buf_size)
        self.requests = requests
        self.buf = buf
        self.bundle = bundle and not named
        self.named = named
        # RECV_UD as the user_data of a full round: the hot path compares bytes with it.
        self._ud_ok = np.full(round_cqes, RECV_UD, np.uint64).tobytes()
        self._off_of = np.arange(self.entries, dtype=np.int64) * buf_size  # offset of each bid
        self._few = FEW if buf.accel is not None else FEW_PURE  # the ring's hot path decides
        #: The common round in one C call (zcnet.rx.zc._rxaccel.soft_round) where the ring's
        #: hot path is compiled too, else None.
        self._parse = _SOFT_ROUND if buf.accel is not None else None

    def arm(self, limit: int = 0) -> None:
        """Arm the receive; ``limit``: bytes after which it ends (its SQE's ``optlen``)."""
        prep_recv_multishot(self.requests, self.fd, BGID, RECV_UD, bundle=self.bundle,
                            limit=limit)
        self.requests.submit()

    def round(self, c: Completions | list[Cqe]) -> Delivery:
        """What the kernel delivered: offsets, lengths and tokens (buffer ids) of one round of
        completions. The common round (every CQE is data of our RECV, one buffer each) costs a
        fixed handful of numpy calls whatever its size, or one C call; a few CQEs (or a list of
        them, as a loop's router hands them over) take the plain-Python path; anything else
        (bundles, other user_data, errors, the final CQE) the filtering path."""
        out = Delivery()
        if type(c) is list:
            self.take_few(c, out)
            return out
        assert isinstance(c, Completions)
        n = len(c)
        if not n:
            return out
        if n <= self._few or self.named:
            self.take_few(c.tuples(), out)
            return out
        buf = self.buf
        if (got := buf.take_round(c, RECV_UD, self._parse)) is not None:  # the common round, in C
            records, k, final = got
            rec = np.frombuffer(records, SOFT_RECORD, count=k)
            out.tokens, out.offsets, out.lengths = rec["bid"], rec["offset"], rec["length"]
            if final is not None:
                note_final(out, final, SOFT_STOPS)
            return out
        res, flags = c.res, c.flags
        # Only the last CQE of a multishot can lack F_MORE, and every CQE that ends it (EOF,
        # error, no buffers) lacks it: with F_MORE on the last one, every res is data. Without
        # bundles a CQE fills at most one buffer; with them, the max says whether one did.
        if (flags.item(n - 1) & _F_MORE
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
        if len(res) and not flags[-1] & _F_MORE:
            note_final(out, int(res[-1]), SOFT_STOPS)
        return out

    def take_few(self, cqes: Iterable[Cqe], out: Delivery) -> None:
        """A round of a few CQEs (big buffers, bundles) in plain Python: each numpy call costs
        about a microsecond, more with the caches cold from the kernel's copy, so below
        ``FEW`` CQEs list operations are cheaper than the vectorized path. Appends to ``out``
        (which may hold an earlier part's)."""
        buf = self.buf
        bs = self.buf_size
        offsets, lengths, tokens = out.offsets, out.lengths, out.tokens
        assert type(offsets) is list and type(lengths) is list and type(tokens) is list
        n = len(tokens)
        named = self.named
        last = None
        for ud, r, f in cqes:  # (user_data, res, flags)
            if ud != RECV_UD:
                continue
            last = (r, f)
            if r <= 0:
                continue
            if named:  # one buffer, the one the CQE names
                b = f >> _SHIFT
                tokens.append(b)
                offsets.append(b * bs)
                lengths.append(r)
                continue
            bids = buf.consumed_ids(r, f >> _SHIFT)
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
        if named and len(tokens) > n:
            buf.took(len(tokens) - n)
        # Only the last CQE of the multishot can lack F_MORE.
        if last is not None and not last[1] & _F_MORE:
            note_final(out, last[0], SOFT_STOPS)

    def _take(self, res: np.ndarray, flags: np.ndarray, out: Delivery) -> None:
        """Turn data CQEs into per-buffer (offset, length, bid), vectorized."""
        bs = self.buf_size
        counts = (res.astype(np.int64) + bs - 1) // bs
        total = int(counts.sum())
        first = int(flags[0]) >> _SHIFT
        # Buffers are consumed in ring order across CQEs, so one call accounts for all of them.
        bids = self.buf.consumed(total * bs, first)
        heads = np.cumsum(counts) - counts
        if not np.array_equal(bids[heads], flags >> _SHIFT):
            raise RuntimeError("buffer ring out of step with completions")
        lengths = np.full(total, bs, dtype=np.int64)
        lengths[heads + counts - 1] = res - (counts - 1) * bs
        out.tokens = bids
        out.offsets = self._off_of.take(bids)
        out.lengths = lengths

    def recycle(self, tokens: IntSeq) -> None:
        """Give buffers back to the group."""
        buf = self.buf
        if buf.accel is None and type(tokens) is list and len(tokens) <= FEW_PURE:
            if tokens:
                buf.provide_few(tokens)
        elif len(tokens):
            buf.provide(tokens)  # compiled: one C call, cheaper than provide_few from one id

    def cancel(self, seen: Callable[[Completions], object] | None = None) -> bool:
        """Cancel the receive and wait for its end (cancel_multishot); True when it ended.
        ``seen`` gets the completions reaped meanwhile."""
        return cancel_multishot(self.requests, RECV_UD, CANCEL_UD, seen)  # type: ignore[arg-type]

    def stats(self) -> dict[str, int]:
        return {"buffers": self.entries, "buf_size": self.buf_size,
                "in_ring": self.buf.in_ring if self.buf.registered else 0}
