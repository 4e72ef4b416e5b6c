"""Flow workers: the process at each end of one flow of ``zcnet server`` (stream or rr).

A server session starts one worker process per flow end and drives it with messages (the
dataclasses below) over a pipe, with a step between accept and start so that the client can
discover the receive CPU and reconnect before anything is measured:

    rx -> Ready(port=P)                      listening
    rx -> Accepted(cpu=C)                    SO_INCOMING_CPU right after accept
    tx -> Ready(cpu=C, local_port=L)
    any <- Start(duration=D)
    any -> FlowEnd(...) | Failed(reason, code) | Unsupported(reason)

Stream: the receiver reads to EOF with an rx engine of ``zcnet.rx.registry``, the sender
sends the shared verification pattern for D seconds, then shuts down its half. Request/response:
the sender writes ``req_size`` bytes and waits for ``resp_size`` back, timing each transaction;
latencies go into a list and are moved into an HDR histogram a batch at a time (one vectorized
bucketing per batch, not a Python call per sample).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from zcnet.bench import tcpinfo
from zcnet.bench.hist import encode_histogram, new_histogram, record_batch, summarize
from zcnet.bench.intervals import IntervalSampler, interval_for
from zcnet.bench.proto import UNSUPPORTED_HERE, OptionValue
from zcnet.bench.records import FlowEnd, Verify
from zcnet.bench.stream import send_stream
from zcnet.errors import UsageError, ZcnetError
from zcnet.pattern import Verifier
from zcnet.rx.engine import Engine, EngineOptions, close_engine
from zcnet.rx.registry import make_engine
from zcnet.rx.zc.devmem_binding import SharedBinding
from zcnet.rx.zc.engines import DevmemEngine, ZcrxEngine
from zcnet.rx.zc.zcrx_procs import ZcrxHandoff
from zcnet.tx.senders import KINDS
from zcnet.uapi.socket import SO_INCOMING_CPU

log = logging.getLogger(__name__)


class EngineUnsupported(RuntimeError):
    """The rx engine cannot run on this host (reported as code "unsupported", not a failure)."""


ACCEPT_TIMEOUT = 30.0
BATCH = 4096


# ---- messages between a session and its worker ---------------------------------------------------

@dataclass(frozen=True)
class Ready:
    """rx: listening on ``port``; tx: connected, its socket's incoming CPU and local port."""

    port: int | None = None
    cpu: int | None = None
    local_port: int | None = None


@dataclass(frozen=True)
class Accepted:
    cpu: int  # SO_INCOMING_CPU right after accept


@dataclass(frozen=True)
class Start:
    duration: float


@dataclass(frozen=True)
class Failed:
    reason: str
    code: str = "worker"  # "invalid": a mistake in the request (a bad engine option ...)


@dataclass(frozen=True)
class Unsupported:
    reason: str


WorkerEvent = Ready | Accepted | FlowEnd | Failed | Unsupported


class Channel(Protocol):
    """The worker's end of its pipe to the session."""

    def send(self, obj: WorkerEvent) -> None: ...

    def recv(self) -> object: ...


@dataclass
class FlowSpec:
    role: str               # "rx" (accepts, receives / answers) | "tx" (connects, sends / asks)
    mode: str               # "stream" | "rr"
    host: str               # rx: address to bind; tx: address to connect to
    flow: int = 0           # the flow's number in its session
    port: int = 0
    engine: str = "epoll"   # rx engine for stream mode
    tx: str = "copy"        # send path for stream mode
    read_size: int = 1 << 20
    write_size: int = 1 << 20
    req_size: int = 1
    resp_size: int = 1
    name: str = "zcnet-flow"
    engine_opts: dict[str, OptionValue] = field(default_factory=dict)  # EngineOptions' names
    verify: bool = False    # stream: check every received byte against the sent pattern
    # devmem: the binding its session holds for the flow's queues (zcnet.bench.devmem_flows)
    devmem: SharedBinding | None = None
    # zcrx: the queues its session hosts for the flow (zcnet.bench.zcrx_flows), one per queue
    zcrx: tuple[ZcrxHandoff, ...] = ()


