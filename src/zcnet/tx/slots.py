"""The slot machinery every sender shares: a caller's buffer cut into equal slots, a slot
reused only once the kernel is done with it, fill/release hooks and the counters.

``SlotSender`` is the base of the senders in ``zcnet.tx.senders`` and ``zcnet.tx.sendzc``;
a subclass sets ``kind`` and implements ``_wait_some`` (block until a slot comes back),
``send``, ``flush`` and ``close``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.quantities import check
from zcnet.sockcheck import require_connected

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

    # What a sender sends from: a writable buffer (bytearray, mmap, numpy array ...). numpy's
    # stubs declare the buffer protocol from Python 3.12 only, hence the array named too.
    SendBuffer: TypeAlias = Buffer | np.ndarray

SlotHook = Callable[[int, memoryview], None]
FLUSH_TIMEOUT = 5.0  # seconds flush() and close() wait for outstanding completions
# Seconds one send() may wait for a free slot and for the kernel to take its bytes: far more
# than a slot of a few MiB takes to a peer that reads, so only a stuck send reaches it.
SEND_TIMEOUT = 30.0
WAIT_STEP = 1.0  # seconds one blocking wait lasts at most, so a deadline is checked between
_TIMEVAL = struct.Struct("@ll")  # struct timeval, SO_SNDTIMEO's value


@dataclass
class SendStats:
    kind: str            # what was asked for
    path: str            # what actually ran ("copy" after a fallback)
    sends: int = 0       # send operations issued (calls or SQEs)
    bytes: int = 0
    zerocopy: int = 0    # completions the kernel reported as zero-copy
    copied: int = 0      # completions reported as copied after all (COPIED / USAGE_ZC_COPIED)
    pending: int = 0     # sends whose completion has not arrived yet
    retries: int = 0     # ENOBUFS/EAGAIN waits
    note: str = ""

    def as_dict(self) -> dict[str, str | int]:
        return asdict(self)


class Sender(Protocol):
    """After ``close()`` only ``stats()`` (the final counters) and ``close()`` may be called;
    everything else raises ClosedError."""

    kind: str

    def send(self, nbytes: int) -> int: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def stats(self) -> SendStats: ...


def byte_view(buf: SendBuffer) -> memoryview:
    """``buf`` as writable bytes; a UsageError naming what it got otherwise."""
    try:
        view = memoryview(buf).cast("B")
    except TypeError:
        raise UsageError(f"the send buffer must be a writable buffer (bytearray, numpy array, "
                         f"mmap), not {type(buf).__name__}") from None
    if view.readonly:
        raise UsageError("the send buffer must be writable (slots are refilled)")
    return view


class SlotSender:
    """Buffer slots, hooks and stats shared by every kind."""

    kind = ""

    def __init__(self, sock: socket.socket, buf: SendBuffer, slots: int,
                 on_fill: SlotHook | None,
                 on_release: SlotHook | None) -> None:
        require_connected(sock, f"{self.kind} sender")
        if not isinstance(slots, int) or slots <= 0:
            raise UsageError(f"slots must be a positive integer, got {slots!r}")
        self.sock = sock
        self.view = byte_view(buf)
        self.slot_size = len(self.view) // slots
        if self.slot_size <= 0:
            raise UsageError(f"buffer of {len(self.view)} B cannot hold {slots} slots")
        self.slots = [self.view[i * self.slot_size:(i + 1) * self.slot_size]
                      for i in range(slots)]
        self.free = list(range(slots - 1, -1, -1))  # a stack: the warmest slot first
        self.on_fill = on_fill
        self.on_release = on_release
        self._stats = SendStats(self.kind, self.kind)
        self._closed = False
        self._deadline = 0.0          # of the current send() (monotonic)
        self._timeout = SEND_TIMEOUT  # its timeout, for the errors that name it

    def _start_send(self, nbytes: int, timeout: float) -> None:
        """The checks every send() makes before touching anything, and its deadline."""
        if self._closed:  # a zero-copy sender's memory may be unmapped: never touch it
            raise ClosedError.of(self, "send")
        if not 0 < nbytes <= self.slot_size:
            raise UsageError(f"send of {nbytes} B does not fit a {self.slot_size} B slot",
                             "give a larger buffer or fewer slots")
        if timeout is not SEND_TIMEOUT:  # the default is valid; send() is a hot path
            check("timeout", timeout, f"{type(self).__name__}.send timeout")
        self._deadline = time.monotonic() + timeout
        self._timeout = timeout

    def _acquire(self) -> int:
        while not self.free:
            self._wait_some()
        slot = self.free.pop()
        if self.on_fill:
            self.on_fill(slot, self.slots[slot])
        return slot

    def _release(self, slot: int) -> None:
        if self.on_release:
            self.on_release(slot, self.slots[slot])
        self.free.append(slot)

    def _wait_some(self) -> None:
        raise NotImplementedError

    def stats(self) -> SendStats:
        return SendStats(**asdict(self._stats))


class BoundedSends:
    """A blocking socket's send waits, each cut to :data:`WAIT_STEP` with SO_SNDTIMEO for as long
    as a sender uses the socket, and the socket's own value back at ``restore()``.

    A blocking ``send`` to a peer that stopped reading would otherwise sleep in the kernel for
    good, past any deadline; this way it returns (a short count, or EAGAIN) and the sender
    checks its deadline. The send path keeps its one system call per send: nothing is set per
    call. A non-blocking socket (or one with a Python timeout) is left as it is."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.saved: bytes | None = None
        if sock.gettimeout() is None:
            self.saved = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TIMEVAL.size)
            sec = int(WAIT_STEP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                            _TIMEVAL.pack(sec, int((WAIT_STEP - sec) * 1e6)))

    def restore(self) -> None:
        """Give the socket its own SO_SNDTIMEO back (nothing if it is closed already)."""
        saved, self.saved = self.saved, None
        if saved is not None and self.sock.fileno() >= 0:
            with contextlib.suppress(OSError):  # the peer reset: the socket is dead either way
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, saved)


def stalled(done: int, nbytes: int, timeout: float) -> ZcnetError:
    """The error for a copy send() whose bytes the kernel did not take within its deadline."""
    return ZcnetError(f"send of {nbytes} B stalled: {done} B taken by the kernel in "
                      f"{timeout:g} s (the rest was not sent)",
                      "the peer stopped reading: close the socket to give up, or pass send() a "
                      "longer timeout")


def stuck(pending: int, timeout: float,
          hint: str = "the peer stopped reading; close the socket to give up on them"
          ) -> ZcnetError:
    """The error for zero-copy sends the kernel still holds when flush() (or a send() with a
    deadline) gives up; ``hint`` names the causes and the fix."""
    return ZcnetError(f"{pending} zero-copy sends still unacknowledged after {timeout:g} s",
                      hint)
