"""Zero-copy receive engines (soft-zc, zcrx, devmem) behind :mod:`zcnet.rx.engine`'s contract.

- ``consumer``: "same" releases in the ring's thread; "thread" hands each batch to a consumer
  thread that reads and releases it (the release crosses threads through the single-producer
  queue); ``consumer_cpu`` pins that thread.
- ``ifname``/``queue``: the NIC queue for zcrx and devmem. Their registration happens in
  ``unsupported()`` (the worker calls it in the receiving namespace before the connection
  exists), so a refusal becomes an ``unsupported`` cell with the kernel's reason translated.
  zcrx on a device that cannot do it, or with no queue given, takes the kernel's copy mode
  where the kernel offers it (7.x); the cell's ``zcrx_copy`` stat says so.
- ``zc_rx_buf_len``: zcrx receive buffer size (rx_buf_len; 0: one page).
- ``zc_buf``/``zc_area``: soft provider buffer size and the area (EngineOptions.area_bytes();
  soft-zc's default area holds SOFT_AREA_BUFFERS buffers, zcrx's and devmem's ZC_AREA_BUFFERS).
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
from typing import ClassVar

from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.rx.engine import (
    CONSUMERS,
    SOFT_AREA_BUFFERS,
    ZC_AREA_BUFFERS,
    Consumer,
    EngineOptions,
    RxStats,
)
from zcnet.rx.zc.chunks import Batch
from zcnet.rx.zc.devmem import open_devmem, open_shared
from zcnet.rx.zc.devmem_binding import SharedBinding
from zcnet.rx.zc.provider import NicProvider, build_or_close
from zcnet.rx.zc.receiver import COPY_FIELDS, Receiver
from zcnet.rx.zc.soft import open_soft
from zcnet.rx.zc.zcrx import kernel_offers, open_zcrx
from zcnet.rx.zc.zcrx_export import IMPORT_SINCE
from zcnet.rx.zc.zcrx_procs import ZcrxHandoff, arrival_queue, import_queue
from zcnet.rx.zc.zcrx_queue import ZcrxQueue
from zcnet.sockcheck import RCVLOWAT, require_tcp, set_rcvlowat
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import unsupported


class _ZcEngine:
    name: ClassVar[str] = ""
    #: Its provider's name in zcnet.rx.zc.providers (what kind of engine it is).
    provider: ClassVar[str] = ""
    default_rcvlowat: ClassVar[int] = RCVLOWAT
    area_buffers: ClassVar[int] = ZC_AREA_BUFFERS  # buffers in the default area

    def __init__(self, opts: EngineOptions) -> None:
        self.opts = opts
        self.consumer = opts.consumer
        self.consumer_cpu = _check_cpu(opts.consumer_cpu)
        self.buf_size = opts.zc_buf_bytes()
        self.area_size = opts.area_bytes(self.area_buffers)
        self.debug = opts.zc_debug

    def _check_consumer(self) -> str | None:
        if self.consumer not in CONSUMERS:
            return f"unknown consumer {self.consumer!r}; choose {' or '.join(CONSUMERS)}"
        return None

    def _open(self, sock: socket.socket) -> Receiver:
        raise NotImplementedError

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        require_tcp(sock, f"{self.name} engine")
        set_rcvlowat(sock, self.opts.rcvlowat_for(self), f"{self.name} engine")
        sock.setblocking(True)
        st = RxStats()
        with self._open(sock) as rx:
            if self.consumer == "thread":
                _run_thread(rx, consume, st, self.consumer_cpu)
            else:
                _run_same(rx, consume, st)
            rx.flush()
            st.extra = {k: v for k, v in rx.stats_dict().items()
                        if isinstance(v, int) or k in COPY_FIELDS}
            st.extra["consumer_thread"] = int(self.consumer == "thread")
        return st


def _run_same(rx: Receiver, consume: Consumer | None, st: RxStats) -> None:
    while True:
        b = rx.recv_batch()
        st.calls += 1
        if b is None:
            if rx.eof:
                return
            continue
        st.note(b.length)
        if consume is not None:
            for a in b.arrays(coalesce=True):
                consume(a)
        b.release()


def _run_thread(rx: Receiver, consume: Consumer | None, st: RxStats,
                cpu: int | None) -> None:
    work: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
    failed: list[BaseException] = []

    def consumer() -> None:
        try:
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            while (b := work.get()) is not None:
                if consume is not None:
                    for a in b.arrays(coalesce=True):
                        consume(a)
                b.release()
        except BaseException as e:  # re-raised in the owner thread below
            failed.append(e)

    t = threading.Thread(target=consumer, name="zc-consumer", daemon=True)
    t.start()
    try:
        while not failed:
            b = rx.recv_batch(timeout=1.0)
            st.calls += 1
            if b is None:
                if rx.eof:
                    break
                continue
            st.note(b.length)
            work.put(b)
    finally:
        work.put(None)
        t.join()
    if failed:
        raise failed[0]
    st.note(0)  # the stream is done when the consumer is


def _check_cpu(cpu: object) -> int | None:
    """``consumer_cpu``: None, or a CPU this process may run on (else the consumer thread could
    never start, and the flow would stall with its buffers unreleased)."""
    if cpu is None:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu not in allowed:
        raise UsageError(f"consumer_cpu {cpu!r} is not a CPU this process may run on",
                         f"use one of {','.join(map(str, allowed))}")
    return cpu


class SoftZcEngine(_ZcEngine):
    """The soft provider: provided-buffer multishot RECV behind the zero-copy chunk API."""

    name: ClassVar[str] = "soft-zc"
    provider: ClassVar[str] = "soft"
    area_buffers: ClassVar[int] = SOFT_AREA_BUFFERS

    def close(self) -> None:
        """The soft provider lives inside run() only."""

    def unsupported(self) -> str | None:
        return self._check_consumer() or unsupported(u.IORING_OP_RECV)

    def _open(self, sock: socket.socket) -> Receiver:
        prov = open_soft(sock.fileno(), self.area_size, self.buf_size,
                         incremental=self.opts.zc_incremental)
        return build_or_close(lambda: Receiver(sock, prov, debug=self.debug, why="soft-zc engine"),
                              prov.close, prov.area.close)


class _NicEngine(_ZcEngine):
    """zcrx/devmem: the provider is opened in unsupported() and attached to the socket in run."""

    def __init__(self, opts: EngineOptions) -> None:
        super().__init__(opts)
        self._prov: NicProvider | None = None
        self._closed = False

    def unsupported(self) -> str | None:
        if self._closed:  # it would register the queue again, for nobody to release
            raise ClosedError.of(self, "unsupported")
        if why := self._check_consumer():
            return why
        ifname, q = self.opts.ifname, self.opts.queue
        copy = False
        if ifname is None or q is None:
            why = (f"{self.provider} needs --ifname and --queue naming a queue of a NIC with "
                   "header-data split and the queue API (none given)")
            if no_copy := self._no_copy_mode(why):
                return no_copy
            copy = True  # no queue named: the kernel's copy mode
        try:
            self._prov = self._open_provider(ifname, q, copy)
        except ZcnetError as e:
            return e.message
        return None

    def _open_provider(self, ifname: str | None, q: int | None, copy: bool) -> NicProvider:
        raise NotImplementedError

    def _no_copy_mode(self, why: str) -> str | None:
        """Why it cannot run without a queue (``why``: none was given), or None when the
        kernel's copy mode takes it instead."""
        return why

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        if self._closed:
            raise ClosedError.of(self, "run")
        return super().run(sock, consume)

    def _open(self, sock: socket.socket) -> Receiver:
        if self._prov is None and self.unsupported():
            raise ZcnetError(f"{self.provider} is not available here")
        assert self._prov is not None
        prov, self._prov = self._prov, None

        def attach() -> Receiver:
            prov.attach(sock.fileno())
            return Receiver(sock, prov, debug=self.debug, why=f"{self.provider}: {prov.note}")

        # The queue registration must not outlive a failed open.
        return build_or_close(attach, prov.close)

    def close(self) -> None:
        """Release a registration made by unsupported() that run() never took over; the engine
        is done then (unsupported and run raise ClosedError)."""
        self._closed = True
        prov, self._prov = self._prov, None
        if prov is not None:
            prov.close()


