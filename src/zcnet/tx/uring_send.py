"""The ``uring`` txbench mode: a burst of SEND SQEs and one io_uring_enter that submits them all
and waits for their completions.

Some facts about io_uring SEND on a UDP socket: each SQE is issued inline during the enter, in
order, so packets leave in sequence order; one that meets a full send buffer (EAGAIN) is parked on
poll and retried by the kernel, so only errors that a retry would not fix reach the CQE, plus
ENOBUFS, which we count and resend like the other modes do. With SINGLE_ISSUER|DEFER_TASKRUN the
CQEs are posted inside that same enter, so a burst costs one system call end to end.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

import numpy as np

from zcnet.errors import ClosedError, Unsupported
from zcnet.tx import payload
from zcnet.tx.udp_modes import BurstSender, SendCounters
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring

RING_FLAGS = u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN | \
    u.IORING_SETUP_SUBMIT_ALL


def open_ring(entries: int) -> Ring:
    """A ring for one sending thread; Unsupported when io_uring is off (sysctl, seccomp)."""
    try:
        return Ring(entries, flags=RING_FLAGS)
    except OSError as exc:
        raise Unsupported(f"io_uring unavailable: {exc.strerror}",
                          "check kernel.io_uring_disabled and container seccomp") from exc


class UringSender(BurstSender):
    mode = "uring"

    def __init__(self, sock: socket.socket, lengths: Sequence[int],
                 counters: SendCounters | None = None) -> None:
        super().__init__(sock, lengths, counters)
        entries = 1 << max(self.burst - 1, 1).bit_length()
        self.ring = open_ring(entries)
        self.rows = np.zeros((self.burst, int(self.lengths.max())), dtype=np.uint8)
        payload.fill(self.rows)
        self._seqcol = payload.seq_column(self.rows)
        self._arange = np.arange(self.burst, dtype=np.uint64)
        base = self.rows.ctypes.data
        self._addrs = (base + np.arange(self.burst, dtype=np.uint64) * self.rows.strides[0])
        self._lens = self.lengths.astype(np.uint32)

    def _stamp(self, seq: int) -> None:
        if self._seqcol is not None:
            np.add(self._arange, seq, out=self._seqcol)
        else:
            payload.stamp(self.rows, seq)

    def send_burst(self) -> int:
        if self._closed:  # the ring's memory is unmapped: touching it would crash
            raise ClosedError.of(self, "send_burst")
        self._stamp(self.seq)
        todo = self._arange  # user_data = index in the burst
        enters = 0
        while len(todo):
            idx = todo.astype(np.intp)
            self.ring.prep_batch(u.IORING_OP_SEND, todo, fd=self.fd, addr=self._addrs[idx],
                                 length=self._lens[idx])
            self.ring.submit(wait_nr=len(todo))
            enters += 1
            done = self.ring.reap()
            failed = done.res < 0
            if failed.any():
                first = int(-done.res[failed][0])
                self._failed(OSError(first, errno.errorcode.get(first, str(first))))
                todo = np.sort(done.user_data[failed])
            else:
                todo = todo[:0]
        return self._done(enters)

    def close(self) -> None:
        super().close()
        self.ring.close()
