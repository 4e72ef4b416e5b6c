"""The ring: setup, mmap, SQE filling (one or a batch), one enter per batch, vectorized reap.

Some facts about ordering between us and the kernel:
- SQ: the kernel reads ``ktail`` inside our own io_uring_enter (we never use SQPOLL), so the
  store to ``ktail`` and the SQE stores before it are seen in program order; no barrier needed.
- CQ: with DEFER_TASKRUN completions are posted inside our io_uring_enter too. Without it the
  kernel may post from another CPU; it writes the CQE before ``ktail`` (smp_store_release). On
  x86 (TSO) loads are not reordered with loads, so reading ``ktail`` and then the CQEs is enough.
  Weakly ordered CPUs would need an acquire load here: ``_acquire_ktail`` is the one place.
- numpy scalar reads/writes of a u32 in shared memory are single aligned accesses.
Fields in shared ring memory have a ``k`` prefix, as in liburing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import time
from dataclasses import dataclass

import numpy as np

from zcnet.uapi import io_uring as u
from zcnet.uring.mem import Mapping
from zcnet.uring.syscall import cqe_error, io_uring_enter, io_uring_register, io_uring_setup

# One SQE as written by the scalar prep path: every byte of the 64 is written, so no memset.
# opcode flags ioprio fd | off | addr | len op_flags | user_data | buf_index personality
# file_index | addr3 | pad
_SQE = struct.Struct("<BBHiQQIIQHHIQQ")
assert _SQE.size == ctypes.sizeof(u.io_uring_sqe)



class _kernel_timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64))


@dataclass(frozen=True)
class Completions:
    """Reaped CQEs as arrays (copies: the CQ slots are already handed back to the kernel)."""

    user_data: np.ndarray  # uint64
    res: np.ndarray        # int32
    flags: np.ndarray      # uint32
    extra: np.ndarray | None = None  # uint64 (n, 2): the second half of each CQE32

    def __len__(self) -> int:
        return len(self.res)

    def raise_for_errors(self, what: str = "") -> None:
        """Raise OSError for the first negative ``res``: the one place errno is translated."""
        bad = np.flatnonzero(self.res < 0)
        if len(bad):
            raise cqe_error(int(self.res[bad[0]]), what)


class Ring:
    """An io_uring instance. Single-threaded: one owner submits and reaps."""

    def __init__(self, entries: int = 256, *, flags: int = 0,
                 cq_entries: int | None = None) -> None:
        p = u.io_uring_params()
        p.flags = flags
        if cq_entries is not None:
            p.flags |= u.IORING_SETUP_CQSIZE
            p.cq_entries = cq_entries
        self.fd = io_uring_setup(entries, p)
        self._maps: list[Mapping] = []
        try:
            self._map_rings(p)
        except BaseException:
            self.close()
            raise
        self.flags = p.flags
        self.features = p.features
        self.cqe32 = bool(p.flags & u.IORING_SETUP_CQE32)
        self.sq_entries = p.sq_entries
        self.cq_entries = p.cq_entries

    # -- setup ------------------------------------------------------------------------------
    def _map_rings(self, p: u.io_uring_params) -> None:
        cqe_size = 32 if p.flags & u.IORING_SETUP_CQE32 else 16
        sq_size = p.sq_off.array + p.sq_entries * 4
        cq_size = p.cq_off.cqes + p.cq_entries * cqe_size
        if p.features & u.IORING_FEAT_SINGLE_MMAP:
            sq_size = cq_size = max(sq_size, cq_size)
        sq = Mapping(sq_size, fd=self.fd, offset=u.IORING_OFF_SQ_RING)
        self._maps.append(sq)
        if p.features & u.IORING_FEAT_SINGLE_MMAP:
            cq = sq
        else:
            cq = Mapping(cq_size, fd=self.fd, offset=u.IORING_OFF_CQ_RING)
            self._maps.append(cq)
        sqe_size = 128 if p.flags & u.IORING_SETUP_SQE128 else 64
        sqes = Mapping(p.sq_entries * sqe_size, fd=self.fd, offset=u.IORING_OFF_SQES)
        self._maps.append(sqes)

        sq32 = sq.view(np.uint32, 0, sq_size // 4)
        cq32 = cq.view(np.uint32, 0, cq_size // 4)
        self._sq32, self._cq32 = sq32, cq32
        self._khead_i = p.sq_off.head // 4
        self._ktail_i = p.sq_off.tail // 4
        self._ksq_flags_i = p.sq_off.flags // 4
        self._kcq_head_i = p.cq_off.head // 4
        self._kcq_tail_i = p.cq_off.tail // 4
        self._kcq_overflow_i = p.cq_off.overflow // 4
        self.sq_mask = int(sq32[p.sq_off.ring_mask // 4])
        self.cq_mask = int(cq32[p.cq_off.ring_mask // 4])
        # The SQ index array is the identity once: slot i always names SQE i.
        if not p.flags & u.IORING_SETUP_NO_SQARRAY:
            sq.view(np.uint32, p.sq_off.array, p.sq_entries)[:] = np.arange(p.sq_entries)
        words = sqe_size // 8
        self.sqe_u64 = sqes.view(np.uint64).reshape(p.sq_entries, words)
        self.sqe_u32 = sqes.view(np.uint32).reshape(p.sq_entries, words * 2)
        self.sqe_u16 = sqes.view(np.uint16).reshape(p.sq_entries, words * 4)
        self.sqe_u8 = sqes.view(np.uint8).reshape(p.sq_entries, words * 8)
        self._sqe_addr = sqes.addr
        self._sqe_size = sqe_size
        self._sqes_buf = (ctypes.c_char * sqes.size).from_address(sqes.addr)
        cwords = cqe_size // 8
        cqes64 = cq.view(np.uint64, p.cq_off.cqes, p.cq_entries * cwords).reshape(-1, cwords)
        self._cqe_u64 = cqes64
        cq_words = cq.view(np.uint32, p.cq_off.cqes, p.cq_entries * cwords * 2)
        cq_words = cq_words.reshape(p.cq_entries, cwords * 2)
        self._cqe_res = cq_words.view(np.int32)[:, 2]
        self._cqe_flags = cq_words[:, 3]
        self._sq_tail = int(sq32[self._ktail_i])

    def close(self) -> None:
        """Unmap and close; idempotent. Registered resources die with the fd."""
        for m in reversed(getattr(self, "_maps", [])):
            m.close()
        self._maps = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submission ---------------------------------------------------------------------------
    def sq_space(self) -> int:
        return self.sq_entries - (self._sq_tail - int(self._sq32[self._khead_i])) % (1 << 32)

    def _take(self, n: int) -> int:
        """Reserve ``n`` SQ slots; returns the first tail value. Submits if the SQ is full."""
        if n > self.sq_entries:
            raise ValueError(f"batch of {n} exceeds the SQ size {self.sq_entries}")
        if self.sq_space() < n:
            self.submit()
            if self.sq_space() < n:
                raise BlockingIOError(errno.EBUSY, "submission queue full")
        tail = self._sq_tail
        self._sq_tail = (tail + n) & 0xFFFFFFFF
        return tail

    def prep(self, opcode: int, fd: int = -1, addr: int = 0, length: int = 0, off: int = 0,
             user_data: int = 0, *, flags: int = 0, ioprio: int = 0, op_flags: int = 0,
             buf_index: int = 0, file_index: int = 0, addr3: int = 0) -> int:
        """Fill one SQE (all 64 bytes, one pack_into call). Returns the slot index.

        The named prep_* helpers in zcnet.uring.prep call this.
        """
        slot = self._take(1) & self.sq_mask
        _SQE.pack_into(self._sqes_buf, slot * self._sqe_size, opcode, flags, ioprio, fd, off,
                       addr, length, op_flags, user_data, buf_index, 0, file_index, addr3, 0)
        return slot

    def prep_batch(self, opcode: int, user_data: np.ndarray, *, fd: int = -1,
                   addr: int | np.ndarray = 0, length: int | np.ndarray = 0, flags: int = 0,
                   ioprio: int = 0, op_flags: int = 0, buf_index: int = 0) -> None:
        """Fill ``len(user_data)`` SQEs of one opcode with numpy, without a Python loop.

        Scalar fields go into one template SQE that is broadcast over the rows (one copy), then
        the per-SQE columns are written: three or four numpy calls per batch whatever its size.
        """
        n = len(user_data)
        tail = self._take(n)
        template = np.zeros(8, dtype=np.uint64)
        tb = template.view(np.uint8)
        _SQE.pack_into(tb, 0, opcode, flags, ioprio, fd, 0,
                       addr if np.isscalar(addr) else 0, length if np.isscalar(length) else 0,
                       op_flags, 0, buf_index, 0, 0, 0, 0)
        start = tail & self.sq_mask
        first = min(n, self.sq_entries - start)
        for lo, cnt, src in ((start, first, 0), (0, n - first, first)):
            if cnt <= 0:
                continue
            rows = slice(lo, lo + cnt)
            self.sqe_u64[rows, :8] = template
            self.sqe_u64[rows, 4] = user_data[src:src + cnt]
            if not np.isscalar(addr):
                self.sqe_u64[rows, 2] = addr[src:src + cnt]  # type: ignore[index]
            if not np.isscalar(length):
                self.sqe_u32[rows, 6] = length[src:src + cnt]  # type: ignore[index]

    def submit(self, wait_nr: int = 0, timeout: float | None = None) -> int:
        """Publish pending SQEs and enter; returns once ``wait_nr`` completions are ready.

        With ``timeout`` (seconds) the wait ends after that long even if fewer completions
        arrived (IORING_ENTER_EXT_ARG); returns the number of SQEs the kernel consumed.

        Some facts about signals here. A handler that returns (a profiler's timer, SIGCHLD)
        ends the kernel's wait: with nothing submitted the enter fails with EINTR, but an
        enter that also submitted returns the submit count with the completions not there
        yet. Either way we enter again for the rest of the wait, with only the time left.
        A handler that raises (Ctrl-C) leaves through the exception. So the count to submit
        is read from the kernel's SQ head, never kept in a counter the exception could leave
        stale: an enter asking for more SQEs than exist skips the wait, and every wait loop
        above would spin.
        """
        n0 = self.pending
        self._sq32[self._ktail_i] = self._sq_tail  # release: see module docstring
        flags = u.IORING_ENTER_GETEVENTS if wait_nr else 0
        deadline = None
        if timeout is not None and wait_nr:
            deadline = time.monotonic() + timeout
            flags |= u.IORING_ENTER_EXT_ARG
        while True:
            try:
                if deadline is None:
                    io_uring_enter(self.fd, self.pending, wait_nr, flags)
                else:
                    self._enter_until(wait_nr, flags, deadline)
            except OSError as e:
                if e.errno not in (errno.ETIME,  # the timeout fired
                                   errno.EBUSY, errno.EAGAIN):  # CQ overflow: reap first
                    raise
                break
            if not wait_nr or self.cq_ready() >= wait_nr:
                break
            # Fewer completions than asked for: a signal ended the wait early.
            if deadline is not None and time.monotonic() >= deadline:
                break
        return n0 - self.pending

    def _enter_until(self, wait_nr: int, flags: int, deadline: float) -> int:
        """Enter with a relative timeout; after EINTR (a signal whose handler returned) enter
        again with only what is left, so a stream of signals cannot stretch the wait."""
        left = max(0.0, deadline - time.monotonic())
        while True:
            ts = _kernel_timespec(int(left), int((left % 1) * 1e9))
            arg = u.io_uring_getevents_arg(ts=ctypes.addressof(ts))
            try:
                return io_uring_enter(self.fd, self.pending, wait_nr, flags, arg,
                                      retry_eintr=False)
            except InterruptedError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0

    @property
    def pending(self) -> int:
        """SQEs prepared but not yet consumed by the kernel (it advances ``khead`` inside our
        own enter: no SQPOLL)."""
        return (self._sq_tail - int(self._sq32[self._khead_i])) & 0xFFFFFFFF

    def wait(self, wait_nr: int = 1, timeout: float | None = None) -> None:
        """Flush pending SQEs (if any) and wait for completions (at most ``timeout`` s)."""
        self.submit(wait_nr, timeout)

    # -- completion ---------------------------------------------------------------------------
    def _acquire_ktail(self) -> int:
        return int(self._cq32[self._kcq_tail_i])

    def cq_ready(self) -> int:
        return (self._acquire_ktail() - int(self._cq32[self._kcq_head_i])) & 0xFFFFFFFF

    @property
    def cq_overflow(self) -> bool:
        return bool(int(self._sq32[self._ksq_flags_i]) & u.IORING_SQ_CQ_OVERFLOW)

    def reap(self, max_n: int | None = None) -> Completions:
        """Take every ready CQE (up to ``max_n``) as arrays and hand the slots back."""
        head = int(self._cq32[self._kcq_head_i])
        tail = self._acquire_ktail()
        n = (tail - head) & 0xFFFFFFFF
        if max_n is not None:
            n = min(n, max_n)
        start = head & self.cq_mask
        if start + n <= self.cq_entries:
            idx: slice | np.ndarray = slice(start, start + n)
        else:
            idx = (start + np.arange(n)) & self.cq_mask
        c = Completions(
            user_data=self._cqe_u64[idx, 0].copy(),
            res=self._cqe_res[idx].copy(),
            flags=self._cqe_flags[idx].copy(),
            extra=self._cqe_u64[idx, 2:4].copy() if self.cqe32 else None,
        )
        self._cq32[self._kcq_head_i] = (head + n) & 0xFFFFFFFF
        return c

    def get_events(self) -> None:
        """Enter only to run deferred task work and flush overflowed CQEs into the CQ."""
        io_uring_enter(self.fd, 0, 0, u.IORING_ENTER_GETEVENTS)

    # -- registration ---------------------------------------------------------------------------
    def register(self, opcode: int, arg: object, nr_args: int) -> int:
        return io_uring_register(self.fd, opcode, arg, nr_args)
