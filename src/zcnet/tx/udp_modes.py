"""UDP burst senders, one class per txbench mode, all with the same methods.

Every sender takes a connected, non-blocking UDP socket (checked at construction) and sends a
burst of ``burst`` packets per :meth:`send_burst`, stamping sequence numbers (see
:mod:`zcnet.tx.payload`). They differ only in how many system calls a burst costs:

========  =============================================  ==================
mode      per burst                                      syscalls per burst
========  =============================================  ==================
single    one send() per packet                          burst
mmsg      one sendmmsg() over prebuilt mmsghdr arrays    1
uring     ``burst`` SEND SQEs, one io_uring_enter         1 (see uring_send)
gso       one send() with UDP_SEGMENT                     1
========  =============================================  ==================

Some facts about failures: a non-blocking UDP send says EAGAIN when the socket's send buffer is
full and ENOBUFS when a queue below dropped it; both are transient, so they are counted and the
rest of the burst retried after a short poll for POLLOUT. ECONNREFUSED (an ICMP port unreachable
came back), EHOSTUNREACH and ENETUNREACH will not heal within a run: they end it with an error.
"""

from __future__ import annotations

import errno
import gc
import select
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from zcnet.errors import ClosedError, ZcnetError
from zcnet.sockcheck import require_udp
from zcnet.tx import payload
from zcnet.tx.mmsg import MsgBatch, sendmmsg
from zcnet.uapi.udp import SOL_UDP, UDP_SEGMENT

_TRANSIENT = frozenset({errno.EAGAIN, errno.ENOBUFS})
_FATAL = {
    errno.ECONNREFUSED: "nothing listens at the target (ICMP port unreachable)",
    errno.EHOSTUNREACH: "target host unreachable",
    errno.ENETUNREACH: "no route to the target network",
    errno.EMSGSIZE: "packet larger than the path MTU",
}
_RETRY_POLL_MS = 10

# GSO limits kept by txbench, as MPWQE keeps its own session limits: at most 64 segments (the
# kernel's UDP_MAX_SEGMENTS was 64 for years; newer kernels allow 128) and 64 KiB of payload
# per send (an IP datagram's length field is 16 bits).
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65535 - 8 - 40  # UDP header and the larger (IPv6) IP header


def gso_refusal(lengths: Sequence[int]) -> str | None:
    """Why one UDP_SEGMENT send cannot carry packets of these lengths in order, or None.

    The kernel cuts a GSO send into equal segments; only the last may be shorter.
    """
    if not len(lengths):
        return "empty burst"
    if len(lengths) > GSO_MAX_SEGMENTS:
        return f"{len(lengths)} segments > {GSO_MAX_SEGMENTS}"
    if sum(lengths) > GSO_MAX_BYTES:
        return f"{sum(lengths)} B > {GSO_MAX_BYTES} B per send"
    seg = lengths[0]
    if any(n != seg for n in lengths[:-1]) or lengths[-1] > seg:
        return "mixed sizes (only the last segment may be shorter)"
    return None


def gso_can_carry(lengths: Sequence[int]) -> bool:
    return gso_refusal(lengths) is None


@dataclass
class SendCounters:
    packets: int = 0
    bytes: int = 0
    calls: int = 0  # send-type system calls (or io_uring_enter) that carried packets
    retries: dict[str, int] = field(default_factory=dict)  # errno name -> times retried
    fallback_bursts: int = 0
    fallback_packets: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"packets": self.packets, "bytes": self.bytes, "calls": self.calls,
                "retries": dict(self.retries), "fallback_bursts": self.fallback_bursts,
                "fallback_packets": self.fallback_packets}


