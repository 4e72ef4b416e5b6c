"""What txbench packets carry, so the sink can tell intact packets from damaged ones.

A packet of ``size`` bytes holds its sequence number as little-endian u64 in bytes 0..7 and a
fixed pattern after that (byte j = (j * 31 + 7) mod 256). Packets shorter than 8 bytes carry the
pattern only. Stamping a burst is one numpy assignment to the sequence column; checking a batch
is one comparison against the pattern row.
"""

from __future__ import annotations

import numpy as np

SEQ_BYTES = 8


def pattern(size: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.uint32) * 31 + 7) & 0xFF).astype(np.uint8)


def has_seq(size: int) -> bool:
    return size >= SEQ_BYTES


def fill(rows: np.ndarray) -> None:
    """Write the pattern into every row of a (n, size) uint8 array (sequence bytes included)."""
    rows[:] = pattern(rows.shape[1])


def seq_column(rows: np.ndarray) -> np.ndarray | None:
    """A writable (n,) uint64 view of the sequence numbers, when the layout allows one in place
    (C-contiguous rows whose size is a multiple of 8); otherwise None: use :func:`stamp`."""
    size = rows.shape[1]
    if not has_seq(size) or size % 8 or not rows.flags.c_contiguous or rows.ctypes.data % 8:
        return None
    return rows.view("<u8")[:, 0]


def stamp(rows: np.ndarray, first_seq: int) -> None:
    """Write sequence numbers first_seq, first_seq+1, ... into the rows (any stride)."""
    n, size = rows.shape
    if not has_seq(size):
        return
    seqs = np.arange(first_seq, first_seq + n, dtype="<u8")
    rows[:, :SEQ_BYTES] = seqs.view(np.uint8).reshape(n, SEQ_BYTES)


class Checker:
    """Counts received packets and how many were damaged; ``sizes`` are the lengths allowed."""

    def __init__(self, sizes: int | tuple[int, ...]) -> None:
        self.sizes = np.array(sorted({sizes} if isinstance(sizes, int) else set(sizes)))
        self._pattern = pattern(int(self.sizes.max()) + 64)
        self.received = 0
        self.bytes = 0
        self.wrong_size = 0
        self.bad_payload = 0
        self.seq_sum = 0
        self.seq_max = -1

    def check(self, data: np.ndarray, lengths: np.ndarray) -> None:
        """``data`` is (n, slot) with slot >= the largest size; ``lengths`` the received lengths."""
        if len(self.sizes) == 1 and self._check_uniform(data, lengths):
            return
        self._check_general(data, lengths)

    def _check_uniform(self, data: np.ndarray, lengths: np.ndarray) -> bool:
        """Fast path, a few numpy calls per batch: every packet has the one expected size."""
        size = int(self.sizes[0])
        if size < SEQ_BYTES or data.shape[1] % 8 or not (lengths == size).all():
            return False
        n = len(lengths)
        rows = data[:n]
        bad = (rows[:, SEQ_BYTES:size] != self._pattern[SEQ_BYTES:size]).any(axis=1)
        nbad = int(bad.sum())
        seqs = rows.view("<u8")[:, 0]
        if nbad:
            seqs = seqs[~bad]
        self.received += n
        self.bytes += n * size
        self.bad_payload += nbad
        if len(seqs):
            self.seq_sum += int(seqs.sum(dtype=np.uint64))
            self.seq_max = max(self.seq_max, int(seqs.max()))
        return True

    def _check_general(self, data: np.ndarray, lengths: np.ndarray) -> None:
        n = len(lengths)
        slot = data.shape[1]
        self.received += n
        self.bytes += int(lengths.sum())
        ok = np.isin(lengths, self.sizes)
        self.wrong_size += int(n - ok.sum())
        rows = data[:n]
        inside = np.arange(slot)[None, :] < lengths[:, None].astype(np.int64)
        differs = (rows != self._pattern[None, :slot]) & inside
        seqd = lengths >= SEQ_BYTES
        differs[seqd, :SEQ_BYTES] = False  # sequence bytes are checked by their sum, not pattern
        bad = differs.any(axis=1) & ok
        self.bad_payload += int(bad.sum())
        good = ok & ~bad & seqd
        if good.any():
            seqs = np.ascontiguousarray(rows[good, :SEQ_BYTES]).view("<u8").ravel()
            self.seq_sum += int(seqs.sum(dtype=np.uint64))
            self.seq_max = max(self.seq_max, int(seqs.max()))

    def as_dict(self) -> dict[str, int]:
        return {
            "received": self.received,
            "bytes": self.bytes,
            "wrong_size": self.wrong_size,
            "bad_payload": self.bad_payload,
            "seq_sum": self.seq_sum,
            "seq_max": self.seq_max,
        }
