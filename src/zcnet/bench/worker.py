"""Stream workers: a receiver and a sender, each in its own process, pinned, maybe in a netns.

A worker is driven by small dict messages over a channel (JSON lines on stdio here; the
control protocol of ``zcnet server`` can carry the same dicts between hosts):

    receiver -> {"event": "ready", "port": P}   (or {"event": "unsupported", "reason": ...})
    sender   -> {"event": "ready"}           (after connecting)
    any      <- {"cmd": "start"}             (sender only: begin sending)
    any      -> {"event": "result", ...} | {"event": "error", "reason": "..."}

Run as ``python -m zcnet.bench.worker ROLE SPEC_JSON``, the channel is JSON lines on stdin and
stdout (logging goes to stderr). The sender sends the verification pattern for ``duration``
seconds and then shuts down its half of the connection; the receiver reads to EOF, so the byte
count and timing are the receiver's."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from zcnet.bench.cpustat import CpuTimes
from zcnet.errors import ZcnetError
from zcnet.pattern import PERIOD, TILED, Verifier, pattern_view
from zcnet.rx.engines import Engine, EngineOptions, close_engine, make_engine
from zcnet.uapi.socket import SO_INCOMING_CPU

log = logging.getLogger(__name__)


class Channel(Protocol):
    def send(self, obj: Any) -> None: ...

    def recv(self) -> Any: ...


@dataclass
class WorkerSpec:
    role: str                      # "rx" | "tx"
    host: str                      # address to bind (rx) or connect to (tx)
    port: int = 0
    netns: str | None = None
    cpu: int | None = None         # pin the worker to this CPU
    engine: str = "epoll"          # rx engine
    tx: str = "copy"               # tx send path
    duration: float = 2.0
    verify: bool = False
    chunk: int = 1 << 20           # sender write size
    watch_cpus: list[int] = field(default_factory=list)  # CPUs whose /proc/stat share to report
    engine_opts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _enter(spec: WorkerSpec) -> None:
    if spec.netns:
        from zcnet.lab.netns import enter_netns

        enter_netns(spec.netns)
    if spec.cpu is not None:
        os.sched_setaffinity(0, {spec.cpu})


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def run_receiver(spec: WorkerSpec, chan: Channel) -> None:
    _enter(spec)
    engine = make_engine(spec.engine, EngineOptions(**spec.engine_opts))
    try:
        _receive(spec, chan, engine)
    finally:
        close_engine(engine)


def _receive(spec: WorkerSpec, chan: Channel, engine: Engine) -> None:
    why = engine.unsupported()
    if why:
        chan.send({"event": "unsupported", "reason": why})
        return
    with socket.socket(_family(spec.host), socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((spec.host, spec.port))
        ls.listen(1)
        chan.send({"event": "ready", "port": ls.getsockname()[1]})
        conn, _ = ls.accept()
    with conn:
        verifier = Verifier() if spec.verify else None
        before = CpuTimes.read()
        stats = engine.run(conn, verifier.check if verifier else None)
        cpu = CpuTimes.read().since(before)
        incoming = conn.getsockopt(socket.SOL_SOCKET, SO_INCOMING_CPU)
    result: dict[str, Any] = {
        "event": "result",
        "bytes": stats.bytes,
        "seconds": stats.seconds(),
        "calls": stats.calls,
        "incoming_cpu": incoming,
        "app_cpu": spec.cpu,
        "cpu": {str(c): cpu.get(c, {}) for c in spec.watch_cpus},
        "engine_stats": stats.extra,
    }
    if verifier:
        result["verify"] = verifier.as_dict()
    chan.send(result)


def _send_copy(sock: socket.socket, spec: WorkerSpec) -> tuple[int, dict[str, Any]]:
    """Plain send() of views of the tiled pattern: no user-space copy at all."""
    chunk = min(spec.chunk, PERIOD)
    mv = memoryview(TILED)
    sent = 0
    calls = 0
    deadline = time.monotonic() + spec.duration
    while time.monotonic() < deadline:
        for _ in range(8):  # amortize the clock read
            start = sent % PERIOD
            sent += sock.send(mv[start:start + chunk])
        calls += 8
    return sent, {"kind": "copy", "path": "copy", "sends": calls, "bytes": sent}


def _send_via(sock: socket.socket, spec: WorkerSpec) -> tuple[int, dict[str, Any]]:
    """A zcnet.tx send path (MSG_ZEROCOPY, SEND_ZC ...) over slots of one buffer.

    With --verify each slot is filled with the pattern at its stream offset just before it is
    sent (a copy, which is why only verifying runs pay it); otherwise slots keep what they hold.
    """
    from zcnet.tx.senders import make_sender

    slots, chunk = 8, min(spec.chunk, 256 << 10)
    buf = np.empty(slots * chunk, dtype=np.uint8)
    for i in range(slots):
        buf[i * chunk:(i + 1) * chunk] = pattern_view(i * chunk, chunk)
    pos = 0

    def fill(slot: int, view: memoryview) -> None:
        nonlocal pos
        np.frombuffer(view, dtype=np.uint8)[:chunk] = pattern_view(pos, chunk)
        pos += chunk

    sender = make_sender(spec.tx, sock, buf, slots=slots, on_fill=fill if spec.verify else None)
    sent = 0
    try:
        deadline = time.monotonic() + spec.duration
        while time.monotonic() < deadline:
            for _ in range(8):
                sent += sender.send(chunk)
        sender.flush()
    finally:
        sender.close()
    return sent, sender.stats().as_dict()


def send_stream(sock: socket.socket, spec: WorkerSpec) -> tuple[int, dict[str, Any]]:
    """Send the pattern for ``spec.duration`` by ``spec.tx``; (bytes sent, send-path stats)."""
    return (_send_copy if spec.tx == "copy" else _send_via)(sock, spec)


def run_sender(spec: WorkerSpec, chan: Channel) -> None:
    _enter(spec)
    sock = socket.create_connection((spec.host, spec.port), timeout=5)
    with sock:
        sock.settimeout(None)
        chan.send({"event": "ready"})
        msg = chan.recv()
        if msg.get("cmd") != "start":
            return
        sent, tx_stats = send_stream(sock, spec)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # wait for the receiver to close: its count is then final
    chan.send({"event": "result", "bytes_sent": sent, "tx_stats": tx_stats})


ROLES = {"rx": run_receiver, "tx": run_sender}


def worker_main(spec_dict: dict[str, Any], chan: Channel) -> None:
    """Process entry point: run one worker; every failure becomes an error message."""
    spec = WorkerSpec(**spec_dict)
    try:
        ROLES[spec.role](spec, chan)
    except (OSError, ValueError, RuntimeError, ZcnetError) as e:
        log.debug("worker %s failed", spec.role, exc_info=True)
        chan.send({"event": "error", "reason": f"{spec.role} worker: {e}"})
    except KeyboardInterrupt:
        pass


class StdioChannel:
    """JSON lines over stdin/stdout: the channel of a worker started by the coordinator."""

    def __init__(self) -> None:
        self._in = sys.stdin
        self._out = sys.stdout

    def send(self, obj: Any) -> None:
        self._out.write(json.dumps(obj) + "\n")
        self._out.flush()

    def recv(self) -> Any:
        line = self._in.readline()
        return json.loads(line) if line else {}


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="zcnet worker: %(levelname)s: %(message)s")
    worker_main(json.loads(sys.argv[2]), StdioChannel())