class BurstSender:
    """Base: the socket, the burst's lengths, sequence numbers, counters and the retry policy."""

    mode = ""

    def __init__(self, sock: socket.socket, lengths: Sequence[int],
                 counters: SendCounters | None = None) -> None:
        if not len(lengths) or min(lengths) <= 0:
            raise ValueError("a burst needs at least one packet of at least one byte")
        self.fd = require_udp(sock, f"{self.mode} sender")
        self.sock = sock
        self._closed = False
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.burst = len(lengths)
        self.burst_bytes = int(self.lengths.sum())
        self.seq = 0
        self.counters = counters if counters is not None else SendCounters()
        self._poller = select.poll()
        self._poller.register(self.fd, select.POLLOUT)

    def send_burst(self) -> int:
        """Send one burst; returns its packet count. ClosedError after ``close()``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the mode holds beyond the socket (the socket belongs to the caller);
        afterwards ``send_burst`` raises ClosedError. Idempotent."""
        self._closed = True

    def _failed(self, exc: OSError) -> None:
        """Count and wait on a transient error; raise a ZcnetError for a lasting one."""
        if exc.errno in _TRANSIENT:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            self.counters.retries[name] = self.counters.retries.get(name, 0) + 1
            self._poller.poll(_RETRY_POLL_MS)
            return
        peer = _peer(self.sock)
        reason = _FATAL.get(exc.errno or 0, exc.strerror or str(exc))
        raise ZcnetError(f"sending to {peer} failed: {reason} [{exc.strerror}]",
                         "check the target address and that something receives there") from exc

    def _done(self, calls: int) -> int:
        c = self.counters
        c.packets += self.burst
        c.bytes += self.burst_bytes
        c.calls += calls
        self.seq += self.burst
        return self.burst


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "the target"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _RowsMixin:
    """A (burst, slot) buffer, pattern-filled once, and its in-place sequence column if any."""

    def _rows(self, burst: int, slot: int) -> None:
        self.rows = np.zeros((burst, slot), dtype=np.uint8)
        payload.fill(self.rows)
        self._seqcol = payload.seq_column(self.rows)
        self._arange = np.arange(burst, dtype=np.uint64)

    def _stamp(self, seq: int) -> None:
        if self._seqcol is not None:
            np.add(self._arange, seq, out=self._seqcol)
        else:
            payload.stamp(self.rows, seq)


class SingleSender(BurstSender, _RowsMixin):
    """Baseline: one send() per packet on the connected socket (no per-call address parsing)."""

    mode = "single"

    def __init__(self, sock: socket.socket, lengths: Sequence[int],
                 counters: SendCounters | None = None) -> None:
        super().__init__(sock, lengths, counters)
        slot = int(self.lengths.max())
        self._rows(self.burst, slot)
        self._views = [memoryview(self.rows[i, : int(n)]) for i, n in enumerate(self.lengths)]

    def send_burst(self) -> int:
        if self._closed:
            raise ClosedError.of(self, "send_burst")
        self._stamp(self.seq)
        send = self.sock.send
        calls = 0
        for view in self._views:
            while True:
                try:
                    send(view)
                    break
                except OSError as exc:
                    self._failed(exc)
            calls += 1
        return self._done(calls)


class MmsgSender(BurstSender, _RowsMixin):
    """One sendmmsg() per burst over mmsghdr/iovec arrays built once."""

    mode = "mmsg"

    def __init__(self, sock: socket.socket, lengths: Sequence[int],
                 counters: SendCounters | None = None) -> None:
        super().__init__(sock, lengths, counters)
        self.batch = MsgBatch(self.burst, int(self.lengths.max()))
        self.rows = self.batch.data
        payload.fill(self.rows)
        self._seqcol = payload.seq_column(self.rows)
        self._arange = np.arange(self.burst, dtype=np.uint64)
        self.batch.set_lengths(self.lengths)

    def send_burst(self) -> int:
        if self._closed:
            raise ClosedError.of(self, "send_burst")
        self._stamp(self.seq)
        first, left, calls = 0, self.burst, 0
        while left:
            try:
                n = sendmmsg(self.fd, self.batch, left, first)
            except OSError as exc:
                self._failed(exc)
                continue
            calls += 1
            first += n
            left -= n
        return self._done(calls)


