"""Buffer-lifetime bookkeeping shared by every provider: release queue, stats, coalescing.

Some facts about sharing buffers between threads (the lesson of the zcrx "refs cache bouncing"
series): when the CPU that hands buffers out and the CPU that takes them back both write the same
counters, every release bounces a cache line between them and throughput drops by ~10%. So:

- every ring update and every counter below is written by one thread only, the ring's owner;
- another thread that releases a chunk appends it to a queue (``collections.deque.append`` is a
  single atomic operation under the GIL, so no lock is taken per chunk);
- the owner drains that queue in one batch before it next enters the kernel, and gives the
  buffers back to the kernel in one batch.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


class ReleaseQueue:
    """Chunks released but not yet given back. Any thread puts; only the owner drains.

    ``wait`` lets the owner sleep until something is released (back-pressure, exhaustion); the
    putter signals only while the owner is waiting, so the hot path costs one deque append.
    An event loop cannot block in ``wait``; it asks with ``notify`` for a callback instead.
    """

    __slots__ = ("_event", "_notify", "_q", "_waiting")

    def __init__(self) -> None:
        self._q: deque[Any] = deque()
        self._event = threading.Event()
        self._waiting = False
        self._notify: Callable[[], None] | None = None

    def put(self, item: Any) -> None:
        self._q.append(item)
        if self._waiting:
            self._signal()

    def put_many(self, items: Iterable[Any]) -> None:
        self._q.extend(items)
        if self._waiting:
            self._signal()

    def _signal(self) -> None:
        self._event.set()
        notify, self._notify = self._notify, None
        if notify is not None:
            notify()

    def notify(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once, from the thread that puts, at the next put (at once when
        something is already queued); None cancels. The owner's way to wait without blocking."""
        self._notify = callback
        self._waiting = callback is not None
        if callback is not None and self._q:
            self._signal()

    def drain(self) -> list[Any]:
        """Everything queued so far, oldest first (owner thread only).

        Another drain may run inside this one: the list's allocation can start a GC pass
        whose finalizer drains (a flush from ``__del__``). That drain takes what is left, and
        this one keeps what it had popped: every item goes to exactly one of them."""
        q = self._q
        n = len(q)
        if n < 2:  # one batch per round (recv_batch): no map over a repeat
            return [q.popleft()] if n else []
        # n pops in C (no Python frame per item); items other threads append meanwhile stay.
        out: list[Any] = []
        try:
            out.extend(map(deque.popleft, itertools.repeat(q, n)))
        except IndexError:  # a nested drain emptied the queue: extend kept what it had taken
            return out
        return out

    def __len__(self) -> int:
        return len(self._q)

    def wait(self, timeout: float | None) -> bool:
        """Sleep until something is queued or ``timeout`` passes; True when items are waiting."""
        if self._q:
            return True
        self._event.clear()
        self._waiting = True
        try:
            # Re-check after announcing we wait: a put between the check and the flag would
            # otherwise not set the event.
            if self._q:
                return True
            self._event.wait(timeout)
        finally:
            self._waiting = self._notify is not None
        return bool(self._q)


@dataclass(slots=True)  # zcnet.aio._loopaccel reads and writes the counters in place
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
