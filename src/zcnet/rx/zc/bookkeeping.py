"""Buffer-lifetime bookkeeping shared by every provider: the counters (``Stats``) and
coalescing (``contiguous_runs``). The release queue and the receive's state are the receive
core's (zcnet.rx.zc.core), which explains why every counter is written by one thread."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(slots=True)  # the compiled rounds read and write the counters in place
class Stats:
    """Counters in the style of a page pool's, all written by the ring's owner thread."""

    delivered: int = 0           # chunks handed to the application
    delivered_bytes: int = 0
    released: int = 0            # chunks given back to the provider
    released_bytes: int = 0
    peak_in_flight: int = 0      # most chunks the application held at once
    peak_in_flight_bytes: int = 0
    refill_full: int = 0         # times the refill ring had no room and buffers were held back
    rearms: int = 0              # multishot receives armed again after a final completion
                                 # (soft: mostly a bundle that emptied the buffer ring)
    exhausted: int = 0           # multishot stopped because the provider ran out of buffers
    backpressure: int = 0        # times delivery paused because the app held too much
    coalesced: int = 0           # chunks merged into a larger contiguous span
    linear: int = 0              # devmem: bytes that arrived in host memory, not the dma-buf
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        return self.delivered - self.released

    @property
    def in_flight_bytes(self) -> int:
        return self.delivered_bytes - self.released_bytes

    def note_delivered(self, chunks: int, nbytes: int) -> None:
        self.delivered += chunks
        self.delivered_bytes += nbytes
        if self.delivered - self.released > self.peak_in_flight:
            self.peak_in_flight = self.delivered - self.released
        if self.delivered_bytes - self.released_bytes > self.peak_in_flight_bytes:
            self.peak_in_flight_bytes = self.delivered_bytes - self.released_bytes

    def note_released(self, chunks: int, nbytes: int) -> None:
        self.released += chunks
        self.released_bytes += nbytes

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        d.update(d.pop("extra"))
        d["in_flight"] = self.in_flight
        d["in_flight_bytes"] = self.in_flight_bytes
        return d


def contiguous_runs(offsets: list[int], lengths: list[int]) -> list[tuple[int, int]]:
    """Split a sequence of (offset, length) into runs where each chunk starts where the previous
    ended in the area; returns (start index, end index) pairs. The analogue of the kernel's
    skb_can_coalesce_netmem: neighbours in memory become one view."""
    runs: list[tuple[int, int]] = []
    n = len(offsets)
    start = 0
    for i in range(1, n):
        if offsets[i] != offsets[i - 1] + lengths[i - 1]:
            runs.append((start, i))
            start = i
    if n:
        runs.append((start, n))
    return runs
