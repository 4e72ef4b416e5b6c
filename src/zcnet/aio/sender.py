"""The async sender: sends from slots of one buffer; a slot comes back when the kernel is done.

Kinds, as in :mod:`zcnet.tx.senders`:

- ``sendzc``: io_uring SEND_ZC from the buffer registered as a fixed buffer. Each send posts its
  result CQE and later a notification CQE (F_NOTIF) once the kernel no longer reads the slot;
  the notification resolves the future ``send`` returned and frees the slot. The ring wakes
  the loop through an eventfd (:mod:`zcnet.aio.wakeup`), whose callback reaps and resolves.
- ``copy``: a plain ``send`` of what the socket takes now, the rest from a writer callback;
  the slot is free once the socket took it all.

The same code runs under trio: the futures, events, the shield and the timeout come from
:mod:`zcnet.aio.backend`, which gives asyncio's own on an asyncio loop.

Back-pressure: ``acquire`` waits for a free slot. Order: io_uring retries a send that met a full
socket buffer later, from poll, so a second send submitted meanwhile could overtake it; one send
is in flight at a time (its result CQE is awaited), any number of notifications are outstanding.
A task cancelled while its send is in flight leaves the send to finish; the next one waits. Copy
sends keep the same two rules (one at a time, a cancelled one finishes), so a stream never holds
part of one message followed by another, whichever kind runs (sendzc falls back to copy).
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np

from zcnet.aio import backend
from zcnet.aio.loop import Owner, track, untrack
from zcnet.aio.looptypes import Future
from zcnet.aio.shared import loop_accel
from zcnet.aio.sockets import check_tcp_socket
from zcnet.aio.taskrun import taskrun_flag
from zcnet.aio.wakeup import Wakeup
from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.tx.senders import FLUSH_TIMEOUT, SendStats
from zcnet.tx.sendzc import send_buffer
from zcnet.uapi import io_uring as u
from zcnet.uapi.socket import MSG_WAITALL
from zcnet.uring import bufring
from zcnet.uring.prep import prep_send_zc_fixed
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import cqe_error

KINDS = ("sendzc", "copy")
RING_FLAGS = (u.IORING_SETUP_SINGLE_ISSUER
              | u.IORING_SETUP_SUBMIT_ALL)


@dataclass(eq=False)
class Slot:
    """A slot of the send buffer the caller holds: fill ``view``, then ``send`` it."""

    index: int
    view: memoryview


class AsyncSender:
    def __init__(self, sock: socket.socket, kind: str, slots: int, slot_size: int,
                 own_socket: bool) -> None:
        if slots <= 0 or slot_size <= 0:
            raise UsageError(f"slots and slot_size must be positive, got {slots}, {slot_size}")
        self._owner = Owner("zcnet.aio sender")
        self.loop = self._owner.loop
        self.sock = sock
        self.kind = kind
        self._own_socket = own_socket
        self.slot_size = slot_size
        # Registered for SEND_ZC: never a transparent huge page (see zcnet.tx.sendzc).
        self._buf = np.frombuffer(send_buffer(slots * slot_size), dtype=np.uint8)
        mv = memoryview(self._buf)
        self._views = [mv[i * slot_size:(i + 1) * slot_size] for i in range(slots)]
        self._free = list(range(slots - 1, -1, -1))
        self._held: set[int] = set()
        self._freed = backend.event(self.loop)
        self._stats = SendStats(kind, kind)
        self._closed = False
        self.ring: Ring | None = None
        self._wake: Wakeup | None = None
        self._refs = [0] * slots          # CQEs still due per slot
        self._want = [0] * slots
        self._done = [0] * slots
        self._notified: list[Future[bool] | None] = [None] * slots
        self._copied = [False] * slots
        self._sending = -1                # slot whose send result is awaited (copy: 0 for
        self._copy_fd = -1                # sendall's own data), and a copy's writer fd
        self._sent: Future[None] | None = None
        self._idle = backend.event(self.loop)
        self._idle.set()
        if kind == "sendzc":
            self._open_ring()
        #: sendall's copy send in C (zcnet.aio._loopaccel.CopySend) on an asyncio loop, handed
        #: the stats it counts in; called while the sender is open with no send in flight, it
        #: leaves everything but a send the socket takes at once to the Python sendall.
        accel = loop_accel()
        running = self._owner.is_running
        self._csend: Any = (None if accel is None or running is None or self.ring is not None
                            else accel.CopySend(self._stats, sock, self._owner.thread, running))
        track(self.loop, self)

    def _open_ring(self) -> None:
        why = bufring.unsupported(u.IORING_OP_SEND_ZC)
        if why:
            self._fall_back(why)
            return
        ring = Ring(max(16, 1 << (2 * len(self._views)).bit_length()),
                    flags=RING_FLAGS | taskrun_flag())
        try:
            bufring.register_buffers(ring, [(self._buf.ctypes.data, len(self._buf))])
            self._wake = Wakeup(self.loop, ring, on_ready=self._process)
        except OSError as e:
            ring.close()
            self._fall_back(f"registering the send buffer failed: {e.strerror}")
            return
        self.ring = ring

    def _fall_back(self, why: str) -> None:
        self.kind = self._stats.path = "copy"
        self._stats.note = f"sendzc unavailable, sent by copy: {why}"

    # --- slots ---------------------------------------------------------------------------------
    async def acquire(self) -> Slot:
        """A free slot, waiting for one while all are in flight (back-pressure)."""
        self._check()
        while not self._free:
            self._freed.clear()
            await self._freed.wait()
            self._check()
        i = self._free.pop()
        self._held.add(i)
        return Slot(i, self._views[i])

    def _give_back(self, i: int) -> None:
        self._free.append(i)
        self._freed.set()

    # --- sending -------------------------------------------------------------------------------
    async def send(self, slot: Slot, nbytes: int) -> Future[bool]:
        """Send the first ``nbytes`` of ``slot``; returns once the kernel has taken them all.

        The returned future resolves when the kernel no longer reads the slot (then the slot
        is free again): True if the kernel copied after all (loopback always does, and so does
        the copy kind), False for a true zero-copy send. The slot is the sender's from here on;
        do not write it.
        """
        self._check()
        self._check_slot(slot)
        if not 0 < nbytes <= self.slot_size:
            raise UsageError(f"send of {nbytes} B does not fit a {self.slot_size} B slot")
        try:
            await self._turn()
        except BaseException:  # cancelled before the send began: the slot is free again
            if slot.index in self._held and not self._closed:
                self._held.discard(slot.index)
                self._give_back(slot.index)
            raise
        self._check_slot(slot)  # another task may have sent it while this one waited
        self._held.discard(slot.index)  # the sender's from here, whatever happens to the caller
        done: Future[bool] = self.loop.create_future()
        i = slot.index
        if self.ring is None:
            sent_copy = self._copy(slot.view[:nbytes], i)  # gives the slot back when it ends
            if sent_copy is not None:
                await self._await_sent(sent_copy)
            done.set_result(True)
            return done
        self._notified[i] = done
        self._want[i], self._done[i] = nbytes, 0
        self._sending = i
        self._idle.clear()
        sent: Future[None] | None = self.loop.create_future()
        self._sent = sent
        self._prep(i, 0, nbytes)
        self.ring.submit()
        self._process()
        try:
            await self._await_sent(sent)
        finally:
            sent = None  # it holds any error, whose traceback holds this frame: no cycle
        self._stats.bytes += nbytes
        return done

    def _check_slot(self, slot: Slot) -> None:
        if slot.index not in self._held or slot.view is not self._views[slot.index]:
            raise UsageError("send() takes a slot from this sender's acquire(), once")

    async def _turn(self) -> None:
        """Wait until no send is in flight (one at a time keeps the stream in order)."""
        while self._sending >= 0:
            self._idle.clear()
            await self._idle.wait()
            self._check()

    async def _await_sent(self, sent: Future[None]) -> None:
        try:
            await backend.shield(self.loop, sent)
        except BaseException:  # cancelled (asyncio's or trio's), or the send's error
            # The send goes on; its outcome has no reader any more.
            sent.add_done_callback(_consume)
            raise

    def _copy(self, mv: memoryview, i: int, full: bool = False) -> Future[None] | None:
        """Start a copy send: at once as far as the socket takes it (None: all of it), the rest
        from a writer callback that goes on if the caller is cancelled, as a SEND_ZC send does;
        the future resolves when it ends. ``i``: the slot to give back at the end (-1: none,
        sendall's own data). ``full``: ``mv`` is what CopySend's send (counted) left, the
        socket full just now: straight to the writer. Not a coroutine: the common send costs
        no frame."""
        n = 0
        if not full:
            try:
                n = self.sock.send(mv)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                if i >= 0:
                    self._give_back(i)
                raise
            self._stats.sends += 1
        if n == len(mv):
            self._stats.bytes += n
            if i >= 0:
                self._give_back(i)
            return None
        sent: Future[None] = self.loop.create_future()
        rest = [mv[n:]]
        fd = self.sock.fileno()

        def writable() -> None:
            try:
                k = self.sock.send(rest[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._copy_end(fd, i, e)
                return
            rest[0] = rest[0][k:]
            if not rest[0]:
                self._copy_end(fd, i, None)

        self._sending, self._copy_fd = max(i, 0), fd
        self._idle.clear()
        self._sent = sent
        self.loop.add_writer(fd, writable)
        self._stats.bytes += len(mv)
        return sent

    def _copy_end(self, fd: int, i: int, err: OSError | None) -> None:
        self.loop.remove_writer(fd)
        self._copy_fd = -1
        self._turn_over(err)
        if i >= 0:
            self._give_back(i)
        else:
            self._freed.set()  # flush() waits for the send to end

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` (any bytes-like), copied into slots one slot at a time."""
        csend = self._csend
        # The copy kind's common case, in C: open, and no send in flight (this one goes next).
        took = 0 if csend is None or self._sending >= 0 or self._closed else csend(data)
        if took is True:
            return
        self._check()
        mv = memoryview(data).cast("B")[took:]
        if self.ring is None:
            if self._sending >= 0:
                await self._turn()
            sent = self._copy(mv, -1, full=took > 0)
            if sent is not None:
                await self._await_sent(sent)
            return
        for start in range(0, len(mv), self.slot_size):
            piece = mv[start:start + self.slot_size]
            slot = await self.acquire()
            slot.view[:len(piece)] = piece
            await self.send(slot, len(piece))

    def _prep(self, i: int, offset: int, length: int) -> None:
        assert self.ring is not None
        addr = self._buf.ctypes.data + i * self.slot_size + offset
        prep_send_zc_fixed(self.ring, self.sock.fileno(), addr, length, 0, user_data=i,
                           msg_flags=MSG_WAITALL)
        self._refs[i] += 1
        self._stats.sends += 1

    def _process(self) -> None:
        """Run the ring's task work and settle sends and notifications, until an enter finds
        nothing: the loop sleeps only then (see zcnet.aio.wakeup), and one enter runs a
        bounded amount of task work (io_uring's IO_LOCAL_TW_DEFAULT_MAX)."""
        ring = self.ring
        while ring is not None:
            if not ring.cq_ready():
                ring.get_events()
            c = ring.reap()
            if not len(c):
                return
            self._wake.swallow()  # type: ignore[union-attr]  # our own posting's signal
            self._settle_cqes(c.user_data.tolist(), c.res.tolist(), c.flags.tolist())

    def _settle_cqes(self, uds: list[int], results: list[int], flags_: list[int]) -> None:
        ring = self.ring
        assert ring is not None
        for i, res, flags in zip(uds, results, flags_, strict=True):
            if flags & u.IORING_CQE_F_NOTIF:
                if res & u.IORING_NOTIF_USAGE_ZC_COPIED:
                    self._stats.copied += 1
                    self._copied[i] = True
                else:
                    self._stats.zerocopy += 1
                self._drop(i)
                continue
            if not flags & u.IORING_CQE_F_MORE:
                self._refs[i] -= 1  # no notification follows this request
            if res < 0:
                self._end_send(i, cqe_error(res, "SEND_ZC"))
                continue
            self._done[i] += res
            left = self._want[i] - self._done[i]
            if left > 0:  # cut short (a signal): send the rest from the same slot
                self._prep(i, self._done[i], left)
                ring.submit()
            else:
                self._end_send(i, None)

    def _turn_over(self, err: OSError | None) -> None:
        """The send in flight ended (``err``: how it failed): the next one may go, and its
        caller, if still waiting, learns the outcome."""
        self._sending = -1
        self._idle.set()
        sent, self._sent = self._sent, None
        if sent is not None and not sent.done():
            if err is None:
                sent.set_result(None)
            else:
                sent.set_exception(err)

    def _end_send(self, i: int, err: OSError | None) -> None:
        self._turn_over(err)
        if err is not None:
            fut = self._notified[i]
            if fut is not None and not fut.done():
                fut.cancel()  # the caller gets the error from send(); no completion follows
        if not self._refs[i]:
            self._settle(i)

    def _drop(self, i: int) -> None:
        self._refs[i] -= 1
        if self._refs[i] < 0:
            raise RuntimeError(f"slot {i} got more CQEs than requests")
        if not self._refs[i] and i != self._sending:
            self._settle(i)

    def _settle(self, i: int) -> None:
        fut, self._notified[i] = self._notified[i], None
        copied, self._copied[i] = self._copied[i], False
        if fut is not None and not fut.done():
            fut.set_result(copied)
        self._give_back(i)

    @property
    def outstanding(self) -> int:
        """Sends whose notification has not arrived."""
        return sum(self._refs)

    async def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait until the kernel is done with every slot sent so far."""
        self._check()
        try:
            await backend.wait_for(self.loop, self._settled(), timeout)
        except TimeoutError:
            raise ZcnetError(f"{self.outstanding} zero-copy sends still unacknowledged after "
                             f"{timeout:g} s",
                             "the peer stopped reading; close the socket to give up") from None

    async def _settled(self) -> None:
        while self.outstanding or self._sending >= 0:
            self._freed.clear()
            await self._freed.wait()
            self._check()

    def stats(self) -> SendStats:
        s = SendStats(**self._stats.as_dict())
        s.pending = self.outstanding
        return s

    # --- lifetime ------------------------------------------------------------------------------
    def _check(self) -> None:
        self._owner.check()
        if self._closed:
            raise ClosedError("a closed zcnet.aio sender used")

    async def aclose(self) -> None:
        """Wait (bounded) for outstanding notifications, then free the ring."""
        if self._closed:
            return
        self._owner.check()
        try:
            if self.outstanding or self._sending >= 0:
                with contextlib.suppress(ZcnetError):  # closing gives up on them
                    await self.flush()
        finally:  # also when the closing task is cancelled: nothing stays open
            self._free_all()

    def _free_all(self) -> None:
        self._closed = True
        untrack(self.loop, self)
        sent, self._sent = self._sent, None
        if self._copy_fd >= 0 and not self.loop.is_closed():
            self.loop.remove_writer(self._copy_fd)  # a copy send given up, as SEND_ZC's are
            self._copy_fd = -1
        if sent is not None and not sent.done() and not self.loop.is_closed():
            # wakes a send() waiting for its result, with the reason (not a bare cancel: the
            # task itself was not cancelled)
            sent.set_exception(ClosedError("the zcnet.aio sender was closed while a send "
                                           "waited for the kernel"))
        self._idle.set()
        self._freed.set()
        try:
            if self._wake is not None:
                self._wake.close()
        finally:
            try:
                if self.ring is not None:
                    # The kernel keeps the registered pages pinned until its requests end.
                    self.ring.close()
                    self.ring = None
            finally:
                if self._own_socket:
                    self.sock.close()
        for i, fut in enumerate(self._notified):
            if fut is not None and not fut.done() and not self.loop.is_closed():
                fut.cancel()
            self._notified[i] = None

    def _shutdown(self) -> None:
        if not self._closed:
            self._free_all()

    async def __aenter__(self) -> AsyncSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (f"<zcnet.aio sender {self.kind} fd={self.sock.fileno()} "
                f"{'closed' if self._closed else 'open'}>")


def _consume(fut: Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


def open_sender(sock: socket.socket, kind: str = "sendzc", *, slots: int = 8,
                slot_size: int = 64 << 10, own_socket: bool = False) -> AsyncSender:
    """An async sender on a connected TCP socket (non-blocking: the loop's sock_* need it).

    ``kind`` "sendzc" falls back to "copy" with a note in ``stats().note`` when the kernel lacks
    SEND_ZC. ``own_socket``: close ``sock`` with the sender.
    """
    if kind not in KINDS:
        raise UsageError(f"unknown async send kind {kind!r}", f"choose from {', '.join(KINDS)}")
    check_tcp_socket(sock, "zcnet.aio.open_sender")
    sock.setblocking(False)
    return AsyncSender(sock, kind, slots, slot_size, own_socket)