# ---- process plumbing --------------------------------------------------------------------------

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def _process_setup(name: str) -> None:
    """Name the process (``ps``/``comm`` shows which are flow workers) and make it die with its
    parent, so a killed server never leaves a worker blocked in recv.

    Some facts about forkserver children: the parent of a worker is the forkserver, which exits
    when its "alive" pipe reaches EOF, i.e. when every holder of the write end is gone. Python
    hands that write end to every child it forks, so workers alone would keep the forkserver,
    and so themselves, alive after the server died. Dropping it here leaves the server as the
    only holder: server gone -> forkserver exits -> PDEATHSIG kills the workers.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(alive, int):
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]
    # The server handles Ctrl-C; a worker is stopped by its session.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _incoming_cpu(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, SO_INCOMING_CPU)


def _recv_rest(sock: socket.socket, mv: memoryview, got: int) -> None:
    """Complete a message of which ``got`` bytes arrived; the peer may not stop mid-message.

    The request/response loops call recv_into on the whole buffer first and come here only for
    the rest: a message of a few hundred bytes nearly always arrives in one piece, and the
    common case then costs no slicing and no extra call.
    """
    n = len(mv)
    while got < n:
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise ConnectionError(f"peer closed mid-message ({got} of {n} bytes)")
        got += k


def _wait_start(chan: Channel) -> float | None:
    msg = chan.recv()
    return msg.duration if isinstance(msg, Start) else None


# ---- receiving end -----------------------------------------------------------------------------

def _engine(spec: FlowSpec) -> Engine:
    """The rx engine, checked; an unknown option or a value of the wrong type is a UsageError."""
    # read_size is the buffer size the server checked against its limits: it wins over a
    # "bufsize" engine option.
    opts = EngineOptions.from_mapping(spec.engine_opts, bufsize=spec.read_size)
    engine = make_engine(spec.engine, opts)
    if spec.devmem is not None and isinstance(engine, DevmemEngine):
        engine.shared = spec.devmem  # its session bound the queues: bind nothing here
    if spec.zcrx and isinstance(engine, ZcrxEngine):
        engine.hosted = spec.zcrx  # its session registered the queues: import them
    why = engine.unsupported()
    if why:
        raise EngineUnsupported(f"engine {spec.engine}{UNSUPPORTED_HERE}{why}")
    return engine


def _serve_stream(spec: FlowSpec, conn: socket.socket, engine: Engine | None) -> FlowEnd:
    assert engine is not None  # run_rx builds one for every stream flow
    verifier = Verifier() if spec.verify else None
    stats = engine.run(conn, verifier.check if verifier else None)
    return FlowEnd(flow=spec.flow, role="rx", bytes=stats.bytes, seconds=stats.seconds(),
                   syscalls=stats.calls,
                   engine_stats=dict(stats.extra),
                   verify=Verify(checked_bytes=verifier.checked, mismatches=verifier.mismatches)
                   if verifier else None)


def _serve_rr(spec: FlowSpec, conn: socket.socket, engine: Engine | None) -> FlowEnd:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = memoryview(bytearray(spec.req_size))
    resp = bytes(spec.resp_size)
    size = spec.req_size
    recv_into, send = conn.recv_into, conn.sendall
    n = 0
    t0 = time.monotonic()
    while True:
        k = recv_into(req)
        if k != size:
            if k == 0:   # the asking side finished
                break
            _recv_rest(conn, req, k)
        send(resp)
        n += 1
    return FlowEnd(flow=spec.flow, role="rx", transactions=n, bytes=n * spec.req_size,
                   seconds=time.monotonic() - t0)


def run_rx(spec: FlowSpec, chan: Channel) -> None:
    # Built (and for zero-copy engines, bound to their NIC queue) before listening, so that a
    # refusal reaches the client at open, not at start; the same engine then runs the flow.
    engine = _engine(spec) if spec.mode == "stream" else None
    try:
        _receive(spec, chan, engine)
    finally:
        if engine is not None:
            close_engine(engine)


def _receive(spec: FlowSpec, chan: Channel, engine: Engine | None) -> None:
    with socket.socket(_family(spec.host), socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((spec.host, spec.port))
        ls.listen(1)
        chan.send(Ready(port=ls.getsockname()[1]))
        ls.settimeout(ACCEPT_TIMEOUT)
        conn, _ = ls.accept()
    with conn:
        conn.settimeout(None)
        # Nothing is sent before "start": what the socket has received now is the flow's zero.
        at_accept = tcpinfo.read(conn).get("tcpi_bytes_received")
        chan.send(Accepted(_incoming_cpu(conn)))
        duration = _wait_start(chan)
        if duration is None:
            return
        before = tcpinfo.read(conn)
        if spec.mode == "stream":
            # The rate per interval, for the cell's spread (zcnet.bench.intervals).
            with IntervalSampler(conn, interval_for(duration), at_accept) as sampler:
                result = RX_MODES[spec.mode](spec, conn, engine)
            result.intervals = sampler.record()
        else:
            result = RX_MODES[spec.mode](spec, conn, engine)
        result.cpu_end = _incoming_cpu(conn)
        result.tcp = tcpinfo.delta(before, tcpinfo.read(conn))
    chan.send(result)


# ---- sending end -------------------------------------------------------------------------------

def _send_stream(spec: FlowSpec, sock: socket.socket, duration: float) -> FlowEnd:
    """The pattern by copy or by a zcnet.tx path (zcnet.bench.stream), so the receiver can
    verify every byte."""
    t0 = time.monotonic()
    sent, tx_stats = send_stream(sock, tx=spec.tx, duration=duration, chunk=spec.write_size,
                                 verify=spec.verify)
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)  # the receiver closes after EOF: its byte count is then final
    return FlowEnd(flow=spec.flow, role="tx", bytes_sent=sent, seconds=time.monotonic() - t0,
                   tx_stats=tx_stats)


def tx_paths() -> tuple[str, ...]:
    return tuple(KINDS)


def _ask_rr(spec: FlowSpec, sock: socket.socket, duration: float) -> FlowEnd:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = bytes(spec.req_size)
    resp = memoryview(bytearray(spec.resp_size))
    hist = new_histogram()
    lat: list[int] = []
    clock = time.perf_counter_ns
    recv_into, send, append = sock.recv_into, sock.sendall, lat.append
    size = spec.resp_size
    n = 0
    start = clock()
    deadline = start + int(duration * 1e9)
    t1 = start
    while t1 < deadline:
        t0 = clock()
        send(req)
        k = recv_into(resp)
        if k != size:
            _recv_rest(sock, resp, k)
        t1 = clock()
        append(t1 - t0)
        if len(lat) >= BATCH:
            record_batch(hist, np.array(lat, dtype=np.int64))
            n += len(lat)
            lat.clear()
    record_batch(hist, np.array(lat, dtype=np.int64))
    n += len(lat)
    elapsed = (clock() - start) / 1e9
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
    return FlowEnd(flow=spec.flow, role="tx", transactions=n, seconds=elapsed,
                   bytes_sent=n * spec.req_size,
                   latency=summarize(hist), samples=hist.get_total_count(),
                   hist=encode_histogram(hist))


def run_tx(spec: FlowSpec, chan: Channel) -> None:
    sock = socket.create_connection((spec.host, spec.port), timeout=10)
    with sock:
        sock.settimeout(None)
        chan.send(Ready(cpu=_incoming_cpu(sock), local_port=sock.getsockname()[1]))
        duration = _wait_start(chan)
        if duration is None:
            return
        before = tcpinfo.read(sock)
        result = TX_MODES[spec.mode](spec, sock, duration)
        result.cpu_end = _incoming_cpu(sock)
        result.tcp = tcpinfo.delta(before, tcpinfo.read(sock))
    chan.send(result)


RX_MODES: dict[str, Callable[[FlowSpec, socket.socket, Engine | None], FlowEnd]] = {
    "stream": _serve_stream, "rr": _serve_rr}
TX_MODES: dict[str, Callable[[FlowSpec, socket.socket, float], FlowEnd]] = {
    "stream": _send_stream, "rr": _ask_rr}
ROLES: dict[str, Callable[[FlowSpec, Channel], None]] = {"rx": run_rx, "tx": run_tx}


# What a flow end may fail with; each becomes an error message naming the cause. A user
# mistake (ZcnetError: a bad engine option, a CPU that does not exist) keeps its hint.
WORKER_ERRORS = (ZcnetError, OSError, ValueError, TypeError, RuntimeError, EOFError,
                 LookupError, ArithmeticError, AttributeError, MemoryError)


def describe(spec: FlowSpec) -> str:
    """Which flow end: its role, and the engine and options (rx) or send path (tx) it runs."""
    if spec.mode == "rr":
        return f"{spec.role} worker (rr)"
    if spec.role == "tx":
        return f"tx worker (send path {spec.tx})"
    opts = "".join(f", {k}={v}" for k, v in sorted(spec.engine_opts.items()))
    return f"rx worker (engine {spec.engine}{opts})"


def flow_main(spec: FlowSpec, chan: Channel) -> None:
    """Process entry point: one flow end; every failure becomes an error message."""
    _process_setup(spec.name)
    try:
        ROLES[spec.role](spec, chan)
    except EngineUnsupported as e:
        with contextlib.suppress(OSError):
            chan.send(Unsupported(str(e)))
    except WORKER_ERRORS as e:
        log.debug("flow worker %s failed", spec.role, exc_info=True)
        code = "invalid" if isinstance(e, UsageError) else "worker"
        what = str(e) or type(e).__name__
        if not isinstance(e, (ZcnetError, OSError)):   # a bug: its type says most
            what = f"{type(e).__name__}: {what}"
        with contextlib.suppress(OSError):  # the session is gone; nobody to tell
            chan.send(Failed(f"{describe(spec)}: {what}", code))