class ZcrxEngine(_NicEngine):
    """zcrx: a registration of ``queue`` of its own (or copy mode), or the queues a server
    session hosts for its flows (``hosted``: one ZcrxHandoff per queue of ``queues``); the
    connection joins the one it arrived on."""

    name: ClassVar[str] = "zcrx"
    provider: ClassVar[str] = "zcrx"

    def __init__(self, opts: EngineOptions) -> None:
        super().__init__(opts)
        self.hosted: tuple[ZcrxHandoff, ...] = ()
        self._imported: list[ZcrxQueue] = []

    def unsupported(self) -> str | None:
        if self._closed or not self.hosted:
            try:
                if len(self.opts.queue_set()) > 1 and not self._closed:
                    return (f"zcrx registers one queue at a time: queues={self.opts.queues} "
                            "works under `zcnet server` (the session hosts a zcrx per queue "
                            f"for its flows, Linux {IMPORT_SINCE}+); name one queue here")
            except UsageError as e:
                return e.message
            return super().unsupported()
        if why := self._check_consumer():
            return why
        hosted, self.hosted = self.hosted, ()
        with contextlib.ExitStack() as undo:
            for h in hosted:
                undo.callback(h.close)  # an import uses its handoff up; the rest are closed
            try:
                for h in hosted:
                    self._imported.append(import_queue(h))
            except ZcnetError as e:
                self._close_imported()
                return e.message
        return None

    def _no_copy_mode(self, why: str) -> str | None:
        if not kernel_offers().copy_mode:
            return why + ", and this kernel has no zcrx copy mode (ZCRX_REG_NODEV, 7.x)"
        return None

    def _open_provider(self, ifname: str | None, q: int | None, copy: bool) -> NicProvider:
        return open_zcrx(-1, self.area_size, ifname=ifname, queue=q, copy=copy or None,
                         rx_buf_len=self.opts.zc_rx_buf_len)

    def _open(self, sock: socket.socket) -> Receiver:
        if not self._imported:
            return super()._open(sock)
        zq = arrival_queue(sock, self._imported)
        self._imported.remove(zq)
        self._close_imported()  # the others: this connection did not arrive on them
        prov = zq.join(sock.fileno())
        return build_or_close(lambda: Receiver(sock, prov, debug=self.debug,
                                               why=f"zcrx: {prov.note}"), prov.close)

    def _close_imported(self) -> None:
        queues, self._imported = self._imported, []
        with contextlib.ExitStack() as undo:
            for zq in queues:
                undo.callback(zq.close)

    def close(self) -> None:
        super().close()
        with contextlib.ExitStack() as undo:
            undo.callback(self._close_imported)
            for h in self.hosted:
                undo.callback(h.close)
            self.hosted = ()