class GsoSender(BurstSender):
    """One send() per burst with UDP_SEGMENT; bursts GSO cannot carry go by mmsg, counted."""

    mode = "gso"

    def __init__(self, sock: socket.socket, lengths: Sequence[int],
                 counters: SendCounters | None = None) -> None:
        super().__init__(sock, lengths, counters)
        self.fallback: MmsgSender | None = None
        self.notes: list[str] = []
        why = gso_refusal([int(n) for n in self.lengths])
        if why is not None:
            # Every burst has the same shape, so the decision holds for the whole run.
            self.fallback = MmsgSender(sock, lengths, self.counters)
            self.notes.append(f"gso: every burst sent by mmsg: {why}")
            return
        seg = int(self.lengths[0])
        self.sock.setsockopt(SOL_UDP, UDP_SEGMENT, seg)
        self.buf = np.zeros(self.burst_bytes, dtype=np.uint8)
        starts = np.concatenate(([0], np.cumsum(self.lengths)[:-1]))
        for start, n in zip(starts, self.lengths, strict=True):
            self.buf[start:start + n] = payload.pattern(int(n))
        self._seq_bytes = [(i, self.buf[int(s):int(s) + payload.SEQ_BYTES])
                           for i, (s, n) in enumerate(zip(starts, self.lengths, strict=True))
                           if payload.has_seq(int(n))]
        rows = self.buf.reshape(self.burst, seg) if self.burst_bytes == seg * self.burst else None
        self._seqcol = payload.seq_column(rows) if rows is not None else None
        self._arange = np.arange(self.burst, dtype=np.uint64)
        self._view = memoryview(self.buf)

    def _stamp(self, seq: int) -> None:
        if self._seqcol is not None:
            np.add(self._arange, seq, out=self._seqcol)
            return
        for i, dst in self._seq_bytes:
            dst[:] = np.frombuffer((seq + i).to_bytes(8, "little"), dtype=np.uint8)

    def send_burst(self) -> int:
        if self._closed:
            raise ClosedError.of(self, "send_burst")
        if self.fallback is not None:
            self.fallback.seq = self.seq
            self.fallback.send_burst()
            self.counters.fallback_bursts += 1
            self.counters.fallback_packets += self.burst
            self.seq += self.burst
            return self.burst
        self._stamp(self.seq)
        while True:
            try:
                self.sock.send(self._view)
                break
            except OSError as exc:
                self._failed(exc)
        return self._done(1)

    def close(self) -> None:
        super().close()
        if self.fallback is not None:
            self.fallback.close()


SenderFactory = Callable[[socket.socket, Sequence[int]], BurstSender]

MODES: dict[str, SenderFactory] = {
    "single": SingleSender,
    "mmsg": MmsgSender,
    "gso": GsoSender,
}


def run_for(sender: BurstSender, seconds: float | None = None, packets: int | None = None
            ) -> tuple[int, float, float]:
    """Send bursts until ``seconds`` pass or ``packets`` went out (whole bursts; the last one is
    cut by neither). Returns (packets, wall seconds, thread CPU seconds)."""
    if (seconds is None) == (packets is None):
        raise ValueError("give exactly one of seconds or packets")
    start_pkts = sender.counters.packets
    send = sender.send_burst
    # The loop allocates nothing that lives; a collection in the middle would only add jitter.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        cpu0 = time.thread_time()
        t0 = time.perf_counter()
        if packets is not None:
            for _ in range(packets // sender.burst):
                send()
        else:
            deadline = t0 + seconds
            clock = time.perf_counter
            while clock() < deadline:
                send()
        wall = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
    finally:
        if gc_was_enabled:
            gc.enable()
    return sender.counters.packets - start_pkts, wall, cpu
