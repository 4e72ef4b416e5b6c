"""TCP send paths behind one interface, for every sender in zcnet.

``make_sender(kind, sock, buf)`` returns a :class:`Sender` whose ``send(nbytes)`` sends
``nbytes`` from the caller's buffer and returns once the kernel has taken them all:

=============  ==========================================================================
kind           how
=============  ==========================================================================
copy           send(): the kernel copies; the buffer is free again when the call returns
msgzc          send(MSG_ZEROCOPY); completions from the error queue (ranges, coalesced)
sendzc         io_uring SEND_ZC from ``buf`` registered as a fixed buffer
sendzc-plain   io_uring SEND_ZC from plain (unregistered) memory
devmem         sendmsg(MSG_ZEROCOPY) of dma-buf offsets with SCM_DEVMEM_DMABUF: the device
               reads the payload from a dma-buf bound to it (``buf``: a ``Udmabuf``)
=============  ==========================================================================

Zero-copy kinds split ``buf`` into ``slots`` equal slots and send from a free one; a slot is
reused only after the kernel said it is done with it (the error-queue notification, or the
F_NOTIF CQE), which ``on_release(slot, view)`` observes; ``on_fill(slot, view)`` runs before a
slot is sent, so callers that care about content write it there. ``stats()`` counts sends the
kernel completed truly zero-copy and those it copied after all. When the kernel refuses the
zero-copy path the sender falls back to ``copy`` and says so in ``stats().note``; devmem never
does (a copy would send other memory and measure another path): its refusal is the error.

``make_sender`` takes an open, connected TCP socket and says so up front otherwise. The classes
themselves also take a connected UDP socket (each send one datagram): zero-copy completions are
the same there, and a UDP flow into a device that frees packets is the one way to see true
zero-copy on a machine without a NIC (the tests do that).
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from zcnet.errors import ClosedError, Unsupported, UsageError
from zcnet.sockcheck import require_tcp
from zcnet.tx.devmem import DevmemSender, DmabufMemory
from zcnet.tx.msgzc import MsgZerocopySender
from zcnet.tx.sendzc import SendZcSender
from zcnet.tx.slots import (
    FLUSH_TIMEOUT,
    SEND_TIMEOUT,
    WAIT_STEP,
    BoundedSends,
    Sender,
    SendStats,
    SlotHook,
    SlotSender,
    stalled,
)

if TYPE_CHECKING:
    from zcnet.tx.slots import SendBuffer

# Part of this module's interface: callers type and time their senders with these.
__all__ = ["FLUSH_TIMEOUT", "KINDS", "CopySender", "DevmemSender", "MsgZerocopySender",
           "SendStats", "SendZcSender", "Sender", "SlotHook", "fill_pattern", "make_sender"]


class CopySender(SlotSender):
    """Plain send(): the buffer is the kernel's copy source only during the call."""

    kind = "copy"

    def __init__(self, sock: socket.socket, buf: SendBuffer, slots: int = 1,
                 on_fill: SlotHook | None = None, on_release: SlotHook | None = None,
                 note: str = "", kind: str = "copy") -> None:
        super().__init__(sock, buf, slots, on_fill, on_release)
        self._stats = SendStats(kind, "copy", note=note)
        self._bounded = BoundedSends(sock)

    def send(self, nbytes: int, timeout: float = SEND_TIMEOUT) -> int:
        """Send ``nbytes``; returns once the kernel has taken them all. Waits at most about
        ``timeout`` seconds for buffer space, then raises the stalled ZcnetError (the bytes
        before the stall were sent: the stream's position is lost, close the socket)."""
        self._start_send(nbytes, timeout)
        slot = self._acquire()
        view = self.slots[slot]
        done = 0
        try:
            while done < nbytes:
                try:
                    n = self.sock.send(view[done:nbytes])
                except BlockingIOError:  # non-blocking socket, or a wait cut by SO_SNDTIMEO
                    n = 0
                self._stats.sends += 1
                done += n
                if done < nbytes:
                    left = self._deadline - time.monotonic()
                    if left <= 0:
                        raise stalled(done, nbytes, timeout)
                    if not n:
                        self._stats.retries += 1
                        select.select([], [self.sock], [], min(WAIT_STEP, left))
        finally:
            self._stats.bytes += done
            self._release(slot)
        return nbytes

    def _wait_some(self) -> None:  # slots are never held across calls
        raise AssertionError("unreachable")

    def flush(self) -> None:
        if self._closed:
            raise ClosedError.of(self, "flush")

    def close(self) -> None:
        self._closed = True
        self._bounded.restore()


KINDS: dict[str, Callable[..., Sender]] = {
    "copy": CopySender,
    "msgzc": MsgZerocopySender,
    "sendzc": partial(SendZcSender, fixed=True),
    "sendzc-plain": partial(SendZcSender, fixed=False),
    "devmem": DevmemSender,
}
# Kinds never replaced by copy: a copy would send other memory by another path, so the
# device's refusal is the answer.
NO_FALLBACK = frozenset({"devmem"})


def make_sender(kind: str, sock: socket.socket, buf: SendBuffer | DmabufMemory, *,
                slots: int = 8, on_fill: SlotHook | None = None,
                on_release: SlotHook | None = None) -> Sender:
    """A sender of ``kind`` over ``sock`` (an open, connected TCP socket: checked here, a
    UsageError otherwise) using ``buf``; falls back to copy with a note (except devmem, whose
    ``buf`` is a dma-buf: see ``zcnet.tx.devmem``)."""
    build = KINDS.get(kind)
    if build is None:
        raise UsageError(f"unknown send kind {kind!r}", f"choose from {', '.join(KINDS)}")
    require_tcp(sock, f"{kind} sender")
    try:
        return build(sock, buf, slots, on_fill, on_release)
    except Unsupported as exc:
        if kind in NO_FALLBACK:
            raise
        return CopySender(sock, buf, slots, on_fill, on_release, kind=kind,
                          note=f"{kind} unavailable, sent by copy: {exc.message}")


def fill_pattern(view: memoryview, seed: int) -> None:
    """Write a recognizable pattern (used by tests and examples): byte i = (seed + i) % 251."""
    arr = np.frombuffer(view, dtype=np.uint8)
    arr[:] = (np.arange(len(arr), dtype=np.uint32) + seed) % 251
