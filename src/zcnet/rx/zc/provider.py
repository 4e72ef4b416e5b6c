"""What a zero-copy provider (soft, zcrx, devmem) offers the Receiver.

A provider owns the kernel side: the ring or socket that fills the area, and the path buffers
take back to the kernel. It knows nothing of chunks, threads or statistics; the Receiver does the
bookkeeping and calls the provider only from the owner thread.

The rest is what the providers share: building an object on top of one that must be closed
when the build fails (``build_or_close``); for the io_uring providers (soft, soft_inc, zcrx) the
request ids, ring flags, waiting for and reaping completions, reading the final CQE of a
multishot receive, and cancelling one before the ring goes (``close_ring``); for the two soft
providers their buffer ring's group, sizing and stop reasons.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from zcnet.errors import UsageError, require_int
from zcnet.rx.zc.area import Area
from zcnet.uapi import io_uring as u
from zcnet.uring.prep import prep_cancel
from zcnet.uring.ring import Completions, Ring

# user_data of the one multishot receive request, and of its cancel.
RECV_UD = 1
CANCEL_UD = 2
# Every io_uring provider's ring: completions are posted only inside our own io_uring_enter
# (zcrx requires it, and it is the cheapest mode), and a failing SQE does not stop the batch.
RING_FLAGS = (u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN
              | u.IORING_SETUP_SUBMIT_ALL)

# The soft providers' task-run mode. Their rings are woken by our own enter (DEFER_TASKRUN)
# unless the opener watches them through an eventfd on a kernel that signals it late: zcnet.aio
# then opens them inside ``SOFT_TASKRUN.set(COOP_TASKRUN)`` (zcnet.aio.taskrun). zcrx ignores
# it: it needs DEFER_TASKRUN.
SOFT_TASKRUN: contextvars.ContextVar[int] = contextvars.ContextVar(
    "zcnet_soft_taskrun", default=u.IORING_SETUP_DEFER_TASKRUN)


def soft_ring_flags() -> int:
    """RING_FLAGS with the task-run mode of ``SOFT_TASKRUN``."""
    return RING_FLAGS & ~u.IORING_SETUP_DEFER_TASKRUN | SOFT_TASKRUN.get()

# The soft providers' buffer ring: its group id, its largest size, and what a final multishot
# CQE's errno means when it does not end the stream (see note_final).
BGID = 0
MAX_ENTRIES = 32768
SOFT_STOPS = {errno.ENOBUFS: "exhausted", errno.ECANCELED: "rearm"}
# Why a soft provider's copy count is everything it delivered.
SOFT_COPIES = "soft provider: the kernel copies every byte into the provided buffers"


#: What a provider delivers per buffer: a list of ints, or (vectorizing providers) an array.
IntSeq = list[int] | np.ndarray


@dataclass
class Delivery:
    """What one reap produced: parallel lists, one entry per received fragment.

    ``end`` is None while the stream continues, 0 at EOF, or -errno when the stream failed.
    ``stopped`` is set when delivery stopped without ending the stream (buffers exhausted, CQ
    overflow): the receive core re-arms once it may. Offsets, lengths and tokens are lists,
    or arrays from a provider that vectorizes its round.
    """

    offsets: IntSeq = field(default_factory=list)
    lengths: IntSeq = field(default_factory=list)
    tokens: IntSeq = field(default_factory=list)
    #: devmem only: fragments that arrived in host memory instead of the area, by list position
    #: (their offset and token are -1); rare, and a setup problem the provider reports.
    linear: dict[int, bytes] = field(default_factory=dict)
    end: int | None = None
    stopped: str | None = None


@dataclass(frozen=True)
class CopyCount:
    """How many received bytes the kernel copied, and where that number comes from.

    ``bytes`` None: unknown, ``source`` says why. ``every_byte``: the provider copies all it
    delivers by construction (``bytes`` is then None and the receiver's delivered count)."""

    bytes: int | None
    source: str
    every_byte: bool = False


class Provider(Protocol):
    """The provider model: the kernel side of one receiver. Its round function is ``reap``
    (completions in, a Delivery out); the receive core (zcnet.rx.zc.core) owns the receive's
    state (armed, stopped, ended), so a provider only acts: arm, reap, recycle, close."""

    name: str
    area: Area
    #: Why this provider was chosen (for "auto") or a note about its setup.
    note: str

    @property
    def ring(self) -> Ring | None:
        """The io_uring whose completions deliver the data, for an event loop to wait on;
        None when the provider reads the socket itself (devmem), shares a ring (a loop's), or
        is closed."""

    def arm(self) -> None:
        """Start (or restart) delivery into the area."""

    def can_arm(self) -> bool:
        """True when the kernel has buffers to fill, so arming will not stop at once."""

    def reap(self, timeout: float | None) -> Delivery:
        """Wait up to ``timeout`` seconds (None: until something happens) and collect what the
        kernel delivered."""

    def recycle(self, tokens: IntSeq, lengths: IntSeq) -> None:
        """Give buffers back to the kernel; a provider that cannot take them all now (refill
        ring full) holds the rest and retries on the next call, it never drops one."""

    def held_back(self) -> int:
        """Buffers released by the application but not yet accepted by the kernel."""

    def extra_stats(self) -> dict[str, int]:
        """Provider-specific counters (refill_full, rearms, ...)."""

    def kernel_copy(self) -> CopyCount:
        """The bytes the kernel copied rather than placing them by DMA (readable after
        close)."""

    def quiesce(self, armed: bool) -> bool:
        """Ahead of close: stop the receive if ``armed`` (and it can be stopped), so the
        releases given back next leave the provider's buffers whole. True when no receive
        is armed any more."""

    def recycle_closed(self, tokens: list[int]) -> None:
        """Buffers released after close (any thread): back to whoever outlives the receiver
        (an event loop's pool, a shared zcrx queue), or nowhere."""

    def watch_releases(self, released: Sized) -> None:
        """The receiver's queue of released chunks not yet given back (a provider that shares
        its kernel side with other receivers tells from it that this one has work)."""

    def area_done(self, area: Area) -> None:
        """The receiver is closed and holds none of ``area`` any more: unmap it, or tell
        whoever shares it (a zcrx queue's other connections)."""

    def close(self, armed: bool = False) -> bool:
        """Release kernel resources, cancelling the receive first when ``armed``; the area
        stays mapped (chunks may still be held). True when no receive can write to the area
        any more (False: a cancel the kernel did not confirm). Idempotent; afterwards arm,
        can_arm, reap and recycle raise ClosedError (their memory is unmapped), while
        held_back, extra_stats and kernel_copy still read."""


class NicProvider(Provider, Protocol):
    """A provider registered on a NIC queue (zcrx, devmem): it may be opened before the
    connection exists (an engine registers the queue first) and names its device."""

    #: The interface it registered on (None: zcrx's copy mode, no device).
    ifname: str | None

    def attach(self, fd: int) -> None:
        """Receive from ``fd`` (registration does not need the socket, so it can come first)."""


class ProviderBase:
    """What most providers share of the model: no held-back buffers, nothing to stop ahead of
    close, nothing to do with buffers released after it, an area of their own."""

    __slots__ = ()

    def held_back(self) -> int:
        return 0

    def quiesce(self, armed: bool) -> bool:
        return not armed

    def recycle_closed(self, tokens: list[int]) -> None:
        return None

    def watch_releases(self, released: Sized) -> None:
        return None

    def area_done(self, area: Area) -> None:
        area.close()


T = TypeVar("T")


def build_or_close(build: Callable[[], T], *cleanups: Callable[[], object]) -> T:
    """``build()``; when it raises, run ``cleanups`` in the order given (each one even when an
    earlier one fails) and re-raise. Used as "allocate, then build on it": the allocation is
    released exactly when nothing took it over."""
    with contextlib.ExitStack() as undo:
        for cleanup in reversed(cleanups):
            undo.callback(cleanup)
        built = build()
        undo.pop_all()
    return built


def reap_ready(ring: Ring, timeout: float | None) -> Completions:
    """The completions that are ready; when none are, first wait up to ``timeout`` seconds
    (None: until one arrives) in one enter, which also runs the deferred task work."""
    if not ring.cq_ready():
        ring.submit(1, timeout)
    return ring.reap()


def note_final(out: Delivery, res: int, stops: Mapping[int, str]) -> None:
    """Record in ``out`` what the final CQE (no F_MORE) of a multishot receive means: res 0 is
    EOF; a positive res is data whose CQE took the multishot's end, so re-arm (a bundle that
    took the buffer ring's last buffer, the common case, or no CQ room for another CQE); an
    errno in ``stops`` stops delivery for that reason (the Receiver re-arms when it may); any
    other errno ends the stream."""
    if res == 0:
        out.end = 0
    elif res > 0:
        out.stopped = "rearm"
    elif (why := stops.get(-res)) is not None:
        out.stopped = why
    else:
        out.end = res


def buffer_count(area_size: int, buf_size: int) -> int:
    """Largest power of two of whole buffers that fit (the buffer ring's size rule)."""
    require_int("buf_size", buf_size, "pass buf_size= a whole number of bytes, e.g. 64 << 10")
    if buf_size <= 0 or buf_size % 64:
        raise UsageError(f"buffer size must be a positive multiple of 64, got {buf_size}")
    n = min(area_size // buf_size, MAX_ENTRIES)
    if n < 2:
        raise UsageError(f"area of {area_size} bytes holds fewer than 2 buffers of {buf_size}",
                         "grow the area or shrink the buffer size")
    return 1 << (n.bit_length() - 1)


def close_ring(ring: Ring, armed: bool, *closers: Callable[[], object]) -> bool:
    """Close an io_uring provider's ring: cancel the receive when ``armed`` (see
    cancel_multishot), run ``closers`` in order (what maps memory the kernel writes: a buffer
    ring, a refill region), then close the ring. Every step runs even when an earlier one
    fails (Ctrl-C in the cancel wait), so no mapping outlives close. True when the receive is
    known to be over."""
    with contextlib.ExitStack() as undo:
        undo.callback(ring.close)
        for close in reversed(closers):
            undo.callback(close)
        return not armed or cancel_multishot(ring, RECV_UD, CANCEL_UD)


def cancel_multishot(ring: Ring, user_data: int, cancel_user_data: int,
                     seen: Callable[[Completions], object] | None = None) -> bool:
    """Cancel the multishot request ``user_data`` and wait for its final CQE, so the kernel is
    done with the area before the ring goes. The wait is bounded (50 x 0.1 s): a stuck cancel
    must not hang close. True when the final CQE was seen. ``seen`` gets every CQE reaped
    meanwhile (buffers they carry that must go back somewhere: zcnet.aio.pool)."""
    prep_cancel(ring, user_data, cancel_user_data)
    ring.submit()
    for _ in range(50):
        ring.submit(1, 0.1)
        c = ring.reap()
        if seen is not None:
            seen(c)
        if ((c.user_data == user_data) & ((c.flags & u.IORING_CQE_F_MORE) == 0)).any():
            return True
    return False
