"""What a zero-copy provider (soft, zcrx, devmem) offers the Receiver.

A provider owns the kernel side: the ring or socket that fills the area, and the path buffers
take back to the kernel. It knows nothing of chunks, threads or statistics; the Receiver does the
bookkeeping and calls the provider only from the owner thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from zcnet.rx.zc.area import Area


@dataclass
class Delivery:
    """What one reap produced: parallel lists, one entry per received fragment.

    ``end`` is None while the stream continues, 0 at EOF, or -errno when the stream failed.
    ``stopped`` is set when delivery stopped without ending the stream (buffers exhausted, CQ
    overflow): the Receiver re-arms once it may.
    """

    offsets: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    #: devmem only: fragments that arrived in host memory instead of the area, by list position
    #: (their offset and token are -1); rare, and a setup problem the provider reports.
    linear: dict[int, bytes] = field(default_factory=dict)
    end: int | None = None
    stopped: str | None = None


class Provider(Protocol):
    name: str
    area: Area
    armed: bool
    #: Why this provider was chosen (for "auto") or a note about its setup.
    note: str

    def arm(self) -> None:
        """Start (or restart) delivery into the area."""

    def can_arm(self) -> bool:
        """True when the kernel has buffers to fill, so arming will not stop at once."""

    def reap(self, timeout: float | None) -> Delivery:
        """Wait up to ``timeout`` seconds (None: until something happens) and collect what the
        kernel delivered."""

    def recycle(self, tokens: list[int], lengths: list[int]) -> None:
        """Give buffers back to the kernel; a provider that cannot take them all now (refill
        ring full) holds the rest and retries on the next call, it never drops one."""

    def held_back(self) -> int:
        """Buffers released by the application but not yet accepted by the kernel."""

    def extra_stats(self) -> dict[str, int]:
        """Provider-specific counters (refill_full, rearms, ...)."""

    def close(self) -> None:
        """Release kernel resources; the area stays mapped (chunks may still be held)."""
