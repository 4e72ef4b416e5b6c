"""One control connection of ``zcnet server``: its handshake, driven by the accept loop
without a thread (:class:`Handshake`), then, once authenticated, its requests served in a thread
of its own (:class:`Session`), which owns the flow workers it started.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from multiprocessing.connection import wait

from zcnet.bench import devmem_flows, proto, zcrx_flows
from zcnet.bench.cpustat import CpuTimes
from zcnet.bench.flow_worker import Accepted, Failed, FlowSpec, Ready, Start, tx_paths
from zcnet.bench.hist import encode_histogram, merge_encoded
from zcnet.bench.meta import collect_env
from zcnet.bench.proto import (
    GRACE,
    Channel,
    Limits,
    LocalProtocolError,
    Message,
    NeedData,
    RemoteProtocolError,
    Role,
    get,
    get_options,
    get_or,
)
from zcnet.bench.records import FlowEnd, RunResults, to_json
from zcnet.bench.worker import FlowProc, SessionError
from zcnet.jsonvalue import JSONObject
from zcnet.nic.info import ifname_for_address, nic_env
from zcnet.rx.registry import engine_names
from zcnet.rx.zc.devmem_binding import DevmemBinding

log = logging.getLogger("zcnet.bench.server")

HANDSHAKE_TIMEOUT = 5.0   # seconds from accept to authenticated


class Handshake:
    """One accepted connection until it authenticates, driven by the accept loop (no thread):
    hello -> welcome, auth -> checked. Non-blocking; ``step`` says how it stands."""

    WAIT, AUTHENTICATED, DROP = "wait", "authenticated", "drop"

    def __init__(self, sock: socket.socket, peer: str, limits: Limits, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.limits = limits
        self.deadline = deadline
        self.conn = proto.Connection(Role.SERVER, limits)
        self.challenge = proto.new_challenge()
        sock.setblocking(False)

    def step(self, token: bytes) -> str:
        """Take what arrived; answer hello, judge auth. Never raises for what the peer does."""
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            return self.WAIT
        except OSError:
            data = b""
        self.conn.receive_data(data)
        try:
            while True:
                ev = self.conn.next_event()
                if isinstance(ev, NeedData):
                    return self.WAIT
                if ev["type"] == "error":   # the client may give up at any point, even first
                    log.warning("%s: client error: %s", self.peer, ev["message"])
                    return self.DROP
                if ev["type"] == "hello":
                    log.info("%s: hello, caps %s", self.peer, ev["caps"])
                    self._send(self.conn.send({
                        "type": "welcome", "version": proto.PROTOCOL_VERSION,
                        "caps": list(proto.CAPABILITIES), "challenge": self.challenge,
                        "cpus": os.cpu_count() or 1, "limits": self.limits.to_wire()}))
                    continue
                if not proto.check_mac(token, self.challenge, get(ev, "mac", str)):
                    log.warning("%s: authentication failed, nothing run", self.peer)
                    self.refuse("auth", "authentication failed")
                    return self.DROP
                return self.AUTHENTICATED
        except RemoteProtocolError as e:
            if e.code != "eof":
                log.warning("%s: %s", self.peer, e.message)
                self.refuse(e.code, e.message)
            return self.DROP
        except OSError as e:
            log.info("%s: connection lost: %s", self.peer, e)
            return self.DROP

    def _send(self, data: bytes) -> None:
        # A few hundred bytes into an empty socket buffer: all or the peer is not reading.
        if self.sock.send(data) != len(data):
            raise BlockingIOError(errno.EAGAIN, "peer does not read")

    def refuse(self, code: str, message: str) -> None:
        with contextlib.suppress(OSError, LocalProtocolError):
            self._send(self.conn.send_error(code, message))



@dataclass
class Session:
    """An authenticated client: its requests, served in a thread of its own."""

    sock: socket.socket
    peer: str
    conn: proto.Connection
    timeout: float
    bind_host: str
    ident: int
    flows: dict[tuple[int, str], FlowProc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.abort = threading.Event()
        self.sock.setblocking(True)
        self.chan = Channel(self.sock, self.conn)

    def _send(self, msg: Message) -> None:
        self.chan.send(msg)

    def _next(self, timeout: float) -> Message:
        # Reads in slices of at most a second, so a server shutdown (abort) is seen promptly.
        ev = self.chan.receive(timeout, slice_s=1.0, stop=self.abort.is_set)
        if ev is None:
            raise SessionError("timeout", f"no message for {timeout:g} s")
        return ev

    # -- conversation ----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._converse()
        except RemoteProtocolError as e:
            if e.code == "eof":
                log.info("session %d (%s): client went away", self.ident, self.peer)
            else:
                log.warning("session %d (%s): %s", self.ident, self.peer, e.message)
                self._try_error(e.code, e.message)
        except SessionError as e:
            log.warning("session %d (%s): %s", self.ident, self.peer, e)
            self._try_error(e.code, str(e))
        except LocalProtocolError as e:
            # Our own reply broke the protocol (e.g. it would exceed MAX_MESSAGE): tell the
            # client rather than die silently.
            log.error("session %d (%s): %s", self.ident, self.peer, e.message)
            self._try_error("internal", e.message)
        except OSError as e:
            log.info("session %d (%s): connection lost: %s", self.ident, self.peer, e)
        finally:
            self.reap()
            self.sock.close()

    def _try_error(self, code: str, message: str) -> None:
        self.chan.send_error(code, message)

    def _converse(self) -> None:
        """From the authenticated handshake (``Handshake``) on: auth_ok, then requests."""
        self._send({"type": "auth_ok", "host": _host_env(self.bind_host)})
        while not self.conn.closed:
            msg = self._next(self.timeout)
            kind = get(msg, "type", str)
            if kind == "error":
                log.warning("session %d: client error: %s", self.ident, msg["message"])
                return
            if kind == "end":
                self.reap()
                self._send({"type": "bye"})
                return
            # A request that cannot be served raises SessionError: error reply, session over.
            try:
                reply = HANDLERS[kind](self, msg)
            except OSError as e:
                # The kernel refused something on the client's behalf (a worker gone before
                # sched_setaffinity, fork failing ...): an error reply, not a lost connection.
                raise SessionError("worker", f"{kind}: {e.strerror or e}") from None
            self._send(reply)

    # -- requests --------------------------------------------------------------------------------

    def _spawn(self, flow: int, spec: FlowSpec,
               membership: DevmemBinding | zcrx_flows.Membership | None = None) -> FlowProc:
        with contextlib.ExitStack() as undo:
            if membership is not None:
                undo.callback(membership.quit)
            fp = FlowProc(flow, spec)
            fp.held.push(undo.pop_all())  # given up when the worker is stopped
        self.flows[(flow, spec.role)] = fp
        log.info("session %d: flow %d %s worker pid %d", self.ident, flow, spec.role, fp.pid)
        return fp

    def on_open(self, msg: Message) -> Message:
        flow, engine = get(msg, "flow", int), get(msg, "engine", str)
        _check_engine(engine)
        mode, read_size = get(msg, "mode", str), get(msg, "read_size", int)
        # devmem: the binding is the session's, shared by its flows' workers.
        # devmem and zcrx on a device: the queues are the session's, shared by its flows.
        binding = devmem_flows.join(engine, get_options(msg), read_size) \
            if mode == "stream" else None
        hosted = zcrx_flows.join(engine, get_options(msg), read_size) \
            if mode == "stream" else None
        spec = FlowSpec(role="rx", mode=mode, host=self.bind_host, flow=flow,
                        engine=engine, read_size=read_size,
                        req_size=get(msg, "req_size", int), resp_size=get(msg, "resp_size", int),
                        name=f"zcnet-rx{flow}", engine_opts=get_options(msg),
                        verify=get_or(msg, "verify", False), port=get_or(msg, "port", 0),
                        devmem=binding.shared() if binding is not None else None,
                        zcrx=hosted.handoffs() if hosted is not None else ())
        fp = self._spawn(flow, spec, binding or hosted)
        ready = fp.expect(Ready)
        return {"type": "opened", "flow": flow, "port": ready.port, "pid": fp.pid}

    def on_connect(self, msg: Message) -> Message:
        flow, tx = get(msg, "flow", int), get(msg, "tx", str)
        if tx not in tx_paths():
            raise SessionError("unsupported", f"tx path {tx!r}; have {list(tx_paths())}")
        spec = FlowSpec(role="tx", mode=get(msg, "mode", str), host=get(msg, "host", str),
                        flow=flow, port=get(msg, "port", int), tx=tx,
                        write_size=get(msg, "write_size", int),
                        req_size=get(msg, "req_size", int), resp_size=get(msg, "resp_size", int),
                        name=f"zcnet-tx{flow}", verify=get_or(msg, "verify", False))
        fp = self._spawn(flow, spec)
        ready = fp.expect(Ready)
        fp.cpu = ready.cpu
        return {"type": "connected", "flow": flow, "pid": fp.pid, "cpu": ready.cpu,
                "local_port": ready.local_port}

    def on_probe(self, msg: Message) -> Message:
        flow = get(msg, "flow", int)
        fp = self._flow(flow, "rx")
        if fp.cpu is None:
            fp.cpu = fp.expect(Accepted).cpu
        return {"type": "probed", "flow": flow, "cpu": fp.cpu}

    def on_pin(self, msg: Message) -> Message:
        flow, cpu = get(msg, "flow", int), get(msg, "cpu", int)
        if cpu not in os.sched_getaffinity(0):
            raise SessionError("invalid", f"CPU {cpu} is not available to the server")
        ends = [fp for (f, role), fp in self.flows.items()
                if f == flow and get_or(msg, "role", role) == role]
        if not ends:
            raise SessionError("invalid", f"no flow {flow}")
        for fp in ends:
            os.sched_setaffinity(fp.pid, {cpu})
            fp.pinned = cpu
        return {"type": "pinned", "flow": flow, "cpu": cpu}

    def on_close(self, msg: Message) -> Message:
        flow = get(msg, "flow", int)
        for key in [k for k in self.flows if k[0] == flow]:
            self.flows.pop(key).stop()
        return {"type": "closed", "flow": flow}

    def on_start(self, msg: Message) -> Message:
        """Run every flow end for ``duration``; a dead or failing worker is that flow's error."""
        duration = get(msg, "duration", float)
        before = CpuTimes.read()
        t0 = time.monotonic()
        ends = sorted(self.flows.values(), key=lambda fp: fp.role != "rx")  # receivers first
        for fp in ends:
            with contextlib.suppress(OSError):  # dead already: its recv below reports it
                fp.conn.send(Start(duration))
        results: dict[int, FlowEnd] = {}
        pending: dict[Pipe, FlowProc] = {fp.conn: fp for fp in ends}
        deadline = t0 + duration + GRACE
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                for fp in pending.values():
                    results[id(fp)] = _error(fp, f"no result {GRACE:.0f} s after the run")
                break
            ready = wait([*pending, self.sock], timeout=min(left, 1.0))
            if self.sock in ready:
                self._control_during_run()
            for c in ready:
                if not isinstance(c, Pipe):
                    continue
                fp = pending.pop(c)
                got = fp.recv()
                if isinstance(got, Accepted):   # never probed: the report is still queued
                    fp.cpu = got.cpu
                    pending[c] = fp
                    continue
                results[id(fp)] = got if isinstance(got, FlowEnd) else _error(
                    fp, got.reason if isinstance(got, Failed) else "worker failed")
        seconds = time.monotonic() - t0
        cpus = CpuTimes.read().since(before)
        flows = []
        watch: set[int] = set()
        for fp in ends:
            end = results.get(id(fp)) or _error(fp, "no result")
            end.flow, end.role = fp.flow, fp.role
            flows.append(end)
            # Where the flow was placed (fp.cpu, from discovery), where it ended up, and where
            # its application ran.
            pinned = fp.pinned if fp.pinned is not None else _pinned(fp)
            watch.update(c for c in (fp.cpu, end.cpu_end, pinned) if c is not None and c >= 0)
        for fp in ends:
            fp.stop()
        self.flows.clear()
        hists = [f.hist for f in flows if f.hist]
        for f in flows:
            f.hist = None  # one merged histogram goes with the results
        run = RunResults(flows=flows, seconds=seconds,
                         cpus={str(c): cpus[c] for c in sorted(watch) if c in cpus},
                         hist=encode_histogram(merge_encoded(hists)) if hists else None)
        out = to_json(run)
        assert isinstance(out, dict)
        return {"type": "results", **out}

    def _control_during_run(self) -> None:
        """The client spoke (or vanished) mid-run: only ``end`` or EOF can come; both abort."""
        self.chan.read(1.0)
        ev = self.conn.next_event()   # RemoteProtocolError ("eof") when it vanished
        if not isinstance(ev, NeedData):
            raise SessionError("aborted", "client ended the session during the run")

    def _flow(self, flow: int, role: str) -> FlowProc:
        try:
            return self.flows[(flow, role)]
        except KeyError:
            raise SessionError("invalid", f"no {role} end for flow {flow}") from None

    def reap(self) -> None:
        for fp in self.flows.values():
            fp.stop()
        self.flows.clear()


