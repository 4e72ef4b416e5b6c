"""A byte stream whose content is a function of its offset, so a receiver can check every byte.

The stream repeats a random block of a prime period: a chunk delivered at the wrong offset, twice,
or with bytes of another chunk fails the comparison (no alignment hides it). The check is one
``np.array_equal`` against a slice of a precomputed block (memcmp speed, >10 GB/s here).
"""

from __future__ import annotations

import numpy as np

PERIOD = 65521  # largest prime below 64 KiB


class StreamPattern:
    """Content of byte ``i`` of the stream is ``block[i % PERIOD]``."""

    def __init__(self, seed: int = 0, max_len: int = 4 << 20) -> None:
        rng = np.random.default_rng(seed)
        base = rng.integers(0, 256, PERIOD, dtype=np.uint8)
        reps = -(-(PERIOD + max_len) // PERIOD)
        self.block = np.tile(base, reps)
        self.max_len = max_len

    def expected(self, offset: int, length: int) -> np.ndarray:
        """The ``length`` bytes at stream ``offset`` (a view, for sending or comparing)."""
        if length > self.max_len:
            raise ValueError(f"length {length} exceeds the pattern's max_len {self.max_len}")
        start = offset % PERIOD
        return self.block[start:start + length]

    def matches(self, offset: int, data: np.ndarray) -> bool:
        """Whether ``data`` (uint8) is what the stream holds at ``offset``; long data is
        compared piecewise."""
        n = len(data)
        pos = 0
        while pos < n:
            k = min(self.max_len, n - pos)
            if not np.array_equal(data[pos:pos + k], self.expected(offset + pos, k)):
                return False
            pos += k
        return True

    def first_mismatch(self, offset: int, data: np.ndarray) -> int | None:
        """Index of the first wrong byte, or None (for error messages; not fast)."""
        for pos in range(0, len(data), self.max_len):
            piece = data[pos:pos + self.max_len]
            bad = np.flatnonzero(piece != self.expected(offset + pos, len(piece)))
            if len(bad):
                return pos + int(bad[0])
        return None
