"""Copying receive engines (epoll, uring, uring-mshot) behind :mod:`zcnet.rx.engine`'s contract.

Some facts about io_uring on sockets: a socket in O_NONBLOCK mode makes io_uring return -EAGAIN
instead of arming its internal poll, so the io_uring engines switch the socket to blocking mode.
With SINGLE_ISSUER|DEFER_TASKRUN, completions are only posted inside our io_uring_enter, which is
both the cheapest mode and the one zcrx requires; we fall back to plain flags on older kernels.
"""

from __future__ import annotations

import errno
import select
import socket
from typing import ClassVar

import numpy as np

from zcnet.rx.engine import Consumer, EngineOptions, RxStats
from zcnet.sockcheck import RCVLOWAT, require_tcp, set_rcvlowat
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing, register_buffers, unsupported
from zcnet.uring.mem import Mapping
from zcnet.uring.prep import prep_read_fixed, prep_recv_multishot
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import cqe_error


def fast_ring(entries: int, **kw: int) -> Ring:
    """A ring with SINGLE_ISSUER|DEFER_TASKRUN, or plain flags where the kernel refuses them."""
    try:
        return Ring(entries, flags=u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN,
                    **kw)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return Ring(entries, **kw)


class _CopyingEngine:
    name: ClassVar[str] = ""
    default_rcvlowat: ClassVar[int] = RCVLOWAT

    def __init__(self, opts: EngineOptions) -> None:
        self.opts = opts

    def close(self) -> None:
        """Nothing outlives run()."""


class EpollEngine(_CopyingEngine):
    """Non-blocking ``recv_into`` drained until EAGAIN, then epoll_wait: the baseline."""

    name: ClassVar[str] = "epoll"
    # Woken on any data, as the epoll servers it stands for are. Measured in the lab (split
    # placement, MTU 1500/4096, 1 MiB writes, interleaved repeats): 34.6-35.5 Gbit/s this way
    # against 29.2-29.9 with 1 MiB (and 30-33 with 64-256 KiB). The sender's CPU is the limit
    # there, and a reader that takes data as it comes keeps its window updates, and the ACK
    # work they bring, on its own CPU; the io_uring engines, whose wake-ups cost more, gain
    # from the threshold instead.
    default_rcvlowat: ClassVar[int] = 0

    def unsupported(self) -> str | None:
        return None

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        require_tcp(sock, f"{self.name} engine")
        set_rcvlowat(sock, self.opts.rcvlowat_for(self), f"{self.name} engine")
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


class _IoUringEngine(_CopyingEngine):
    op: ClassVar[int]  # the io_uring opcode the engine needs

    def unsupported(self) -> str | None:
        return unsupported(self.op)

    def _blocking_fd(self, sock: socket.socket) -> int:
        """The checked socket's fd, in blocking mode (see "Some facts" above), with the
        engine's SO_RCVLOWAT."""
        require_tcp(sock, f"{self.name} engine")
        set_rcvlowat(sock, self.opts.rcvlowat_for(self), f"{self.name} engine")
        sock.setblocking(True)
        return sock.fileno()


class UringEngine(_IoUringEngine):
    """One READ_FIXED at a time into a registered buffer: io_uring's single-shot path."""

    name: ClassVar[str] = "uring"
    op: ClassVar[int] = u.IORING_OP_READ_FIXED

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        fd = self._blocking_fd(sock)
        st = RxStats()
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


class UringMultishotEngine(_IoUringEngine):
    """Multishot RECV selecting from a provided buffer ring; buffers recycled after use."""

    name: ClassVar[str] = "uring-mshot"
    op: ClassVar[int] = u.IORING_OP_RECV
    _BGID = 7

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        fd = self._blocking_fd(sock)
        st = RxStats()
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
