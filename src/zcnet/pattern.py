"""The byte stream every zcnet sender sends and every receiver can check, numpy-vectorized.

Byte ``i`` of a stream is ``block[i % period]``: a pseudo-random block whose period is a prime near
1 MiB, so a chunk delivered at the wrong offset (reordered, duplicated, dropped, or mixed with
another chunk's bytes) mismatches unless it is off by an exact multiple of the period. The block
is tiled past its period by ``max_len`` bytes, so any slice of up to ``max_len`` bytes is one
contiguous view: senders send views of it without copying, checkers compare without wrapping.
This module depends on numpy only, so every layer (rx, tx, bench) can use it.
"""

from __future__ import annotations

import numpy as np

DEFAULT_PERIOD = 1_048_573  # prime
DEFAULT_SEED = 0x2C7E7


class StreamPattern:
    """Content of byte ``i`` of the stream is ``block[i % period]``."""

    def __init__(self, seed: int = DEFAULT_SEED, *, period: int = DEFAULT_PERIOD,
                 max_len: int = 4 << 20) -> None:
        base = np.random.default_rng(seed).integers(0, 256, period, dtype=np.uint8)
        self.period = period
        self.max_len = max_len
        self.block = np.tile(base, -(-(period + max_len) // period))
        self.block.flags.writeable = False

    def expected(self, offset: int, length: int) -> np.ndarray:
        """The ``length`` bytes at stream ``offset``: a read-only view to send or compare."""
        if length > self.max_len:
            raise ValueError(f"length {length} exceeds the pattern's max_len {self.max_len}")
        start = offset % self.period
        return self.block[start:start + length]

    def _pieces(self, offset: int, data: np.ndarray):  # type: ignore[no-untyped-def]
        for pos in range(0, len(data), self.max_len):
            piece = data[pos:pos + self.max_len]
            yield pos, piece, self.expected(offset + pos, len(piece))

    def mismatches(self, offset: int, data: np.ndarray) -> int:
        """How many bytes of ``data`` (uint8) differ from the stream at ``offset``."""
        if len(data) <= self.max_len:  # the common case, without the generator's overhead
            return int(np.count_nonzero(data != self.expected(offset, len(data))))
        return sum(int(np.count_nonzero(p != e)) for _, p, e in self._pieces(offset, data))

    def matches(self, offset: int, data: np.ndarray) -> bool:
        """Whether ``data`` is exactly what the stream holds at ``offset`` (memcmp speed)."""
        return all(np.array_equal(p, e) for _, p, e in self._pieces(offset, data))

    def first_mismatch(self, offset: int, data: np.ndarray) -> int | None:
        """Index of the first wrong byte, or None (for error messages; not fast)."""
        for pos, p, e in self._pieces(offset, data):
            bad = np.flatnonzero(p != e)
            if len(bad):
                return pos + int(bad[0])
        return None


DEFAULT = StreamPattern()
PERIOD = DEFAULT.period
MAX_SLICE = DEFAULT.max_len
TILED = DEFAULT.block


def pattern_view(offset: int, length: int) -> np.ndarray:
    """The ``length`` bytes of the default stream at ``offset`` (``length`` <= MAX_SLICE)."""
    return DEFAULT.expected(offset, length)


class Verifier:
    """Counts mismatching bytes of a received stream, chunk by chunk, in stream order."""

    def __init__(self, pattern: StreamPattern = DEFAULT) -> None:
        self.pattern = pattern
        self.checked = 0
        self.mismatches = 0

    def check(self, data: np.ndarray, offset: int | None = None) -> int:
        """Compare ``data`` (uint8) received at stream ``offset`` (default: where we are)."""
        pos = self.checked if offset is None else offset
        bad = self.pattern.mismatches(pos, data)
        self.checked += len(data)
        self.mismatches += bad
        return bad

    def as_dict(self) -> dict[str, int]:
        return {"checked_bytes": self.checked, "mismatches": self.mismatches}
