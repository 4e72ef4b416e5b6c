"""io_uring SEND_ZC for TCP, from a registered fixed buffer or from plain memory.

Some facts about SEND_ZC:
- A request posts two CQEs with its user_data: the send result (``F_MORE`` set when a
  notification will follow) and later the notification (``F_NOTIF``) once the kernel no longer
  references the memory. Only then may the slot be written again. A failed send without
  ``F_MORE`` has no notification.
- With IORING_SEND_ZC_REPORT_USAGE the notification's ``res`` has IORING_NOTIF_USAGE_ZC_COPIED
  (bit 31, so a negative int32: not an error) when the kernel copied after all.
- io_uring issues a send that meets a full socket buffer again later, from poll. A second send
  submitted meanwhile could overtake it and reorder the TCP stream, so we keep one *send* in
  flight (we wait for its result CQE, usually posted inside the same enter) while any number of
  *notifications* are outstanding. MSG_WAITALL makes the kernel finish a partial send itself.
- A SEND_ZC from a registered buffer backed by transparent huge pages can be charged far more
  socket memory than it sends. Seen here on loopback: 1 MiB sent from 1.5 MB into a huge page
  through a 64 KiB SO_SNDBUF parks in the kernel for good, the peer reading all along (from
  4 KiB into it, or from memory that is not registered, it completes at once). So the memory
  zcnet allocates for sending (:func:`send_buffer`) is never a THP, and ``send()`` gives up
  after a deadline instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import mmap
import socket
import time
from typing import TYPE_CHECKING

import numpy as np

from zcnet.errors import ClosedError, Unsupported, ZcnetError
from zcnet.tx.slots import FLUSH_TIMEOUT, SEND_TIMEOUT, SendStats, SlotHook, SlotSender, stuck
from zcnet.uapi import io_uring as u
from zcnet.uapi.socket import MSG_WAITALL
from zcnet.uring import bufring
from zcnet.uring.prep import prep_send_zc, prep_send_zc_fixed
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import cqe_error

if TYPE_CHECKING:
    from zcnet.tx.slots import SendBuffer

_COPIED = u.IORING_NOTIF_USAGE_ZC_COPIED


def send_buffer(size: int) -> mmap.mmap:
    """``size`` bytes of private anonymous memory to send from that is never a transparent huge
    page (MADV_NOHUGEPAGE; see the module docstring for why a SEND_ZC buffer must not be one),
    whatever the system's THP mode."""
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    return m


