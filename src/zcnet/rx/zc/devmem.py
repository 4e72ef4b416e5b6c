"""Provider "devmem": devmem TCP, payload DMA'd straight into a dma-buf bound to NIC queues.

Some facts about devmem TCP receive:

- ``bind-rx`` (netdev generic netlink) attaches a dma-buf to RX queues; the binding lives as long
  as the netlink socket that made it. One binding serves every connection on its queues
  (zcnet.rx.zc.devmem_binding: who holds it, and each connection's share of the dma-buf).
- ``recvmsg(MSG_SOCK_DEVMEM)`` returns no payload for data that landed in the dma-buf; instead
  each fragment comes as a SCM_DEVMEM_DMABUF cmsg (struct dmabuf_cmsg: offset in the dma-buf,
  size, a token, the binding id). The iov receives only bytes the NIC did not put in the
  dma-buf: each such run is announced by SCM_DEVMEM_LINEAR with its size. Linear data means
  header split is off or the flow is not steered to a bound queue; it is still stream data, so it
  is delivered (as a copy) and counted, and the problem is reported.
- A truncated control buffer (MSG_CTRUNC) loses fragment tokens, so the buffer is sized for many.
- Tokens go back with setsockopt(SO_DEVMEM_DONTNEED, struct dmabuf_token[]), each entry a run of
  consecutive tokens; the kernel takes at most 128 entries and 1024 tokens per call.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import socket
import struct
import threading
import warnings
from collections.abc import Iterable

from zcnet.errors import ClosedError, ZcnetError
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.devmem_binding import (
    DevmemBinding,
    SharedBinding,
    acquire,
    bind_rx,
    probe_device,
)
from zcnet.rx.zc.netqueue import find_queue
from zcnet.rx.zc.provider import (
    CopyCount,
    Delivery,
    IntSeq,
    ProviderBase,
    build_or_close,
)
from zcnet.uapi import socket as usock

log = logging.getLogger(__name__)

__all__ = ["DevmemProvider", "bind_rx", "dontneed_batches", "open_devmem", "open_shared",
           "parse_cmsgs", "probe_device", "recv_devmem"]

MAX_DONTNEED_TOKENS = 128   # dmabuf_token entries per setsockopt (net/core/sock.c)
MAX_DONTNEED_FRAGS = 1024   # tokens per setsockopt
CMSG_SLOTS = 512
DMABUF_CMSG_SIZE = ctypes.sizeof(usock.dmabuf_cmsg)
CMSG_SPACE = socket.CMSG_SPACE(DMABUF_CMSG_SIZE)
ANCBUF = CMSG_SPACE * CMSG_SLOTS
LINEAR_BUF = 1 << 20
RECVMSG_PER_REAP = 16
# What the devmem copy count is: bytes the socket gave in host memory, not dma-buf frags.
LINEAR_SOURCE = "devmem cmsgs: SCM_DEVMEM_LINEAR bytes (and bytes no cmsg covered)"
_TOKEN = struct.Struct("=II")  # struct dmabuf_token {token_start, token_count}
assert _TOKEN.size == ctypes.sizeof(usock.dmabuf_token)


def parse_cmsgs(ancdata: list[tuple[int, int, bytes]], linear: memoryview | bytes,
                out: Delivery) -> int:
    """Append the fragments of one recvmsg to ``out`` in stream order; returns linear bytes.

    Devmem fragments become (offset, size, token); linear runs are copied out of ``linear``
    (the iov, reused by the next call) into ``out.linear`` keyed by their position.
    """
    pos = 0
    for level, ctype, data in ancdata:
        if level != usock.SOL_SOCKET or ctype not in (usock.SCM_DEVMEM_DMABUF,
                                                      usock.SCM_DEVMEM_LINEAR):
            continue
        if len(data) < DMABUF_CMSG_SIZE:
            raise ZcnetError(f"devmem cmsg of {len(data)} bytes, expected {DMABUF_CMSG_SIZE}")
        c = usock.dmabuf_cmsg.from_buffer_copy(data[:DMABUF_CMSG_SIZE])
        if ctype == usock.SCM_DEVMEM_DMABUF:
            out.offsets.append(c.frag_offset)
            out.lengths.append(c.frag_size)
            out.tokens.append(c.frag_token)
        else:
            out.linear[len(out.offsets)] = bytes(linear[pos:pos + c.frag_size])
            out.offsets.append(-1)
            out.lengths.append(c.frag_size)
            out.tokens.append(-1)
            pos += c.frag_size
    return pos


def recv_devmem(sock: socket.socket, iov: memoryview, out: Delivery,
                max_calls: int = RECVMSG_PER_REAP, max_frags: int | None = None) -> int:
    """Up to ``max_calls`` non-blocking recvmsg(MSG_SOCK_DEVMEM) into ``out``, taking at most
    ``max_frags`` dma-buf fragments (a member's room in its share); returns the bytes that
    arrived as linear data. The kernel never mixes dma-buf and host-memory skbs in one call, so
    bytes of a call not announced by any cmsg are plain copied data, also linear. The kernel
    stops a call, without truncating, when the control buffer has no room for the next
    fragment's cmsg (put_cmsg_notrunc), so a smaller buffer takes fewer fragments."""
    flags = usock.MSG_SOCK_DEVMEM | usock.MSG_DONTWAIT
    linear = 0
    room = CMSG_SLOTS * max_calls if max_frags is None else max_frags
    for _ in range(max_calls):
        if room <= 0:
            break
        anc_size = ANCBUF if room >= CMSG_SLOTS else CMSG_SPACE * room
        try:
            n, anc, mflags, _ = sock.recvmsg_into([iov], anc_size, flags)
        except BlockingIOError:
            break
        except OSError as e:
            out.end = -(e.errno or errno.EIO)
            break
        if n == 0 and not anc:
            out.end = 0
            break
        if mflags & socket.MSG_CTRUNC:
            raise ZcnetError("devmem control buffer truncated: fragment tokens were lost",
                             "report this; the control buffer must grow")
        first = len(out.offsets)
        runs = len(out.linear)
        pos = parse_cmsgs(anc, iov, out)
        room -= len(out.offsets) - first - (len(out.linear) - runs)
        accounted = sum(out.lengths[first:])
        if n > accounted:
            out.linear[len(out.offsets)] = bytes(iov[pos:pos + n - accounted])
            out.offsets.append(-1)
            out.lengths.append(n - accounted)
            out.tokens.append(-1)
            pos += n - accounted
        linear += pos
    return linear


def dontneed_batches(tokens: list[int]) -> list[bytes]:
    """SO_DEVMEM_DONTNEED arguments returning ``tokens``: runs of consecutive tokens, split to
    respect the kernel's per-call limits."""
    out: list[bytes] = []
    entries: list[bytes] = []
    frags = 0
    for start, count in _runs(sorted(tokens)):
        while count:
            take = min(count, MAX_DONTNEED_FRAGS - frags)
            entries.append(_TOKEN.pack(start, take))
            frags += take
            start += take
            count -= take
            if len(entries) == MAX_DONTNEED_TOKENS or frags == MAX_DONTNEED_FRAGS:
                out.append(b"".join(entries))
                entries, frags = [], 0
    if entries:
        out.append(b"".join(entries))
    return out


def _runs(sorted_tokens: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for t in sorted_tokens:
        if runs and runs[-1][0] + runs[-1][1] == t:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((t, 1))
    return runs


class DevmemProvider(ProviderBase):
    """One connection (a member) on a shared devmem binding (zcnet.rx.zc.devmem_binding): it
    reads its own socket and gives tokens back on it, maps the dma-buf itself (its area), and
    holds no more pages than its share. Closed with chunks held, it keeps its socket open until
    they come back (destroying the socket would hand their pages to the NIC)."""

    name = "devmem"

    def __init__(self, fd: int, binding: DevmemBinding) -> None:
        """Takes over one membership of ``binding`` (joined by the caller); closes it when it
        cannot be built."""
        with contextlib.ExitStack() as undo:
            undo.callback(binding.quit)
            self.area = Area(binding.size, dmabuf_fd=binding.dmabuf_fd)
            undo.pop_all()
        self.binding = binding
        self.ifname = binding.ifname  # the device the dma-buf is bound to
        self.note = (f"{binding.describe()}, dma-buf fd {binding.dmabuf_fd} (binding "
                     f"{binding.id}, shared by the connections on them)")
        self.linear_bytes = 0
        self.dontneed_calls = 0
        self.share_stops = 0       # reaps refused because the member held its share
        self.held = 0              # tokens handed out and not given back
        self.rcvbuf = 0            # the SO_RCVBUF set for the current share
        self._sock: socket.socket | None = None
        self._poll = select.poll()
        self._linear = bytearray(LINEAR_BUF)
        self._linear_mv = memoryview(self._linear)
        self._warned = False
        self._closed = False
        self._left = False         # the membership is given up (close with chunks held)
        self._lock = threading.Lock()  # releases after close come from any thread
        if fd >= 0:
            build_or_close(lambda: self.attach(fd), self.close, self.area.close)

    def attach(self, fd: int) -> None:
        """Receive from ``fd`` (a duplicate, so the caller's socket object keeps its own)."""
        # The duplicate shares the file's flags with the caller's socket: leave them alone and
        # ask for non-blocking receives per call (MSG_DONTWAIT) instead.
        if self._closed:
            raise ClosedError.of(self, "attach")
        dup = os.dup(fd)
        self._sock = build_or_close(lambda: socket.socket(fileno=dup), lambda: os.close(dup))
        self._poll.register(self._sock.fileno(), select.POLLIN)
        self._fit_rcvbuf()

    def _fit_rcvbuf(self) -> None:
        """Bound the socket's queue by the member's share (when the share changed)."""
        want = self.binding.rcvbuf()
        if want == self.rcvbuf or self._sock is None:
            return
        self.rcvbuf = want
        sock = self._sock
        try:  # root: not capped by net.core.rmem_max
            sock.setsockopt(usock.SOL_SOCKET, usock.SO_RCVBUFFORCE, want)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, want)
        # The queue holds 2 x want of truesize, a page per fragment: at MTU 1500 about 0.7 x
        # want of payload. A low-water mark above that wakes us only once the kernel's
        # pressure check fires (7/8 full, the window nearly shut), so keep it at want / 2.
        low = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, min(low, want // 2)))

    def can_arm(self) -> bool:
        if self._closed:
            raise ClosedError.of(self, "can_arm")
        return self.held < self.binding.held_limit()

    def arm(self) -> None:
        """Nothing to arm: the binding delivers as long as it exists."""
        if self._closed:
            raise ClosedError.of(self, "arm")

    @property
    def ring(self) -> None:
        return None  # reads the socket itself

    def reap(self, timeout: float | None) -> Delivery:
        if self._closed:
            raise ClosedError.of(self, "reap")
        out = Delivery()
        room = self.binding.held_limit() - self.held
        if room <= 0:
            # Its share is held: leave the data in the socket (its window closes, nobody
            # else's) until releases come back (the core waits: can_arm is False).
            self.share_stops += 1
            out.stopped = "share"
            return out
        self._fit_rcvbuf()
        ms = -1 if timeout is None else int(timeout * 1000)
        if self._sock is None or not self._poll.poll(ms):
            return out
        lin = recv_devmem(self._sock, self._linear_mv, out, max_frags=room)
        self.held += len(out.offsets) - len(out.linear)
        if lin:
            self._note_linear(lin)
        return out

    def _note_linear(self, n: int) -> None:
        self.linear_bytes += n
        if not self._warned:
            self._warned = True
            log.warning("devmem: %d bytes arrived in host memory (SCM_DEVMEM_LINEAR): header "
                        "split is off or the flow is not steered to the bound queue", n)

    def recycle(self, tokens: IntSeq, lengths: IntSeq) -> None:
        if self._closed:
            raise ClosedError.of(self, "recycle")
        self._dontneed(tokens)

    def _dontneed(self, tokens: IntSeq) -> None:
        real = [int(t) for t in tokens if t >= 0]
        if self._sock is None or not real:
            return
        for arg in dontneed_batches(real):
            self._sock.setsockopt(usock.SOL_SOCKET, usock.SO_DEVMEM_DONTNEED, arg)
            self.dontneed_calls += 1
        self.held -= len(real)

    def recycle_closed(self, tokens: list[int]) -> None:
        """Chunks released after close: their tokens go back on the socket kept open for them;
        the last one closes it and gives up the membership."""
        with self._lock:
            self._dontneed(tokens)
            self._finish_if_idle()

    def extra_stats(self) -> dict[str, int]:
        return {"linear": self.linear_bytes, "dontneed_calls": self.dontneed_calls,
                "share_stops": self.share_stops, "held_limit": self.binding.held_limit(),
                "members": self.binding.members}

    def kernel_copy(self) -> CopyCount:
        return CopyCount(self.linear_bytes, LINEAR_SOURCE)

    def close(self, armed: bool = False) -> bool:
        """Stop receiving: the other members' shares grow now; the socket (and with it this
        member's hold on the binding) goes once no chunk is held."""
        with self._lock:
            if self._closed:
                return True
            self._closed = True
            self.binding.leave()
            self._finish_if_idle()
        return True

    def _finish_if_idle(self) -> None:
        if self._left or self.held > 0:
            return
        self._left = True
        with contextlib.ExitStack() as undo:
            undo.callback(self.binding.release)
            sock, self._sock = self._sock, None
            if sock is not None:
                self._poll.unregister(sock.fileno())
                sock.close()


def open_devmem(fd: int, area_size: int, *, dmabuf_fd: int | None = None,
                hugetlb: bool = False, ifname: str | None = None,
                queue: int | None = None, queues: Iterable[int] | None = None
                ) -> DevmemProvider:
    """A member of this process's binding of ``queues`` (or ``queue``) of ``ifname``, bound
    first when there is none (see zcnet.rx.zc.devmem_binding.acquire)."""
    if hugetlb:
        # The area is a dma-buf (udmabuf's memfd, or the caller's): its exporter picks the pages.
        warnings.warn("hugetlb does not apply to devmem: its area is a dma-buf whose exporter "
                      "picks the pages; normal pages are used", RuntimeWarning, stacklevel=2)
    qs = list(queues) if queues is not None else [] if queue is None else [queue]
    if ifname is None or not qs:
        found_if, found_q = find_queue(fd)
        ifname = ifname or found_if
        qs = qs or [found_q]
    return DevmemProvider(fd, acquire(ifname, qs, area_size, dmabuf_fd))


def open_shared(fd: int, handle: SharedBinding) -> DevmemProvider:
    """A member of a binding another process holds and counted this member in (a benchmark's
    flow worker: its session binds)."""
    binding = DevmemBinding.imported(handle)
    build_or_close(binding.join, binding.free)
    return DevmemProvider(fd, binding)