def _host_env(bind_host: str) -> JSONObject:
    env = collect_env(lab=False)
    out: JSONObject = {"kernel": env.kernel, "cpus": env.cpus, "cpu_model": env.cpu_model,
                       "arch": env.arch, "python": env.python, "hostname": env.hostname}
    # The NIC flows arrive on, when the server listens on one interface's address.
    ifname = ifname_for_address(bind_host)
    if ifname is not None:
        out["nic"] = nic_env(ifname)
    return out


def _error(fp: FlowProc, reason: str) -> FlowEnd:
    return FlowEnd(flow=fp.flow, role=fp.role, status="error", reason=reason)


def _pinned(fp: FlowProc) -> int | None:
    try:
        cpus = os.sched_getaffinity(fp.pid)
    except OSError:
        return None
    return next(iter(cpus)) if len(cpus) == 1 else None


def _check_engine(name: str) -> None:
    if name not in engine_names():
        raise SessionError("unsupported", f"rx engine {name!r}; have {engine_names()}")


HANDLERS: dict[str, Callable[[Session, Message], Message]] = {
    "open": Session.on_open,
    "connect": Session.on_connect,
    "probe": Session.on_probe,
    "pin": Session.on_pin,
    "close": Session.on_close,
    "start": Session.on_start,
}
