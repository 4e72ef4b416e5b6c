"""Completions of one ring split by who submitted them, for rings several receivers share.

A shared ring (zcnet.aio's loop ring, a zcrx queue's ring) tags each request's user_data with
its member's id above the low ``bits`` bits; the low bits are the member's own user_data. The
kernel echoes user_data and nothing else names the request (a zcrx CQE does not say which
socket it came from), so this split is the only routing there is.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np

from zcnet.uring.completions import Completions

_U64 = np.uint64
_UD_BYTES: dict[int, bytes] = {}


def repeated(user_data: int, n: int) -> bytes:
    """``n`` copies of ``user_data`` as CQEs hold it (cached: a round's check is one bytes
    compare). The cache grows by one entry per user_data ever asked for."""
    b = _UD_BYTES.get(user_data, b"")
    if len(b) < 8 * n:
        b = _UD_BYTES[user_data] = struct.pack("<Q", user_data) * max(n, 1024)
    return b if len(b) == 8 * n else b[:8 * n]


def split_by_member(c: Completions, bits: int, *, local: bool = True
                    ) -> list[tuple[int, Completions]]:
    """``c`` as (member id, its completions) groups, each in the order the kernel posted them.

    ``local``: each group's user_data keeps only the low ``bits`` (the member's own ids);
    False keeps the whole tag. The second half of 32-byte CQEs (``extra``) goes with its CQE.
    One member's round (the common case) is one compare and no copy when ``local`` is False.
    """
    n = len(c)
    if not n:
        return []
    ud = c.user_data
    if not local and ud.tobytes() == repeated(int(ud[0]), n):  # one request's round
        return [(int(ud[0]) >> bits, c)]
    keys = ud >> _U64(bits)
    first = int(keys[0])
    extra = c.extra if c.cqe_size == 32 else None
    if keys.tobytes() == np.full(n, first, _U64).tobytes():
        if not local:
            return [(first, c)]
        return [(first, Completions(ud & _U64((1 << bits) - 1), c.res, c.flags, extra))]
    if local:
        ud = ud & _U64((1 << bits) - 1)
    res, flags = c.res, c.flags
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    cuts = [0, *(np.flatnonzero(sk[1:] != sk[:-1]) + 1).tolist(), n]
    groups = []
    for a, b in itertools.pairwise(cuts):
        idx = order[a:b]
        groups.append((int(sk[a]), Completions(ud[idx], res[idx], flags[idx],
                                                None if extra is None else extra[idx])))
    return groups


def concat(parts: list[Completions]) -> Completions:
    """Several rounds' completions as one, in order (``extra`` kept where they have it)."""
    extra = [p.extra for p in parts] if parts[0].cqe_size == 32 else None
    return Completions(np.concatenate([p.user_data for p in parts]),
                       np.concatenate([p.res for p in parts]),
                       np.concatenate([p.flags for p in parts]),
                       None if extra is None else np.concatenate(extra))  # type: ignore[arg-type]
