"""The receive-engine contract: what an engine is, its options, its statistics, its consumer.

An engine reads a connected TCP socket to EOF as fast as it can and hands each received chunk to
an optional :data:`Consumer` as a uint8 numpy view, in stream order, before the memory is reused
(``--verify`` is such a consumer). ``unsupported()`` says why it cannot run here (asked before a
benchmark cell starts, so the table shows ``n/a``); ``close()`` releases what it acquired before
``run()`` (zcrx and devmem register a NIC queue in ``unsupported()``).

Engines live in :mod:`zcnet.rx.copying` (copying engines) and :mod:`zcnet.rx.zc.engines`
(zero-copy engines); :mod:`zcnet.rx.registry` lists them. Both sides of the benchmark (the CLI
that checks options, the server that sizes memory, the worker that runs the engine) use
:class:`EngineOptions` from here, so an option and its default are spelled once.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from zcnet.errors import UsageError
from zcnet.sockcheck import RCVLOWAT as RCVLOWAT  # callers read the engines' threshold here

Consumer = Callable[[np.ndarray], object]

# Zero-copy area defaults: 1 MiB buffers keep the kernel's per-buffer cost (iovec setup, CQE, ring
# entry) small next to the copy; measured here, they took ~15% less kernel CPU per byte than
# 64 KiB ones (benchmarks/zc_rx.py prints CPU per GiB). An area holds 16 of them (zcrx, devmem:
# the NIC's queue fills from it).
ZC_BUF = 1 << 20
ZC_AREA_BUFFERS = 16
# soft-zc's area holds 2: the kernel's copy then writes into memory the receiving CPU's cache
# still holds (2 MiB, the L2 of this machine's CPUs). On loopback, interleaved runs of
# benchmarks/zc_rx.py's engines: 70.6-73.1 Gbit/s against 63.5-64.9 with 16 (the consumer
# thread 67.7 against 61.4); in the lab, where the sender's CPU is the limit, no change.
# The provider's back-pressure (a full area ends the multishot receive until a release) is the
# same code either way; it simply runs more often.
SOFT_AREA_BUFFERS = 2
CONSUMERS = ("same", "thread")


@dataclass
class RxStats:
    bytes: int = 0
    first: float = 0.0  # monotonic time of the first byte
    last: float = 0.0   # monotonic time of the last byte
    calls: int = 0      # syscalls (recv or io_uring_enter)
    # Engine counters; zero-copy engines add their kernel-copy fields (str, float or None).
    extra: dict[str, Any] = field(default_factory=dict)

    def seconds(self) -> float:
        return max(self.last - self.first, 1e-9)

    def note(self, n: int) -> None:
        now = time.monotonic()
        if not self.bytes:
            self.first = now
        self.bytes += n
        self.last = now


@dataclass
class EngineOptions:
    bufsize: int = 1 << 20        # epoll/uring: one receive buffer of this size
    mshot_buf: int = 64 << 10     # uring-mshot: size of each provided buffer
    mshot_entries: int = 256      # uring-mshot: buffers in the ring (power of two)
    bundle: bool = True           # uring-mshot: use bundles when the kernel has them
    # Zero-copy engines: release in the ring's thread ("same") or hand each batch to a consumer
    # thread that reads and releases it ("thread": the release crosses threads), pinned to
    # consumer_cpu when given.
    consumer: str = "same"
    consumer_cpu: int | None = None
    ifname: str | None = None     # zcrx/devmem: the NIC and queue the flow is steered to
    queue: int | None = None
    queues: int | str | None = None  # devmem: several queues, "1,2" (one binding over them)
    zc_buf: int = 0               # soft-zc: buffer size (0: ZC_BUF)
    zc_area: int = 0              # zero-copy area size (0: the engine's default count of buffers)
    zc_incremental: bool = False  # soft-zc: incrementally consumed buffers (IOU_PBUF_RING_INC)
    zc_debug: bool = False        # poison released chunks to catch use after release
    zc_rx_buf_len: int = 0        # zcrx: receive buffer size (rx_buf_len; 0: one page)
    # SO_RCVLOWAT: bytes queued before the reader is woken (0: the kernel's 1 byte); None: the
    # engine's own default (its ``default_rcvlowat``).
    rcvlowat: int | None = None

    def rcvlowat_for(self, engine: Engine) -> int:
        """The SO_RCVLOWAT ``engine`` sets: the option when given, else the engine's default."""
        return engine.default_rcvlowat if self.rcvlowat is None else self.rcvlowat

    def queue_set(self) -> tuple[int, ...]:
        """The queues named by ``queues`` ("1,2") or ``queue`` (both: they must agree)."""
        if self.queues is None:
            return () if self.queue is None else (self.queue,)
        try:
            qs = tuple(sorted({int(q) for q in str(self.queues).split(",")}))
        except ValueError:
            qs = ()
        if not qs or min(qs) < 0:
            raise UsageError(f"engine option queues={self.queues!r}: expected queue ids "
                             "separated by commas", "e.g. queues=1,2")
        if self.queue is not None and self.queue not in qs:
            raise UsageError(f"engine options queue={self.queue} and queues={self.queues} "
                             "disagree", "give one of them")
        return qs

    def zc_buf_bytes(self) -> int:
        """The soft provider's buffer size."""
        return self.zc_buf or ZC_BUF

    def area_bytes(self, buffers: int = ZC_AREA_BUFFERS) -> int:
        """The size of the area a zero-copy engine (soft-zc, zcrx, devmem) registers: the
        ``zc_area`` option, else ``buffers`` buffers (the engine's default count)."""
        return self.zc_area or buffers * self.zc_buf_bytes()

    def mshot_ring_bytes(self) -> int:
        """The memory of uring-mshot's provided buffer ring."""
        return self.mshot_buf * self.mshot_entries

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], **overrides: object) -> EngineOptions:
        """Options from KEY=VALUE pairs (a CLI, a protocol message), checked: an unknown name or
        a value of the wrong type is a UsageError naming the option and what it takes.
        ``overrides`` win over ``values``."""
        merged = {**values, **overrides}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in merged.items():
            f = fields.get(key)
            if f is None:
                raise UsageError(f"unknown engine option {key!r}",
                                 f"engine options are {', '.join(fields)}")
            if not _fits(value, str(f.type)):
                raise UsageError(f"engine option {key}={value!r}: expected {f.type}")
        return cls(**merged)  # type: ignore[arg-type]


def _fits(value: object, annotation: str) -> bool:
    """Whether ``value`` fits one of EngineOptions' annotations (bool is not an int here)."""
    kinds = {"int": int, "str": str, "bool": bool, "None": type(None)}
    allowed = [kinds[part.strip()] for part in annotation.split("|")]
    if isinstance(value, bool):
        return bool in allowed
    return any(isinstance(value, k) for k in allowed if k is not bool)


class Engine(Protocol):
    name: ClassVar[str]
    #: SO_RCVLOWAT when the ``rcvlowat`` option is not given (see :data:`RCVLOWAT`).
    default_rcvlowat: ClassVar[int]

    def unsupported(self) -> str | None:
        """Why the engine cannot run here, or None."""

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        """Read the connected TCP socket ``sock`` to EOF (checked first: UsageError for a
        closed, listening, unconnected or non-TCP socket)."""

    def close(self) -> None:
        """Release what the engine acquired outside run(); idempotent."""


def close_engine(engine: Engine) -> None:
    """Release what ``engine`` acquired outside run()."""
    engine.close()
