"""How steady a flow was, and how busy the machine was around it.

A flow's receiver samples, every ``interval`` seconds, the bytes its socket has received
(TCP_INFO ``tcpi_bytes_received``, in which the peer's FIN counts as one byte) and the tasks
running on the machine (``/proc/loadavg``'s fourth field, the kernel's nr_running), from a
thread beside the receive loop: the engines' loops stay as they are. The coefficient of
variation (stdev / mean) of the per-interval rate says whether one cell's number is a steady
rate or an average of something that wandered.

Some facts that shape it: TCP on veth reaches its rate within a few milliseconds, but the first
interval also holds the connection's start and the last one the drain after the sender
stopped, so both are left out of the spread. nr_running counts every runnable task, the
sampler itself included (it is running when it reads, so it is taken off), and kernel threads
such as ksoftirqd, which takes the flow's own receive softirq under load; so the tasks beside
the flow's own are an upper bound, and zcnet.bench.busy allows for one such thread.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from pathlib import Path
from types import TracebackType

from zcnet.bench import tcpinfo
from zcnet.bench.records import Intervals

# A cell whose per-interval rate varies more than this (stdev / mean) gets a warning; the same
# limit the reports apply to repeats (zcnet.report.stats).
UNSTABLE_CV = 0.10
MIN_INTERVALS = 4  # fewer usable intervals say nothing about spread
UNSTEADY = "rate not steady"  # how a row's warning about its spread begins


def interval_for(duration: float) -> float:
    """About 20 intervals per flow however long it runs (a results message stays small with
    hundreds of flows), none shorter than 0.1 s."""
    return max(0.1, duration / 20)


def running_tasks(path: str = "/proc/loadavg") -> int | None:
    """The tasks running or runnable right now (nr_running), or None where it cannot be read."""
    try:
        return int(Path(path).read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


class IntervalSampler:
    """Samples ``sock``'s received bytes and the machine's running tasks from a thread, every
    ``interval`` seconds, while the ``with`` block runs; ``record()`` holds the intervals.

    ``received``: the socket's tcpi_bytes_received before the sender could start (read at
    accept). The sender starts when told, not when this sampler is ready, so bytes can arrive
    before ``__enter__``; counted from ``received`` they land in the first interval (left out
    of the spread) and the intervals add up to the flow."""

    def __init__(self, sock: socket.socket, interval: float, received: int | None = None) -> None:
        self.sock = sock
        self.interval = interval
        self._start_bytes = received  # what the socket had received before the flow began
        self.seconds: list[float] = []
        self.bytes: list[int] = []
        self.running: list[int] = []
        self._last_t: float = 0.0
        self._last_b: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zcnet-intervals", daemon=True)

    def _received(self) -> int | None:
        try:
            return tcpinfo.read(self.sock).get("tcpi_bytes_received")
        except OSError:  # the engine closed the socket: the flow is over
            return None

    def _sample(self) -> bool:
        """Close the interval since the last sample; False once the socket is gone."""
        now, got = time.monotonic(), self._received()
        if got is None or self._last_b is None:
            return False
        self.seconds.append(round(now - self._last_t, 6))
        self.bytes.append(got - self._last_b)
        self._last_t, self._last_b = now, got
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            running = running_tasks()
            if not self._sample():
                return
            if running is not None:
                self.running.append(max(0, running - 1))  # not the sampler itself

    def __enter__(self) -> IntervalSampler:
        now = self._received()
        self._last_t = time.monotonic()
        self._last_b = now if self._start_bytes is None or now is None else self._start_bytes
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        if et is None:
            self._sample()  # the last, shorter interval: the intervals add up to the flow

    def record(self) -> Intervals:
        return Intervals(interval=self.interval, seconds=self.seconds, bytes=self.bytes,
                         running=self.running)


def spread(intervals: Intervals | None) -> float | None:
    """The coefficient of variation of a flow's per-interval rate, its first and last intervals
    left out; None when too few intervals (or no data) remain."""
    if intervals is None:
        return None
    pairs = list(zip(intervals.seconds, intervals.bytes, strict=False))
    rates = [b / s for s, b in pairs[1:-1] if s > 0]
    if len(rates) < MIN_INTERVALS:
        return None
    mean = statistics.fmean(rates)
    if mean <= 0:
        return None
    return statistics.stdev(rates) / mean


def others_running(intervals: Intervals | None, own: int) -> float | None:
    """The median count of running tasks beyond the flow's ``own`` (its receiver, and its sender
    when that runs on this machine too), or None when nothing was sampled."""
    if intervals is None or not intervals.running:
        return None
    return max(0.0, statistics.median(intervals.running) - own)
