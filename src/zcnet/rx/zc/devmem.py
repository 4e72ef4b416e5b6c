"""Provider "devmem": devmem TCP, payload DMA'd straight into a dma-buf bound to NIC queues.

Some facts about devmem TCP receive:

- ``bind-rx`` (netdev generic netlink) attaches a dma-buf to RX queues; the binding lives as long
  as the netlink socket that made it, so the provider keeps that socket open until close().
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
import warnings

from zcnet.errors import ClosedError, Unsupported, ZcnetError
from zcnet.nic import netdev
from zcnet.nic.device import Device
from zcnet.rx.zc.area import UDMABUF_DEV, Area
from zcnet.rx.zc.netqueue import find_queue
from zcnet.rx.zc.provider import CopyCount, Delivery, ProviderBase, build_or_close
from zcnet.uapi import socket as usock

log = logging.getLogger(__name__)

MAX_DONTNEED_TOKENS = 128   # dmabuf_token entries per setsockopt (net/core/sock.c)
MAX_DONTNEED_FRAGS = 1024   # tokens per setsockopt
CMSG_SLOTS = 512
DMABUF_CMSG_SIZE = ctypes.sizeof(usock.dmabuf_cmsg)
ANCBUF = socket.CMSG_SPACE(DMABUF_CMSG_SIZE) * CMSG_SLOTS
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
                max_calls: int = RECVMSG_PER_REAP) -> int:
    """Up to ``max_calls`` non-blocking recvmsg(MSG_SOCK_DEVMEM) into ``out``; returns the bytes
    that arrived as linear data. The kernel never mixes dma-buf and host-memory skbs in one call,
    so bytes of a call not announced by any cmsg are plain copied data, also linear."""
    flags = usock.MSG_SOCK_DEVMEM | usock.MSG_DONTWAIT
    linear = 0
    for _ in range(max_calls):
        try:
            n, anc, mflags, _ = sock.recvmsg_into([iov], ANCBUF, flags)
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
        pos = parse_cmsgs(anc, iov, out)
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


def bind_rx(ifname: str, dmabuf_fd: int, queues: list[int]) -> netdev.DmabufBinding:
    """Bind the dma-buf to ``queues`` of ``ifname`` (netdev bind-rx); returns the live binding
    (close it to unbind). Errors name the missing capability."""
    with Device.open(ifname) as dev:
        try:
            return netdev.bind_rx(dev, dmabuf_fd, queues)
        except Unsupported as e:
            raise Unsupported(
                f"device {ifname} cannot bind a dma-buf to queue(s) {queues}: it lacks queue "
                "management ops, DMA or header-data split"
                + (f" ({e.extack})" if getattr(e, "extack", "") else ""),
                "devmem TCP needs a NIC with the queue API and tcp-data-split on; elsewhere use "
                "provider 'soft'") from e


def probe_device(ifname: str, queue: int) -> None:
    """Whether ``ifname`` would take a dma-buf binding, without one: the kernel checks the
    device (queue ops, DMA) before it looks at the fd, so EBADF means the device passed.
    Raises Unsupported naming the device's problem; returns when only the dma-buf is missing."""
    try:
        bind_rx(ifname, netdev.NO_FD, [queue]).close()
    except Unsupported:
        raise
    except OSError as e:
        if e.errno != errno.EBADF:
            raise


class DevmemProvider(ProviderBase):
    name = "devmem"

    def __init__(self, fd: int, area: Area, ifname: str, queue: int) -> None:
        if area.dmabuf_fd is None:
            raise ZcnetError("devmem needs a dma-buf area", "pass dmabuf_fd or load udmabuf")
        self.area = area
        self.ifname = ifname  # the device the dma-buf is bound to
        self.note = f"{ifname} queue {queue}, dma-buf fd {area.dmabuf_fd}"
        self.linear_bytes = 0
        self.dontneed_calls = 0
        self._sock: socket.socket | None = None
        self._poll = select.poll()
        self._linear = bytearray(LINEAR_BUF)
        self._linear_mv = memoryview(self._linear)
        self._warned = False
        self._closed = False
        self._binding = bind_rx(ifname, area.dmabuf_fd, [queue])
        if fd >= 0:
            build_or_close(lambda: self.attach(fd), self._binding.close)

    def attach(self, fd: int) -> None:
        """Receive from ``fd`` (a duplicate, so the caller's socket object keeps its own)."""
        # The duplicate shares the file's flags with the caller's socket: leave them alone and
        # ask for non-blocking receives per call (MSG_DONTWAIT) instead.
        if self._closed:
            raise ClosedError.of(self, "attach")
        self._sock = socket.socket(fileno=os.dup(fd))
        self._poll.register(self._sock.fileno(), select.POLLIN)

    def can_arm(self) -> bool:
        if self._closed:
            raise ClosedError.of(self, "can_arm")
        return True

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
        ms = -1 if timeout is None else int(timeout * 1000)
        if self._sock is None or not self._poll.poll(ms):
            return out
        lin = recv_devmem(self._sock, self._linear_mv, out)
        if lin:
            self._note_linear(lin)
        return out

    def _note_linear(self, n: int) -> None:
        self.linear_bytes += n
        if not self._warned:
            self._warned = True
            log.warning("devmem: %d bytes arrived in host memory (SCM_DEVMEM_LINEAR): header "
                        "split is off or the flow is not steered to the bound queue", n)

    def recycle(self, tokens: list[int], lengths: list[int]) -> None:
        if self._closed:
            raise ClosedError.of(self, "recycle")
        real = [t for t in tokens if t >= 0]
        if self._sock is None:
            return
        for arg in dontneed_batches(real):
            self._sock.setsockopt(usock.SOL_SOCKET, usock.SO_DEVMEM_DONTNEED, arg)
            self.dontneed_calls += 1

    def extra_stats(self) -> dict[str, int]:
        return {"linear": self.linear_bytes, "dontneed_calls": self.dontneed_calls}

    def kernel_copy(self) -> CopyCount:
        return CopyCount(self.linear_bytes, LINEAR_SOURCE)

    def close(self, armed: bool = False) -> bool:
        self._closed = True
        with contextlib.ExitStack() as undo:
            undo.callback(self._binding.close)
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        return True


def open_devmem(fd: int, area_size: int, *, dmabuf_fd: int | None = None,
                hugetlb: bool = False, ifname: str | None = None,
                queue: int | None = None) -> DevmemProvider:
    if hugetlb:
        # The area is a dma-buf (udmabuf's memfd, or the caller's): its exporter picks the pages.
        warnings.warn("hugetlb does not apply to devmem: its area is a dma-buf whose exporter "
                      "picks the pages; normal pages are used", RuntimeWarning, stacklevel=2)
    if ifname is None or queue is None:
        found_if, found_q = find_queue(fd)
        ifname = ifname or found_if
        queue = found_q if queue is None else queue
    if dmabuf_fd is None and not os.path.exists(UDMABUF_DEV):
        # Ask the device first, so the reason names what is really missing.
        probe_device(ifname, queue)
    area = Area(area_size, dmabuf_fd=dmabuf_fd) if dmabuf_fd is not None \
        else Area.udmabuf(area_size)
    return build_or_close(lambda: DevmemProvider(fd, area, ifname, queue), area.close)
