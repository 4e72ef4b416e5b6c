"""Receive engines behind one interface: read a connected TCP socket to EOF as fast as possible.

Every engine hands each received chunk to an optional consumer as a uint8 numpy view, in stream
order, before the memory is reused; ``--verify`` is such a consumer. ``unsupported()`` says why
an engine cannot run on this kernel (checked before a cell starts, so the table shows ``n/a``).

Some facts about io_uring on sockets: a socket in O_NONBLOCK mode makes io_uring return -EAGAIN
instead of arming its internal poll, so the io_uring engines switch the socket to blocking mode.
With SINGLE_ISSUER|DEFER_TASKRUN, completions are only posted inside our io_uring_enter, which is
both the cheapest mode and the one zcrx requires; we fall back to plain flags on older kernels.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np

from zcnet.sockcheck import require_tcp
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing, register_buffers, unsupported
from zcnet.uring.mem import Mapping
from zcnet.uring.prep import prep_read_fixed, prep_recv_multishot
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import cqe_error

Consumer = Callable[[np.ndarray], object]


@dataclass
class RxStats:
    bytes: int = 0
    first: float = 0.0  # monotonic time of the first byte
    last: float = 0.0   # monotonic time of the last byte
    calls: int = 0      # syscalls (recv or io_uring_enter)
    extra: dict[str, int] = field(default_factory=dict)

    def seconds(self) -> float:
        return max(self.last - self.first, 1e-9)

    def note(self, n: int) -> None:
        now = time.monotonic()
        if not self.bytes:
            self.first = now
        self.bytes += n
        self.last = now


@dataclass
class EngineOptions:
    bufsize: int = 1 << 20        # epoll/uring: one receive buffer of this size
    mshot_buf: int = 64 << 10     # uring-mshot: size of each provided buffer
    mshot_entries: int = 256      # uring-mshot: buffers in the ring (power of two)
    bundle: bool = True           # uring-mshot: use bundles when the kernel has them
    # Zero-copy engines (zcnet.rx.zc.engines):
    consumer: str = "same"        # release in the ring's thread, or "thread" (002's experiment)
    consumer_cpu: int | None = None
    ifname: str | None = None     # zcrx/devmem: the NIC and queue the flow is steered to
    queue: int | None = None
    zc_buf: int = 0               # soft-zc: buffer size (0: provider default)
    zc_area: int = 0              # soft-zc: area size (0: provider default)
    zc_incremental: bool = False  # soft-zc: incrementally consumed buffers (IOU_PBUF_RING_INC)
    zc_debug: bool = False        # poison released chunks to catch use after release


class Engine(Protocol):
    name: ClassVar[str]

    def unsupported(self) -> str | None: ...

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        """Read the connected TCP socket ``sock`` to EOF (checked first: UsageError for a
        closed, listening, unconnected or non-TCP socket)."""


def close_engine(engine: Engine) -> None:
    """Release what an engine acquired before run() (zcrx/devmem hold a queue registration from
    unsupported() on); engines without such state have no close()."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def fast_ring(entries: int, **kw: int) -> Ring:
    """A ring with SINGLE_ISSUER|DEFER_TASKRUN, or plain flags where the kernel refuses them."""
    try:
        return Ring(entries, flags=u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN,
                    **kw)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return Ring(entries, **kw)


class EpollEngine:
    """Non-blocking ``recv_into`` drained until EAGAIN, then epoll_wait: the baseline."""

    name: ClassVar[str] = "epoll"

    def __init__(self, opts: EngineOptions) -> None:
        self.opts = opts

    def unsupported(self) -> str | None:
        return None

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        require_tcp(sock, f"{self.name} engine")
        st = RxStats()
        buf = np.empty(self.opts.bufsize, dtype=np.uint8)
        mv = memoryview(buf)
        sock.setblocking(False)
        ep = select.epoll()
        try:
            ep.register(sock.fileno(), select.EPOLLIN)
            while True:
                try:
                    n = sock.recv_into(mv)
                except BlockingIOError:
                    ep.poll()
                    continue
                st.calls += 1
                if n == 0:
                    return st
                st.note(n)
                if consume is not None:
                    consume(buf[:n])
        finally:
            ep.close()


