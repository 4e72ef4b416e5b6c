"""Zero-copy receive engines for ``zcnet bench``: soft-zc, zcrx, devmem.

They follow zcnet.rx.engines' Engine interface (``name``, ``unsupported()``, ``run(sock,
consume)``); that module merges ``ENGINES`` into its table. Options are read from the shared
EngineOptions with defaults, so older option sets still work:

- ``consumer``: "same" releases in the ring's thread; "thread" hands each batch to a consumer
  thread that reads and releases it (002's experiment: the release crosses threads through the
  single-producer queue); ``consumer_cpu`` pins that thread.
- ``ifname``/``queue``: the NIC queue for zcrx and devmem. Their registration happens in
  ``unsupported()`` (the worker calls it in the receiving namespace before the connection
  exists), so a refusal becomes an ``unsupported`` cell with the kernel's reason translated.
- ``zc_buf``/``zc_area``: soft provider buffer size (1 MiB) and area (16 buffers).
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.rx.engines import Consumer, RxStats
from zcnet.rx.zc.api import Batch, Receiver
from zcnet.rx.zc.provider import Provider
from zcnet.sockcheck import require_tcp

CONSUMERS = ("same", "thread")
ZC_BUF = 1 << 20


def _opt(opts: Any, name: str, default: Any) -> Any:
    return getattr(opts, name, default)


class _ZcEngine:
    name: ClassVar[str] = ""

    def __init__(self, opts: Any) -> None:
        self.opts = opts
        self.consumer = _opt(opts, "consumer", "same")
        self.consumer_cpu: int | None = _check_cpu(_opt(opts, "consumer_cpu", None))
        # Big buffers: the kernel's per-buffer cost (iovec setup, CQE, ring entry) then stays
        # small next to the copy; measured here, 1 MiB buffers took ~15% less kernel CPU per
        # byte than 64 KiB ones (benchmarks/zc_rx.py prints CPU per GiB).
        self.buf_size = int(_opt(opts, "zc_buf", 0) or ZC_BUF)
        self.area_size = int(_opt(opts, "zc_area", 0) or 16 * self.buf_size)
        self.debug = bool(_opt(opts, "zc_debug", False))

    def _check_consumer(self) -> str | None:
        if self.consumer not in CONSUMERS:
            return f"unknown consumer {self.consumer!r}; choose {' or '.join(CONSUMERS)}"
        return None

    def _open(self, sock: socket.socket) -> Receiver:
        raise NotImplementedError

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        require_tcp(sock, f"{self.name} engine")
        sock.setblocking(True)
        st = RxStats()
        with self._open(sock) as rx:
            if self.consumer == "thread":
                _run_thread(rx, consume, st, self.consumer_cpu)
            else:
                _run_same(rx, consume, st)
            rx.flush()
            st.extra = {k: v for k, v in rx.stats_dict().items() if isinstance(v, int)}
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


def _check_cpu(cpu: Any) -> int | None:
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

    def unsupported(self) -> str | None:
        from zcnet.uapi import io_uring as u
        from zcnet.uring.bufring import unsupported

        return self._check_consumer() or unsupported(u.IORING_OP_RECV)

    def _open(self, sock: socket.socket) -> Receiver:
        from zcnet.rx.zc.soft import open_soft

        prov = open_soft(sock.fileno(), self.area_size, self.buf_size,
                         incremental=bool(_opt(self.opts, "zc_incremental", False)))
        try:
            return Receiver(sock, prov, debug=self.debug, why="soft-zc engine")
        except BaseException:
            prov.close()
            prov.area.close()
            raise


class _NicEngine(_ZcEngine):
    """zcrx/devmem: the provider is opened in unsupported() and attached to the socket in run."""

    provider: ClassVar[str] = ""

    def __init__(self, opts: Any) -> None:
        super().__init__(opts)
        self._prov: Provider | None = None
        self._closed = False

    def unsupported(self) -> str | None:
        if self._closed:  # it would register the queue again, for nobody to release
            raise ClosedError.of(self, "unsupported")
        if why := self._check_consumer():
            return why
        ifname, q = _opt(self.opts, "ifname", None), _opt(self.opts, "queue", None)
        if ifname is None or q is None:
            return (f"{self.provider} needs --ifname and --queue naming a queue of a NIC with "
                    "header-data split and the queue API (none given)")
        try:
            self._prov = _OPEN[self.provider](-1, self.area_size, ifname=ifname, queue=q)
        except ZcnetError as e:
            return e.message
        return None

    def run(self, sock: socket.socket, consume: Consumer | None) -> RxStats:
        if self._closed:
            raise ClosedError.of(self, "run")
        return super().run(sock, consume)

    def _open(self, sock: socket.socket) -> Receiver:
        if self._prov is None and self.unsupported():
            raise ZcnetError(f"{self.provider} is not available here")
        assert self._prov is not None
        prov, self._prov = self._prov, None
        try:
            prov.attach(sock.fileno())  # type: ignore[attr-defined]
            return Receiver(sock, prov, debug=self.debug,
                            why=f"{self.provider} on {_opt(self.opts, 'ifname', '?')}")
        except BaseException:
            prov.close()  # the queue registration must not outlive a failed open
            raise

    def close(self) -> None:
        """Release a registration made by unsupported() that run() never took over; the engine
        is done then (unsupported and run raise ClosedError)."""
        self._closed = True
        prov, self._prov = self._prov, None
        if prov is not None:
            prov.close()


def _open_zcrx(fd: int, size: int, **kw: Any) -> Provider:
    from zcnet.rx.zc.zcrx import open_zcrx

    return open_zcrx(fd, size, **kw)


def _open_devmem(fd: int, size: int, **kw: Any) -> Provider:
    from zcnet.rx.zc.devmem import open_devmem

    return open_devmem(fd, size, **kw)


_OPEN: dict[str, Callable[..., Provider]] = {"zcrx": _open_zcrx, "devmem": _open_devmem}


class ZcrxEngine(_NicEngine):
    name: ClassVar[str] = "zcrx"
    provider: ClassVar[str] = "zcrx"


class DevmemEngine(_NicEngine):
    name: ClassVar[str] = "devmem"
    provider: ClassVar[str] = "devmem"


ENGINES: dict[str, Callable[[Any], Any]] = {
    SoftZcEngine.name: SoftZcEngine,
    ZcrxEngine.name: ZcrxEngine,
    DevmemEngine.name: DevmemEngine,
}
