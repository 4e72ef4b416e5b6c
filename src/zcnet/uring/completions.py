"""Reaped CQEs as arrays: the type ``Ring.reap`` returns (and the compiled reap builds).

The ring takes one bytes copy of the ready CQEs; the fields are numpy views decoded from that
copy on first access, so a caller pays only for the fields it reads.
"""

from __future__ import annotations

import struct

import numpy as np

from zcnet.uapi import io_uring as u
from zcnet.uring.syscall import cqe_error, slot_members

# A CQE as numpy sees it: ``bid`` overlaps the upper half of ``flags`` (the provided-buffer id,
# IORING_CQE_BUFFER_SHIFT = 16); ``extra`` is the second half of a CQE32.
_CQE_FIELDS = {"names": ["user_data", "res", "flags", "bid"],
               "formats": ["<u8", "<i4", "<u4", "<u2"], "offsets": [0, 8, 12, 14]}
_CQE_DTYPE = np.dtype({**_CQE_FIELDS, "itemsize": 16})
# The same three fields for a few CQEs as Python ints: one C-level unpack per CQE, no numpy call.
_CQE_TUPLE = struct.Struct("<QiI")
_CQE32_TUPLE = struct.Struct("<QiI16x")
_CQE32_DTYPE = np.dtype({"names": [*_CQE_FIELDS["names"], "extra"],
                         "formats": [*_CQE_FIELDS["formats"], ("<u8", 2)],
                         "offsets": [*_CQE_FIELDS["offsets"], 16], "itemsize": 32})


class Completions:
    """Reaped CQEs as arrays: ``user_data`` (uint64), ``res`` (int32), ``flags`` (uint32) and,
    on a CQE32 ring, ``extra`` (uint64 (n, 2): the second half of each CQE).

    They are a copy (the CQ slots are already handed back to the kernel): the ring takes one
    bytes copy of the CQEs and the arrays are views decoded from it on first access, so a
    caller pays only for the fields it reads. The compiled reap (zcnet.uring._accel's Core)
    makes them itself, filling the slots it is handed as ``C_SLOTS`` (below).
    """

    __slots__ = ("_cqe32", "_extra", "_flags", "_n", "_raw", "_res", "_ud", "_words")

    def __init__(self, user_data: np.ndarray, res: np.ndarray, flags: np.ndarray,
                 extra: np.ndarray | None = None) -> None:
        self._raw = None
        self._words = None
        self._n = len(res)
        self._cqe32 = extra is not None
        self._ud, self._res, self._flags, self._extra = user_data, res, flags, extra

    @classmethod
    def from_raw(cls, raw: bytearray, n: int, cqe32: bool) -> Completions:
        """``n`` CQEs copied out of the CQ ring into ``raw``, decoded on first use (a reap's
        result; the compiled reaps make theirs through this too)."""
        # The compiled reap (zcnet.uring._accel) sets these same slots itself.
        c = cls.__new__(cls)
        c._raw, c._n, c._cqe32 = raw, n, cqe32
        c._words = c._ud = c._res = c._flags = c._extra = None
        return c

    def _decode(self) -> np.ndarray:
        w = self._words
        if w is None:  # one structured view; each field is then a cheap strided view
            w = self._words = np.frombuffer(self._raw, _CQE32_DTYPE if self._cqe32
                                            else _CQE_DTYPE)
        return w

    @property
    def user_data(self) -> np.ndarray:
        a = self._ud
        if a is None:
            a = self._ud = self._decode()["user_data"]
        return a

    @property
    def res(self) -> np.ndarray:
        a = self._res
        if a is None:
            a = self._res = self._decode()["res"]
        return a

    @property
    def flags(self) -> np.ndarray:
        a = self._flags
        if a is None:
            a = self._flags = self._decode()["flags"]
        return a

    @property
    def extra(self) -> np.ndarray | None:
        a = self._extra
        if a is None and self._cqe32:
            a = self._extra = self._decode()["extra"]
        return a

    @property
    def raw(self) -> bytes | bytearray | None:
        """The CQEs as the kernel laid them out, ``cqe_size`` bytes each (for a compiled
        parse), or None when built from arrays."""
        return self._raw

    @property
    def cqe_size(self) -> int:
        return 32 if self._cqe32 else 16

    def tuples(self) -> list[tuple[int, int, int]]:
        """(user_data, res, flags) per CQE as Python ints: for rounds of a few CQEs, where three
        numpy field decodes and ``tolist`` calls cost several times the unpack itself."""
        if self._raw is None:  # built from arrays
            return list(zip(self.user_data.tolist(), self.res.tolist(), self.flags.tolist(),
                            strict=True))
        return list((_CQE32_TUPLE if self._cqe32 else _CQE_TUPLE).iter_unpack(self._raw))

    def bids(self) -> np.ndarray:
        """Provided-buffer ids (the upper 16 bits of ``flags``, meaningful where
        IORING_CQE_F_BUFFER is set), as a uint16 view: no arithmetic, no copy."""
        if self._raw is None:  # built from arrays
            return (self.flags >> u.IORING_CQE_BUFFER_SHIFT).astype(np.uint16)
        return self._decode()["bid"]

    def __len__(self) -> int:
        return self._n

    def raise_for_errors(self, what: str = "") -> None:
        """Raise OSError for the first negative ``res``: the one place errno is translated."""
        bad = np.flatnonzero(self.res < 0)
        if len(bad):
            raise cqe_error(int(self.res[bad[0]]), what)

    def __repr__(self) -> str:
        return f"<Completions n={self._n}>"


#: The slots the compiled reap fills in place when it makes Completions, handed to its Core once
#: (zcnet.uring.accel_bind) in this order: the three ``from_raw`` sets, then the lazily decoded
#: ones, which it sets to None.
C_SLOTS = slot_members(Completions, "_raw", "_n", "_cqe32", "_words", "_ud", "_res", "_flags",
                       "_extra")