class DevmemEngine(_NicEngine):
    """devmem: a member of this process's binding of the queues (``queue`` or ``queues``),
    or of the binding ``shared`` names (a benchmark session binds for its flow workers; the
    worker then binds nothing)."""

    name: ClassVar[str] = "devmem"
    provider: ClassVar[str] = "devmem"

    def __init__(self, opts: EngineOptions) -> None:
        super().__init__(opts)
        self.shared: SharedBinding | None = None

    def unsupported(self) -> str | None:
        if self._closed:
            raise ClosedError.of(self, "unsupported")
        if why := self._check_consumer():
            return why
        try:
            queues = self.opts.queue_set()
            if self.shared is not None:
                shared, self.shared = self.shared, None  # the provider owns its fds now
                self._prov = open_shared(-1, shared)
            elif self.opts.ifname is None or not queues:
                return ("devmem needs --ifname and --queue (or queues=1,2) naming queues of a "
                        "NIC with header-data split and the queue API (none given)")
            else:
                self._prov = open_devmem(-1, self.area_size, ifname=self.opts.ifname,
                                         queues=queues)
        except ZcnetError as e:
            return e.message
        return None

    def close(self) -> None:
        super().close()
        shared, self.shared = self.shared, None
        if shared is not None:
            shared.close()