class UringEngine:
    """One READ_FIXED at a time into a registered buffer: io_uring's single-shot path."""

    name: ClassVar[str] = "uring"

    def __init__(self, opts: EngineOptions) -> None:
        self.opts = opts

    def unsupported(self) -> str | None:
        return unsupported(u.IORING_OP_READ_FIXED)

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        require_tcp(sock, f"{self.name} engine")
        st = RxStats()
        sock.setblocking(True)
        fd = sock.fileno()
        with fast_ring(4) as ring, Mapping.anonymous(self.opts.bufsize) as area:
            register_buffers(ring, [(area.addr, area.size)])
            buf = area.view(np.uint8, 0, self.opts.bufsize)
            while True:
                prep_read_fixed(ring, fd, area.addr, self.opts.bufsize, 0)
                ring.submit(1)
                st.calls += 1
                res = int(ring.reap().res[0])
                if res < 0:
                    raise cqe_error(res, "READ_FIXED")
                if res == 0:
                    return st
                st.note(res)
                if consume is not None:
                    consume(buf[:res])


class UringMultishotEngine:
    """Multishot RECV selecting from a provided buffer ring; buffers recycled after use."""

    name: ClassVar[str] = "uring-mshot"
    _BGID = 7

    def __init__(self, opts: EngineOptions) -> None:
        self.opts = opts

    def unsupported(self) -> str | None:
        return unsupported(u.IORING_OP_RECV)

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        require_tcp(sock, f"{self.name} engine")
        st = RxStats()
        sock.setblocking(True)
        fd = sock.fileno()
        o = self.opts
        with fast_ring(8, cq_entries=2 * o.mshot_entries) as ring, \
                BufRing(ring, self._BGID, o.mshot_entries, o.mshot_buf) as br:
            bundle = o.bundle and bool(ring.features & u.IORING_FEAT_RECVSEND_BUNDLE)
            st.extra = {"bundle": int(bundle), "rearms": 0, "enobufs": 0, "cqes": 0}
            prep_recv_multishot(ring, fd, self._BGID, bundle=bundle)
            while True:
                ring.submit(1)
                st.calls += 1
                cs = ring.reap()
                st.extra["cqes"] += len(cs)
                for res, fl in zip(cs.res.tolist(), cs.flags.tolist(), strict=True):
                    if res > 0:
                        bids = br.consumed(res, fl >> u.IORING_CQE_BUFFER_SHIFT)
                        st.note(res)
                        if consume is not None:
                            left = res
                            for bid in bids.tolist():
                                n = min(left, o.mshot_buf)
                                consume(br.buffer(bid, n))
                                left -= n
                        br.provide(bids)
                    if fl & u.IORING_CQE_F_MORE:
                        continue
                    # The multishot ended: EOF, out of buffers (re-arm), or an error.
                    if res == 0:
                        return st
                    if res == -errno.ENOBUFS:
                        st.extra["enobufs"] += 1
                    elif res < 0:
                        raise cqe_error(res, "multishot RECV")
                    st.extra["rearms"] += 1
                    prep_recv_multishot(ring, fd, self._BGID, bundle=bundle)


ENGINES: dict[str, Callable[[EngineOptions], Engine]] = {
    EpollEngine.name: EpollEngine,
    UringEngine.name: UringEngine,
    UringMultishotEngine.name: UringMultishotEngine,
}


def engine_names() -> list[str]:
    """Every engine name, including zero-copy ones when their module is present."""
    _load_extra()
    return list(ENGINES)


def make_engine(name: str, opts: EngineOptions | None = None) -> Engine:
    _load_extra()
    try:
        factory = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}") from None
    return factory(opts or EngineOptions())


def _load_extra() -> None:
    """Zero-copy engines register themselves from zcnet.rx.zc.engines when it exists."""
    try:
        from zcnet.rx.zc import engines as zc_engines
    except ImportError:
        return
    ENGINES.update(getattr(zc_engines, "ENGINES", {}))
