"""The ring: setup, mmap, SQE filling (one or a batch), one enter per batch, vectorized reap.

Some facts about ordering between us and the kernel:
- SQ: the kernel reads ``ktail`` inside our own io_uring_enter (we never use SQPOLL), so the
  store to ``ktail`` and the SQE stores before it are seen in program order; no barrier needed.
  For the same reason ``ktail`` is stored as soon as an SQE is written (no private tail): the
  kernel takes the SQEs at the next enter, as if they were published there, and the compiled
  Core and the Python methods share one tail.
- CQ: with DEFER_TASKRUN completions are posted inside our io_uring_enter too. Without it the
  kernel may post from another CPU; it writes the CQE before ``ktail`` (smp_store_release). On
  x86 (TSO) loads are not reordered with loads, so reading ``ktail`` and then the CQEs is enough.
  Weakly ordered CPUs would need an acquire load where ``ktail`` is read (``cq_ready``,
  ``reap``, ``reap_one``, each marked).
- reads and writes of a u32 through a memoryview cast to "I" are single aligned accesses.
Fields in shared ring memory have a ``k`` prefix, as in liburing.

Some facts about closing a ring under another thread (a Ring has one owner; this is the
misuse it must survive): a system call on the ring fd releases the GIL between reading the
fd's number and the kernel taking it, so a close in that window would leave the call with a
number the kernel may already have given to another file (another ring: its SQEs submitted
by the wrong thread). So each such call counts itself in ``_users`` (the compiled Core counts
its own), and ``close`` leaves the fd to the last of them (``_release_fd``). The memory is
unmapped at once: a call that was inside finds the ring closed when it next looks (the fd
after its system call, or a released view) and raises ClosedError, as one made after the
close does.

Some facts about Python's cost here, which shape the code: a ctypes call costs ~0.35 us over
the syscall itself, a numpy call on a small array ~0.3-0.5 us, one memoryview item access
~0.05 us, a ``struct`` pack/unpack ~0.1-0.2 us. So ring indices are read and written through
memoryview casts, one SQE is one ``pack_into``, a batch of SQEs is staged in a cached template
array and copied in with one memoryview slice assignment, ``submit`` is one io_uring_enter
with plain-int arguments, and reaped CQEs are one bytes copy decoded into arrays only when
read. Every public method checks first that the ring is open: its memory is unmapped by
``close`` and touching it would kill the interpreter.

With the compiled accelerator (zcnet.uring._accel, built at install when a compiler exists;
``ZCNET_PURE=1`` turns it off) ``prep``, ``prep_batch``, ``submit``, ``reap`` and ``reap_one``
are its Core's methods, bound on the instance: one C call each instead of a Python frame, a
ctypes call and a struct pack (batch-1 NOP CPU per op 1.7 -> 0.5 us). Off their common path
they call the Python methods below, so checks and errors are the same on both paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import time
from collections.abc import Callable

import numpy as np

from zcnet.errors import ClosedError, UsageError
from zcnet.uapi import io_uring as u
from zcnet.uring import mixed
from zcnet.uring.accel_bind import bind_accel
from zcnet.uring.completions import Completions
from zcnet.uring.layout import CqAddresses, RingMemory
from zcnet.uring.mem import Mapping
from zcnet.uring.syscall import (
    backend,
    enter_fast_for,
    io_uring_enter,
    io_uring_register,
    io_uring_setup,
)

# One SQE as written by the scalar prep path: every byte of the 64 is written, so no memset.
# opcode flags ioprio fd | off | addr | len op_flags | user_data | buf_index personality
# file_index | addr3 | pad
_SQE = struct.Struct("<BBHiQQIIQHHIQQ")
assert _SQE.size == ctypes.sizeof(u.io_uring_sqe)
_CQE = struct.Struct("<QiI")  # user_data res flags: the first 16 bytes of every CQE
_U32 = 0xFFFFFFFF
_GETEVENTS = u.IORING_ENTER_GETEVENTS


class _kernel_timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64))


class Ring:
    """An io_uring instance. Single-threaded: one owner submits and reaps.

    After ``close()`` every method but ``close`` raises ClosedError.
    """

    # Slots for what zcnet.aio._loopaccel reads and writes every pass (in place, no dict lookup)
    # and what submit counts per call; the rest lives in the instance dict.
    __slots__ = ("__dict__", "__weakref__", "_fd_pending", "_users", "fd")

    def __init__(self, entries: int = 256, *, flags: int = 0,
                 cq_entries: int | None = None) -> None:
        if flags & u.IORING_SETUP_SQPOLL:
            # The kernel's SQ thread would read the SQ while we write it, and sleep until an
            # enter with IORING_ENTER_SQ_WAKEUP: both against this module's design (above).
            raise UsageError("Ring: IORING_SETUP_SQPOLL is not supported",
                             "drop the flag: zcnet submits from its own io_uring_enter")
        p = u.io_uring_params()
        p.flags = flags
        if cq_entries is not None:
            p.flags |= u.IORING_SETUP_CQSIZE
            p.cq_entries = cq_entries
        self.fd = -1
        self._users = 0  # Python calls inside a system call on fd (see "closing" above)
        self._fd_pending = -1  # the fd close() left to the last of them
        #: "c" when the compiled accelerator runs this ring's hot path, else "pure"
        self.backend = backend()
        self._enter = enter_fast_for(self.backend)
        self._maps: list[Mapping] = []
        self._views: list[memoryview] = []
        self.fd = io_uring_setup(entries, p)
        with contextlib.ExitStack() as undo:
            undo.callback(self.close)  # unless the rings are mapped
            self._map_rings(p)
            undo.pop_all()
        self.flags = p.flags
        self.features = p.features
        self.cqe32 = bool(p.flags & u.IORING_SETUP_CQE32)
        #: CQEs of 16 and 32 bytes (IORING_SETUP_CQE_MIXED): reaps widen them all to 32
        #: (zcnet.uring.mixed), and counts of ready CQEs (``cq_ready``) are in 16-byte slots.
        self.cqe_mixed = bool(p.flags & u.IORING_SETUP_CQE_MIXED)
        self.sq_entries = p.sq_entries
        self.cq_entries = p.cq_entries

    # -- setup ------------------------------------------------------------------------------
    def _map_rings(self, p: u.io_uring_params) -> None:
        m = RingMemory(self.fd, p, self._maps, self._views)
        self._sqm, self._cqm, self._sqes, self._cqes = m.sqm, m.cqm, m.sqes_mv, m.cqes_mv
        self._khead_i, self._ktail_i, self._ksq_flags_i = m.khead_i, m.ktail_i, m.ksq_flags_i
        self._kcq_head_i, self._kcq_tail_i = m.kcq_head_i, m.kcq_tail_i
        self.sq_mask, self.cq_mask = m.sq_mask, m.cq_mask
        self._sqe_size, self._cqe_size = m.sqe_size, m.cqe_size
        self._cq_bytes = p.cq_entries * m.cqe_size
        self._cq_addresses = CqAddresses(
            m.cq.addr + p.cq_off.head, m.cq.addr + p.cq_off.tail, m.cq.addr + p.cq_off.cqes,
            m.cq_mask, m.cqe_size, m.sq.addr + p.sq_off.flags)
        # prep_batch stages SQEs here (a template broadcast over the rows, then the per-SQE
        # columns) and copies them into the ring with one slice assignment.
        self._stage = np.zeros((p.sq_entries, m.sqe_size // 8), dtype=np.uint64)
        self._stage32 = self._stage.view(np.uint32)
        self._stage_mv = memoryview(self._stage).cast("B")
        self._stage_key: tuple[object, ...] | None = None
        if self.backend == "c":
            self._core = bind_accel(self, self.fd, self._maps, m, p)

    def close(self) -> None:
        """Unmap and close; idempotent. Registered resources die with the fd. A call another
        thread is making meanwhile raises ClosedError; the fd is closed once no system call
        on it is in flight (see "closing" in the module docstring)."""
        fd, self.fd = self.fd, -1  # first: every method checks it before touching memory
        core = self.__dict__.get("_core")
        if core is not None:
            core.close(self)  # the compiled methods check their own flag
        for v in getattr(self, "_views", ()):
            v.release()
        self._views = []
        for m in reversed(getattr(self, "_maps", [])):
            m.close()
        self._maps = []
        if fd >= 0:
            self._fd_pending = fd
            self._release_fd()

    def _release_fd(self) -> None:
        """Close the fd ``close`` left, unless a system call on it is still in flight (the
        last one calls this again; the compiled Core too, for its own)."""
        core = self.__dict__.get("_core")
        if self._users or (core is not None and core.users):
            return
        fd, self._fd_pending = self._fd_pending, -1
        if fd >= 0:
            os.close(fd)

    def _syscall(self, what: str, call: Callable[..., int], *args: object) -> int:
        """``call(fd, *args)``, a system call on the ring fd for the slow paths: counted in
        ``_users``, and ClosedError when another thread closed the ring meanwhile (the kernel
        then says EBADF, or answers for whatever took the number)."""
        self._users += 1
        try:
            fd = self.fd
            if fd < 0:
                raise ClosedError.of(self, what)
            ret = call(fd, *args)
            if self.fd < 0:
                raise ClosedError.of(self, what)
            return ret
        except OSError:
            if self.fd < 0:
                raise ClosedError.of(self, what) from None
            raise
        finally:
            self._users -= 1
            if self._fd_pending >= 0:
                self._release_fd()

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def __enter__(self) -> Ring:
        if self.fd < 0:
            raise ClosedError.of(self, "__enter__")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submission ---------------------------------------------------------------------------
    def sq_space(self) -> int:
        return self.sq_entries - self._pending("sq_space")

    def _make_room(self, n: int) -> None:
        """Submit so that ``n`` SQ slots are free (the SQ is full)."""
        if n > self.sq_entries:
            raise ValueError(f"batch of {n} exceeds the SQ size {self.sq_entries}")
        self.submit()
        if self.sq_space() < n:
            raise BlockingIOError(errno.EBUSY, "submission queue full")

    def prep(self, opcode: int, fd: int = -1, addr: int = 0, length: int = 0, off: int = 0,
             user_data: int = 0, *, flags: int = 0, ioprio: int = 0, op_flags: int = 0,
             buf_index: int = 0, file_index: int = 0, addr3: int = 0) -> int:
        """Fill one SQE (every byte: one pack_into call, and zeros past the first 64 of a
        128-byte SQE). Returns the slot index.

        The named prep_* helpers in zcnet.uring.prep call this. The slot is taken only once
        the SQE is written, so a bad argument leaves no half-written SQE to be submitted.
        """
        if self.fd < 0:
            raise ClosedError.of(self, "prep")
        sq = self._sqm
        try:
            tail = sq[self._ktail_i]
            if (tail - sq[self._khead_i]) & _U32 >= self.sq_entries:
                self._make_room(1)
                tail = sq[self._ktail_i]
            slot = tail & self.sq_mask
            sz = self._sqe_size
            _SQE.pack_into(self._sqes, slot * sz, opcode, flags, ioprio, fd, off, addr, length,
                           op_flags, user_data, buf_index, 0, file_index, addr3, 0)
            if sz != 64:  # SQE128: the command area past 64 bytes holds an earlier command's
                self._sqes[slot * sz + 64:(slot + 1) * sz] = bytes(sz - 64)
            sq[self._ktail_i] = (tail + 1) & _U32  # published at once: see the docstring
        except ValueError:
            if self.fd < 0:  # another thread closed the ring meanwhile: its views are released
                raise ClosedError.of(self, "prep") from None
            raise
        return slot

    _prep_py = prep  # the compiled Core's slow path

    def prep_batch(self, opcode: int, user_data: np.ndarray, *, fd: int = -1,
                   addr: int | np.ndarray = 0, length: int | np.ndarray = 0, flags: int = 0,
                   ioprio: int = 0, op_flags: int = 0, buf_index: int = 0) -> None:
        """Fill ``len(user_data)`` SQEs of one opcode with numpy, without a Python loop.

        Scalar fields go into a template broadcast over a staging array (kept while the
        scalars stay the same), the per-SQE columns are written there, and the rows are copied
        into the ring with one or two slice assignments.
        """
        if self.fd < 0:
            raise ClosedError.of(self, "prep_batch")
        n = len(user_data)
        if n == 0:
            return
        try:
            sq = self._sqm
            tail = sq[self._ktail_i]
            if self.sq_entries - ((tail - sq[self._khead_i]) & _U32) < n:
                self._make_room(n)
                tail = sq[self._ktail_i]
            addr_v = isinstance(addr, np.ndarray)
            len_v = isinstance(length, np.ndarray)
            key = (opcode, fd, flags, ioprio, op_flags, buf_index,
                   None if addr_v else addr, None if len_v else length)
            stage = self._stage
            if key != self._stage_key:
                self._stage_key = None
                _SQE.pack_into(self._stage_mv, 0, opcode, flags, ioprio, fd, 0,
                               0 if addr_v else addr, 0 if len_v else length,
                               op_flags, 0, buf_index, 0, 0, 0, 0)
                stage[1:] = stage[0]
                self._stage_key = key
            stage[:n, 4] = user_data
            if addr_v:
                stage[:n, 2] = addr
            if len_v:
                self._stage32[:n, 6] = length
            sz = self._sqe_size
            start = (tail & self.sq_mask) * sz
            end = start + n * sz
            ring_bytes = self.sq_entries * sz
            if end <= ring_bytes:
                self._sqes[start:end] = self._stage_mv[:n * sz]
            else:
                first = ring_bytes - start
                self._sqes[start:] = self._stage_mv[:first]
                self._sqes[:end - ring_bytes] = self._stage_mv[first:n * sz]
            sq[self._ktail_i] = (tail + n) & _U32
        except ValueError:
            if self.fd < 0:  # another thread closed the ring meanwhile: its views are released
                raise ClosedError.of(self, "prep_batch") from None
            raise

    _prep_batch_py = prep_batch  # the compiled Core's slow path

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

        The common case (no timeout, every SQE taken, the wait satisfied) is one enter and
        a few memoryview reads; anything else continues in ``_submit_slow``.
        """
        fd = self.fd
        if fd < 0:
            raise ClosedError.of(self, "submit")
        if not 0 <= wait_nr <= _U32:
            raise UsageError(f"Ring.submit: wait_nr={wait_nr} is not a count of completions",
                             "pass 0..2**32-1 completions to wait for")
        sq = self._sqm
        n = (sq[self._ktail_i] - sq[self._khead_i]) & _U32
        if timeout is None:
            self._users += 1  # the fd stays open until the enter is done (see "closing")
            try:
                ret = self._enter(fd, n, wait_nr, _GETEVENTS if wait_nr else 0, None, 0)
            finally:
                self._users -= 1
            if self.fd < 0:  # closed by another thread during the enter
                self._release_fd()
                raise ClosedError.of(self, "submit")
            if ret >= 0 and not wait_nr:
                return ret  # the SQEs the kernel consumed (fewer when one failed its prep)
            if ret == n:
                cq = self._cqm
                if (cq[self._kcq_tail_i] - cq[self._kcq_head_i]) & _U32 >= wait_nr:
                    return n
        return self._submit_slow(n, wait_nr, timeout)

    _submit_py = submit  # the compiled Core's slow path

    def _submit_slow(self, n0: int, wait_nr: int, timeout: float | None) -> int:
        """``submit`` with a timeout, after a signal, a partial submit or an error; ``n0`` is
        the pending count before the first enter."""
        flags = _GETEVENTS if wait_nr else 0
        deadline = None
        if timeout is not None and wait_nr:
            deadline = time.monotonic() + timeout
            flags |= u.IORING_ENTER_EXT_ARG
        while True:
            try:
                if deadline is None:
                    self._syscall("submit", io_uring_enter, self._pending(), wait_nr, flags)
                else:
                    self._enter_until(wait_nr, flags, deadline)
            except OSError as e:
                if e.errno not in (errno.ETIME,  # the timeout fired
                                   errno.EBUSY, errno.EAGAIN):  # CQ overflow: reap first
                    raise
                break
            if not wait_nr or self.cq_ready("submit") >= wait_nr:  # names the user's call
                break
            # Fewer completions than asked for: a signal ended the wait early.
            if deadline is not None and time.monotonic() >= deadline:
                break
        return n0 - self._pending()

    def _enter_until(self, wait_nr: int, flags: int, deadline: float) -> int:
        """Enter with a relative timeout; after EINTR (a signal whose handler returned) enter
        again with only what is left, so a stream of signals cannot stretch the wait."""
        left = max(0.0, deadline - time.monotonic())
        while True:
            ts = _kernel_timespec(int(left), int((left % 1) * 1e9))
            arg = u.io_uring_getevents_arg(ts=ctypes.addressof(ts))
            try:
                return self._syscall("submit", _enter_once, self._pending(), wait_nr, flags, arg)
            except InterruptedError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0

    @property
    def pending(self) -> int:
        """SQEs prepared but not consumed yet (no SQPOLL: the kernel takes them in our enter)."""
        return self._pending("pending")

    def _pending(self, method: str = "submit") -> int:
        if self.fd < 0:  # naming the user's call (submit's slow path reads this too)
            raise ClosedError.of(self, method)
        return (self._sqm[self._ktail_i] - self._sqm[self._khead_i]) & _U32

    def wait(self, wait_nr: int = 1, timeout: float | None = None) -> None:
        """Flush pending SQEs (if any) and wait for completions (at most ``timeout`` s)."""
        self.submit(wait_nr, timeout)

    # -- completion ---------------------------------------------------------------------------
    def cq_ready(self, method: str = "cq_ready") -> int:
        if self.fd < 0:
            raise ClosedError.of(self, method)
        # Acquire of ktail: a plain load on x86 (see the module docstring).
        cq = self._cqm
        return (cq[self._kcq_tail_i] - cq[self._kcq_head_i]) & _U32

    @property
    def sq_flags(self) -> int:
        """The SQ ring's flags word, which the kernel writes (IORING_SQ_TASKRUN with
        IORING_SETUP_TASKRUN_FLAG, IORING_SQ_CQ_OVERFLOW, IORING_SQ_NEED_WAKEUP)."""
        if self.fd < 0:
            raise ClosedError.of(self, "sq_flags")
        return self._sqm[self._ksq_flags_i]

    @property
    def cq_overflow(self) -> bool:
        if self.fd < 0:
            raise ClosedError.of(self, "cq_overflow")
        return bool(self._sqm[self._ksq_flags_i] & u.IORING_SQ_CQ_OVERFLOW)

    def cq_addresses(self) -> CqAddresses:
        """The raw addresses of the CQ's head, tail and entries and of the SQ flags word, for
        compiled code that reaps this ring itself (see :class:`CqAddresses`)."""
        if self.fd < 0:
            raise ClosedError.of(self, "cq_addresses")
        if self.cqe_mixed:
            raise UsageError("cq_addresses: a CQE_MIXED ring's CQEs are of two sizes",
                             "reap it with reap() or reap_one()")
        return self._cq_addresses

    def reap(self, max_n: int | None = None) -> Completions:
        """Take every ready CQE (up to ``max_n``) as arrays and hand the slots back."""
        if self.fd < 0:
            raise ClosedError.of(self, "reap")
        if self.cqe_mixed:
            return mixed.reap(self, max_n)
        cq = self._cqm
        head = cq[self._kcq_head_i]
        n = (cq[self._kcq_tail_i] - head) & _U32  # acquire of ktail: see module docstring
        if max_n is not None and max_n < n:
            n = max(0, max_n)
        sz = self._cqe_size
        start = (head & self.cq_mask) * sz
        end = start + n * sz
        try:
            if end <= self._cq_bytes:
                raw = bytearray(self._cqes[start:end])
            else:
                raw = bytearray(self._cqes[start:])
                raw += self._cqes[:end - self._cq_bytes]
            cq[self._kcq_head_i] = (head + n) & _U32  # release: the copy above is done
        except ValueError:
            if self.fd < 0:  # another thread closed the ring meanwhile: its views are released
                raise ClosedError.of(self, "reap") from None
            raise
        return Completions.from_raw(raw, n, self.cqe32)

    _reap_py = reap  # the compiled Core's slow path

    def reap_one(self) -> tuple[int, int, int] | None:
        """The oldest ready CQE as (user_data, res, flags), or None: the small-batch path,
        with no arrays. (A CQE32's second half is not returned; use ``reap`` for it.)"""
        if self.fd < 0:
            raise ClosedError.of(self, "reap_one")
        cq = self._cqm
        head = cq[self._kcq_head_i]
        if cq[self._kcq_tail_i] == head:  # acquire of ktail: see the module docstring
            return None
        try:
            if self.cqe_mixed:
                return mixed.reap_one(self, head)
            cqe = _CQE.unpack_from(self._cqes, (head & self.cq_mask) * self._cqe_size)
            cq[self._kcq_head_i] = (head + 1) & _U32
        except ValueError:
            if self.fd < 0:  # another thread closed the ring meanwhile: its views are released
                raise ClosedError.of(self, "reap_one") from None
            raise
        return cqe

    _reap_one_py = reap_one  # so bind_accel can tell a subclass override from the original

    def get_events(self) -> None:
        """Enter only to run deferred task work and flush overflowed CQEs into the CQ."""
        fd = self.fd
        if fd < 0:
            raise ClosedError.of(self, "get_events")
        self._users += 1  # the fd stays open until the enter is done (see "closing")
        try:
            ret = self._enter(fd, 0, 0, _GETEVENTS, None, 0)
        finally:
            self._users -= 1
        if ret < 0 or self.fd < 0:  # the fast enter failed (errno below), or a close came
            self._syscall("get_events", io_uring_enter, 0, 0, _GETEVENTS)

    # -- registration ---------------------------------------------------------------------------
    def register(self, opcode: int, arg: object, nr_args: int) -> int:
        return self._syscall("register", io_uring_register, opcode, arg, nr_args)


def _enter_once(fd: int, to_submit: int, min_complete: int, flags: int,
                arg: ctypes.Structure) -> int:
    """io_uring_enter with a relative timeout: EINTR raised, not retried (the caller goes on
    with what is left of its deadline)."""
    return io_uring_enter(fd, to_submit, min_complete, flags, arg, retry_eintr=False)
