"""MSG_ZEROCOPY for TCP: send(MSG_ZEROCOPY) from buffer slots, each slot reused once the error
queue says the kernel is done with it (the completion model of ``zcnet.tx.zerocopy``).

``MsgZerocopySender`` is also the base of the devmem sender (``zcnet.tx.devmem``), which differs
only in what one send is (``_send_part``): the completions are the same.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from typing import TYPE_CHECKING

from zcnet.errors import ClosedError, Unsupported, ZcnetError
from zcnet.tx.slots import (
    FLUSH_TIMEOUT,
    SEND_TIMEOUT,
    WAIT_STEP,
    BoundedSends,
    SendStats,
    SlotHook,
    SlotSender,
    stuck,
)
from zcnet.tx.zerocopy import ZcTracker, read_completions, wait_completions
from zcnet.uapi.socket import MSG_ZEROCOPY, SO_ZEROCOPY, SOL_SOCKET

if TYPE_CHECKING:
    from zcnet.tx.slots import SendBuffer


class MsgZerocopySender(SlotSender):
    """send(MSG_ZEROCOPY); slots come back when their error-queue notification arrives."""

    kind = "msgzc"

    def __init__(self, sock: socket.socket, buf: SendBuffer, slots: int = 8,
                 on_fill: SlotHook | None = None, on_release: SlotHook | None = None) -> None:
        super().__init__(sock, buf, slots, on_fill, on_release)
        try:
            sock.setsockopt(SOL_SOCKET, SO_ZEROCOPY, 1)
        except OSError as exc:
            raise Unsupported(f"SO_ZEROCOPY refused: {exc.strerror}") from exc
        self.tracker = ZcTracker()
        self._bounded = BoundedSends(sock)

    def send(self, nbytes: int, timeout: float = SEND_TIMEOUT) -> int:
        """Send ``nbytes`` from the next free slot; returns once the kernel has taken them all.
        Waits at most about ``timeout`` seconds in all (for a slot to come back and for buffer
        space), then raises the stuck ZcnetError."""
        self._start_send(nbytes, timeout)
        slot = self._acquire()
        done = 0
        try:
            while done < nbytes:
                try:
                    n = self._send_part(slot, done, nbytes)
                except OSError as exc:
                    # ENOBUFS: the socket's optmem for pending notifications is used up;
                    # EAGAIN: the send buffer is full (or a wait cut by SO_SNDTIMEO). Both heal
                    # once completions are read.
                    if exc.errno not in (errno.ENOBUFS, errno.EAGAIN):
                        raise
                    self._stats.retries += 1
                    self._wait(writable=exc.errno == errno.EAGAIN)
                    continue
                self.tracker.submitted(slot)
                self._stats.sends += 1
                done += n
        finally:
            if not self.tracker.refs(slot):
                self._release(slot)  # nothing of it in flight (the first call failed)
        self._stats.bytes += nbytes
        return nbytes

    def _send_part(self, slot: int, start: int, end: int) -> int:
        """One send of bytes ``start:end`` of ``slot``; what the kernel took (an OSError as the
        kernel raised it)."""
        return self.sock.send(self.slots[slot][start:end], MSG_ZEROCOPY)

    def _reap(self, wait: bool, writable: bool = False, wait_s: float = WAIT_STEP) -> None:
        ranges = (wait_completions(self.sock, max(1, int(wait_s * 1000)), writable=writable)
                  if wait else read_completions(self.sock))
        for r in ranges:
            for slot in self.tracker.complete(r):
                self._release(slot)

    def _wait(self, writable: bool = False) -> None:
        """One bounded wait for completions (or buffer space) within the current send()'s
        deadline; the stuck error once it has passed."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise stuck(self.tracker.outstanding, self._timeout)
        self._reap(wait=True, writable=writable, wait_s=min(WAIT_STEP, left))

    def _wait_some(self) -> None:
        # Completions are read only when a slot is needed: one recvmsg usually returns a
        # coalesced range that frees several slots, instead of one empty read per send.
        self._reap(wait=False)
        if not self.free:
            self._wait()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait until every send's notification arrived (all slots free)."""
        if self._closed:
            raise ClosedError.of(self, "flush")
        deadline = time.monotonic() + timeout
        while self.tracker.outstanding:
            if time.monotonic() > deadline:
                raise stuck(self.tracker.outstanding, timeout)
            self._reap(wait=True)

    def close(self) -> None:
        """Wait (bounded) for outstanding notifications; the socket belongs to the caller."""
        if self._closed:
            return
        try:
            with contextlib.suppress(OSError, ZcnetError):
                self.flush()
        finally:
            self._closed = True
            self._bounded.restore()

    def stats(self) -> SendStats:
        s = super().stats()
        s.zerocopy, s.copied = self.tracker.zerocopy, self.tracker.copied
        s.pending = self.tracker.outstanding
        return s
