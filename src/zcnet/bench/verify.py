"""The byte pattern senders send and receivers check, numpy-vectorized.

Byte ``i`` of a stream is ``PATTERN[i % PERIOD]``: a pseudo-random block whose period is a prime
near 1 MiB, so a chunk delivered at the wrong offset (reordered, duplicated, dropped) mismatches
unless it is off by an exact multiple of the period. ``TILED`` repeats the block once more so that
any slice of up to ``PERIOD`` bytes is contiguous: a sender sends views of it without copying and a
checker compares without wrapping.
"""

from __future__ import annotations

import numpy as np

PERIOD = 1_048_573  # prime
MAX_SLICE = PERIOD
_BLOCK = np.random.default_rng(0x2C7E7).integers(0, 256, PERIOD, dtype=np.uint8)
TILED = np.concatenate([_BLOCK, _BLOCK])
TILED.flags.writeable = False


def pattern_view(offset: int, length: int) -> np.ndarray:
    """The ``length`` pattern bytes at stream ``offset`` (``length`` <= MAX_SLICE)."""
    start = offset % PERIOD
    return TILED[start:start + length]


class Verifier:
    """Counts mismatching bytes of a received stream, chunk by chunk, in stream order."""

    def __init__(self) -> None:
        self.checked = 0
        self.mismatches = 0

    def check(self, data: np.ndarray, offset: int | None = None) -> int:
        """Compare ``data`` (uint8) received at stream ``offset`` (default: where we are)."""
        pos = self.checked if offset is None else offset
        bad = 0
        view = data
        while len(view):
            n = min(len(view), MAX_SLICE)
            bad += int(np.count_nonzero(view[:n] != pattern_view(pos, n)))
            view = view[n:]
            pos += n
        self.checked += len(data)
        self.mismatches += bad
        return bad

    def as_dict(self) -> dict[str, int]:
        return {"checked_bytes": self.checked, "mismatches": self.mismatches}