class SendZcSender(SlotSender):
    """SEND_ZC over ``sock`` from ``buf`` cut into ``slots`` slots (``fixed``: ``buf``
    registered with the ring as a fixed buffer).

    ``buf`` is used as given. If it is backed by transparent huge pages (a large bytearray or
    numpy array may be) a registered send can need more socket memory than a small SO_SNDBUF
    holds and never complete (see the module docstring): ``send()`` then raises after its
    ``timeout``. Memory from :func:`send_buffer` has no such risk.
    """

    kind = "sendzc"

    def __init__(self, sock: socket.socket, buf: SendBuffer, slots: int = 8,
                 on_fill: SlotHook | None = None, on_release: SlotHook | None = None, *,
                 fixed: bool = True) -> None:
        super().__init__(sock, buf, slots, on_fill, on_release)
        self.kind = "sendzc" if fixed else "sendzc-plain"
        self._stats.kind = self._stats.path = self.kind
        why = bufring.unsupported(u.IORING_OP_SEND_ZC)
        if why:
            raise Unsupported(why)
        self.fixed = fixed
        self.fd = sock.fileno()
        self._base = np.frombuffer(self.view, dtype=np.uint8).ctypes.data
        self._refs = [0] * len(self.slots)   # requests of a slot whose last CQE is pending
        self._want = [0] * len(self.slots)   # bytes the slot's current send carries
        self._done = [0] * len(self.slots)   # of which the kernel took so far
        self._sending = -1                   # slot whose send result is awaited
        entries = 1 << max(2 * len(self.slots), 4).bit_length()
        try:
            self.ring = Ring(entries, flags=u.IORING_SETUP_SUBMIT_ALL)
        except OSError as exc:
            raise Unsupported(f"io_uring unavailable: {exc.strerror}") from exc
        if fixed:
            try:
                bufring.register_buffers(self.ring, [(self._base, len(self.view))])
            except OSError as exc:
                self.ring.close()
                raise Unsupported(f"registering the send buffer failed: {exc.strerror}") from exc

    def in_flight(self, slot: int) -> int:
        """CQEs still due for this slot (0 means the kernel is done with its memory)."""
        if self._closed:
            raise ClosedError.of(self, "in_flight")
        return self._refs[slot]

    def _prep(self, slot: int, offset: int, length: int) -> None:
        addr = self._base + slot * self.slot_size + offset
        if self.fixed:
            prep_send_zc_fixed(self.ring, self.fd, addr, length, 0, user_data=slot,
                               msg_flags=MSG_WAITALL)
        else:
            prep_send_zc(self.ring, self.fd, addr, length, user_data=slot, msg_flags=MSG_WAITALL)
        self._refs[slot] += 1
        self._stats.sends += 1

    def send(self, nbytes: int, timeout: float = SEND_TIMEOUT) -> int:
        """Send ``nbytes`` from the next free slot; returns once the kernel has taken them all.

        Waits at most ``timeout`` seconds in all (for a slot to come back and for the send),
        then raises the stuck ZcnetError: the send may still be in the kernel, partly sent, so
        the stream's position is unknown; close the socket to give up on it. A later send()
        first waits for that one (the stream keeps its order)."""
        self._start_send(nbytes, timeout)
        while self._sending >= 0:  # a send that outlived an earlier deadline
            self._wait_some()
        slot = self._acquire()
        self._want[slot] = nbytes
        self._done[slot] = 0
        self._sending = slot
        self._prep(slot, 0, nbytes)
        # Usually the result is posted inside this enter; a send that must wait for buffer
        # space waits below, with the deadline.
        self.ring.submit()
        self._process()
        while self._sending >= 0:
            self._wait_some()
        self._stats.bytes += nbytes
        return nbytes

    def _process(self) -> None:
        # A failed send's notification may come in the same reap as its error: account every
        # CQE of the reap before raising, or that slot would stay in flight for good.
        failed: OSError | None = None
        done = self.ring.reap()
        for ud, res, flags in zip(done.user_data.tolist(), done.res.tolist(),
                                  done.flags.tolist(), strict=True):
            slot = int(ud)
            if flags & u.IORING_CQE_F_NOTIF:
                if res & _COPIED:
                    self._stats.copied += 1
                else:
                    self._stats.zerocopy += 1
                self._drop(slot)
                continue
            if not flags & u.IORING_CQE_F_MORE:
                self._refs[slot] -= 1  # no notification will follow this request
            if res < 0:
                self._finish_send(slot)
                failed = failed or cqe_error(res, "SEND_ZC")
                continue
            self._done[slot] += res
            left = self._want[slot] - self._done[slot]
            if left > 0:  # cut short (a signal): send the rest from the same slot
                self._prep(slot, self._done[slot], left)
            else:
                self._finish_send(slot)
        if failed is not None:
            raise failed

    def _finish_send(self, slot: int) -> None:
        self._sending = -1
        if not self._refs[slot]:
            self._release(slot)

    def _drop(self, slot: int) -> None:
        self._refs[slot] -= 1
        if self._refs[slot] < 0:
            raise RuntimeError(f"slot {slot} got more CQEs than requests")
        if not self._refs[slot] and slot != self._sending:
            self._release(slot)

    def _wait_some(self) -> None:
        """Wait for completions until the current send()'s deadline."""
        self._wait_until(self._deadline, self._timeout)

    def _wait_until(self, deadline: float, timeout: float) -> None:
        """Wait for completions until ``deadline`` (monotonic) and process them; the stuck
        error once it has passed. The wait itself carries the deadline: a send parked on a peer
        that stopped reading posts nothing, and close() (Ctrl-C) must not block on it forever."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise stuck(self.outstanding, timeout, self._stuck_hint())
        self.ring.submit(wait_nr=1, timeout=left)
        self._process()

    def _stuck_hint(self) -> str:
        try:
            sndbuf = f"{self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)} B"
        except OSError:
            sndbuf = "small"
        return ("the peer stopped reading (close the socket to give up), or a send needs more "
                f"than the send buffer (SO_SNDBUF {sndbuf}) holds, as one from a registered "
                "buffer on transparent huge pages can: send from zcnet.tx.sendzc.send_buffer() "
                "memory or raise SO_SNDBUF")

    @property
    def outstanding(self) -> int:
        return sum(self._refs)

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        if self._closed:
            raise ClosedError.of(self, "flush")
        deadline = time.monotonic() + timeout
        while self.outstanding:
            self._wait_until(deadline, timeout)

    def close(self) -> None:
        if self._closed:
            return
        try:
            with contextlib.suppress(OSError, ZcnetError):
                self.flush()
        finally:  # Ctrl-C in the wait too: closed from here on, and the ring goes
            self._closed = True
            # Closing the ring returns at once, a send still parked included (the kernel
            # cancels it); what the kernel still sends holds its own references to the pages,
            # so the caller may free the buffer after close() either way.
            self.ring.close()

    def stats(self) -> SendStats:
        s = super().stats()
        s.pending = self.outstanding
        return s
