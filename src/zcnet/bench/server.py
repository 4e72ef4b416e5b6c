"""``zcnet server``: the daemon a client drives, one session per control connection.

Each session runs in a thread of the server and owns the flow workers it started: one process per
flow end (``zcnet.bench.rr.flow_main``), pinned where the client asks. The session speaks the
sans-I/O protocol of ``zcnet.bench.protocol`` over its socket; any invalid message gets an
``error`` reply and ends that session only.

Some facts about lifetimes, and why the code is this way:

- A session never outlives its client. Between requests the session waits at most
  ``session_timeout`` for the next message; during a run it watches its control socket next to
  the workers, so a client that dies mid-run (EOF or reset) has its workers killed at once, and
  one that vanishes silently is reaped ``GRACE`` seconds after the run should have ended.
- Workers come from a ``forkserver``: a fresh single-threaded interpreter (modules preloaded)
  that forks each worker, so a worker never inherits a lock held by one of the server's session
  threads, and starts in milliseconds (a ``spawn``ed interpreter takes a second on a loaded 2-CPU
  machine, and RX-CPU discovery may start several). Workers ask for SIGKILL when their parent
  (the forkserver) dies, and the forkserver exits with the server, so even a SIGKILLed server
  leaves no process behind; its temporary files (the forkserver's socket) are swept by the next
  server that starts (``zcnet.bench.scratch``).
- Every listener authenticates (HMAC challenge-response, constant-time compare), loopback
  included: without a token the server uses its user's token file (``zcnet.bench.authtoken``),
  which that user's client reads too. Listening beyond loopback needs an explicit token file.
- Until a peer authenticates it costs no thread: the accept loop runs every handshake itself,
  non-blocking, and hands a session thread only to an authenticated client. At most
  ``MAX_PENDING`` handshakes are held; a new connection beyond that evicts the *oldest* one.
  So a flood of silent connections cannot keep a real client out: the real client's handshake
  (two round trips, milliseconds) completes unless the flood opens ``MAX_PENDING`` new
  connections within that time. A cap per peer address would not do: on loopback every local
  user is the same peer, so the flood would lock them all out together; answering "busy"
  would refuse the real client as well.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import itertools
import logging
import multiprocessing as mp
import os
import selectors
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from zcnet.bench import protocol as proto
from zcnet.bench import scratch
from zcnet.bench.authtoken import MIN_TOKEN, default_token
from zcnet.bench.authtoken import read_token as read_token  # callers import it from here
from zcnet.bench.cpustat import CpuTimes
from zcnet.bench.protocol import NEED_DATA, Limits, LocalProtocolError, RemoteProtocolError, Role
from zcnet.bench.remote import timeout_scale
from zcnet.bench.rr import FlowSpec, encode_histogram, flow_main, merge_encoded, tx_paths
from zcnet.errors import UsageError, ZcnetError

log = logging.getLogger(__name__)

DEFAULT_LISTEN = ("127.0.0.1", proto.DEFAULT_PORT)
WORKER_TIMEOUT = 20.0     # a worker's ready / accepted report
GRACE = 10.0              # beyond a run's duration, for draining and reporting
MAX_SESSIONS = 64         # authenticated sessions at once; beyond, an error "busy"
MAX_PENDING = 128         # unauthenticated connections held at once; beyond, the oldest goes
HANDSHAKE_TIMEOUT = 5.0   # seconds from accept to authenticated
_ctx = mp.get_context("forkserver")


class SessionError(Exception):
    """A request could not be served; ``code`` goes into the error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def parse_hostport(text: str, default_port: int = proto.DEFAULT_PORT) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or ``V6`` -> (host, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    try:
        number = int(port) if port else default_port
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:   # bind/connect would raise OverflowError, not OSError
        raise UsageError(f"bad port in {text!r}", "use HOST:PORT, e.g. 127.0.0.1:18323")
    return host, number


# A worker's error code -> the session's (a usage mistake in the request, or a failure).
_WORKER_CODES = {"invalid": "invalid", "worker": "worker"}


# ---- one flow end ------------------------------------------------------------------------------

class FlowProc:
    """One worker process and its pipe; ``stop`` always leaves neither behind."""

    def __init__(self, flow: int, spec: FlowSpec) -> None:
        self.flow = flow
        self.role = spec.role
        self.conn, child = _ctx.Pipe()
        self.proc: BaseProcess = _ctx.Process(target=flow_main, args=(spec.to_dict(), child),
                                              name=f"zcnet-{spec.role}{flow}")
        self.proc.start()
        child.close()
        self.cpu: int | None = None
        self.pinned: int | None = None  # from ``pin``: the worker may be gone when results come

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def expect(self, event: str, timeout: float | None = None) -> dict[str, Any]:
        if timeout is None:
            timeout = WORKER_TIMEOUT * timeout_scale()  # slow machines (a TCG guest) scale it
        if not self.conn.poll(timeout):
            raise SessionError("worker", f"flow {self.flow} {self.role} worker: no {event} "
                               f"within {timeout:.0f} s")
        msg = self.recv()
        if msg.get("event") != event:
            code = "unsupported" if msg.get("event") == "unsupported" else \
                _WORKER_CODES.get(msg.get("code"), "worker")
            raise SessionError(code, msg.get("reason") or f"unexpected {msg.get('event')}")
        return msg

    def recv(self) -> dict[str, Any]:
        """The worker's next message; a dead worker reads as an error event."""
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(1)
            return {"event": "error", "reason": f"{self.role} worker died ({self._how()})"}
        return msg if isinstance(msg, dict) else {"event": "error", "reason": "bad message"}

    def _how(self) -> str:
        code = self.proc.exitcode
        if code is None:
            return "its pipe closed"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()
        self.proc.close()


# ---- one session -------------------------------------------------------------------------------

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
                if ev is NEED_DATA:
                    return self.WAIT
                assert isinstance(ev, dict)
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
                if not proto.check_mac(token, self.challenge, ev["mac"]):
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

    # -- transport -------------------------------------------------------------------------------

    def _send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(self.conn.send(msg))

    def _read_into_conn(self, timeout: float) -> None:
        """Feed what arrives within ``timeout`` (possibly nothing) to the protocol."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        except ConnectionError:
            data = b""
        self.conn.receive_data(data)

    def _next(self, timeout: float) -> dict[str, Any]:
        # Reads in slices of at most a second, so a server shutdown (abort) is seen promptly.
        deadline = time.monotonic() + timeout
        while True:
            ev = self.conn.next_event()
            if ev is not NEED_DATA:
                assert isinstance(ev, dict)
                return ev
            left = deadline - time.monotonic()
            if left <= 0 or self.abort.is_set():
                raise SessionError("timeout", f"no message for {timeout:g} s")
            self._read_into_conn(min(left, 1.0))

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
        try:
            self.sock.settimeout(1.0)
            self.sock.sendall(self.conn.send_error(code, message))
        except OSError:
            pass

    def _converse(self) -> None:
        """From the authenticated handshake (``Handshake``) on: auth_ok, then requests."""
        self._send({"type": "auth_ok", "host": _host_env(self.bind_host)})
        while not self.conn.closed:
            msg = self._next(self.timeout)
            kind = msg["type"]
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

    def _spawn(self, flow: int, spec: FlowSpec) -> FlowProc:
        fp = FlowProc(flow, spec)
        self.flows[(flow, spec.role)] = fp
        log.info("session %d: flow %d %s worker pid %d", self.ident, flow, spec.role, fp.pid)
        return fp

    def on_open(self, msg: dict[str, Any]) -> dict[str, Any]:
        _check_engine(msg["engine"])
        spec = FlowSpec(role="rx", mode=msg["mode"], host=self.bind_host, engine=msg["engine"],
                        read_size=msg["read_size"], req_size=msg["req_size"],
                        resp_size=msg["resp_size"], name=f"zcnet-rx{msg['flow']}",
                        engine_opts=dict(msg.get("engine_opts") or {}),
                        verify=msg.get("verify", False), port=msg.get("port", 0))
        fp = self._spawn(msg["flow"], spec)
        ready = fp.expect("ready")
        return {"type": "opened", "flow": msg["flow"], "port": ready["port"], "pid": fp.pid}

    def on_connect(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["tx"] not in tx_paths():
            raise SessionError("unsupported", f"tx path {msg['tx']!r}; have {list(tx_paths())}")
        spec = FlowSpec(role="tx", mode=msg["mode"], host=msg["host"], port=msg["port"],
                        tx=msg["tx"], write_size=msg["write_size"], req_size=msg["req_size"],
                        resp_size=msg["resp_size"], name=f"zcnet-tx{msg['flow']}",
                        verify=msg.get("verify", False))
        fp = self._spawn(msg["flow"], spec)
        ready = fp.expect("ready")
        fp.cpu = ready["cpu"]
        return {"type": "connected", "flow": msg["flow"], "pid": fp.pid, "cpu": ready["cpu"],
                "local_port": ready["local_port"]}

    def on_probe(self, msg: dict[str, Any]) -> dict[str, Any]:
        fp = self._flow(msg["flow"], "rx")
        if fp.cpu is None:
            fp.cpu = fp.expect("accepted")["cpu"]
        return {"type": "probed", "flow": msg["flow"], "cpu": fp.cpu}

    def on_pin(self, msg: dict[str, Any]) -> dict[str, Any]:
        cpu = msg["cpu"]
        if cpu not in os.sched_getaffinity(0):
            raise SessionError("invalid", f"CPU {cpu} is not available to the server")
        ends = [fp for (f, role), fp in self.flows.items()
                if f == msg["flow"] and msg.get("role", role) == role]
        if not ends:
            raise SessionError("invalid", f"no flow {msg['flow']}")
        for fp in ends:
            os.sched_setaffinity(fp.pid, {cpu})
            fp.pinned = cpu
        return {"type": "pinned", "flow": msg["flow"], "cpu": cpu}

    def on_close(self, msg: dict[str, Any]) -> dict[str, Any]:
        for key in [k for k in self.flows if k[0] == msg["flow"]]:
            self.flows.pop(key).stop()
        return {"type": "closed", "flow": msg["flow"]}

    def on_start(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run every flow end for ``duration``; a dead or failing worker is that flow's error."""
        duration = msg["duration"]
        before = CpuTimes.read()
        t0 = time.monotonic()
        ends = sorted(self.flows.values(), key=lambda fp: fp.role != "rx")  # receivers first
        for fp in ends:
            with contextlib.suppress(OSError):  # dead already: its recv below reports it
                fp.conn.send({"cmd": "start", "duration": duration})
        results: dict[int, dict[str, Any]] = {}
        pending = {fp.conn: fp for fp in ends}
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
                if c is self.sock:
                    continue
                fp = pending.pop(c)   # type: ignore[call-overload]
                got = fp.recv()
                if got.get("event") == "accepted":   # never probed: the report is still queued
                    fp.cpu = got["cpu"]
                    pending[c] = fp               # type: ignore[index]
                    continue
                results[id(fp)] = got if got.get("event") == "result" else _error(
                    fp, got.get("reason", "worker failed"))
        seconds = time.monotonic() - t0
        cpus = CpuTimes.read().since(before)
        flows = []
        watch: set[int] = set()
        for fp in ends:
            r = dict(results.get(id(fp)) or _error(fp, "no result"))
            r.pop("event", None)
            r.update(flow=fp.flow, role=fp.role, pid=fp.pid,
                     pinned=fp.pinned if fp.pinned is not None else _pinned(fp))
            flows.append(r)
            # Where the flow was placed (fp.cpu, from discovery) and where it ended up.
            watch.update(c for c in (fp.cpu, r.get("incoming_cpu"), r["pinned"])
                         if c is not None and c >= 0)
        for fp in ends:
            fp.stop()
        self.flows.clear()
        out = {"type": "results", "flows": flows, "seconds": seconds,
               "cpus": {str(c): cpus[c] for c in sorted(watch) if c in cpus}}
        hists = [h for f in flows if (h := f.pop("hist", None))]
        if hists:
            out["hist"] = encode_histogram(merge_encoded(hists))
        return out

    def _control_during_run(self) -> None:
        """The client spoke (or vanished) mid-run: only ``end`` or EOF can come; both abort."""
        self._read_into_conn(1.0)
        try:
            ev = self.conn.next_event()
        except RemoteProtocolError:
            raise
        if ev is not NEED_DATA:
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


def _host_env(bind_host: str) -> dict[str, Any]:
    from zcnet.bench.meta import collect_env

    env = collect_env(lab=False)
    out = {k: env[k] for k in ("kernel", "cpus", "cpu_model", "arch", "python", "hostname")}
    # The NIC flows arrive on, when the server listens on one interface's address.
    from zcnet.nic.info import ifname_for_address, nic_env

    ifname = ifname_for_address(bind_host)
    if ifname is not None:
        out["nic"] = nic_env(ifname)
    return out


def _error(fp: FlowProc, reason: str) -> dict[str, Any]:
    return {"event": "error", "error": reason, "role": fp.role}


def _pinned(fp: FlowProc) -> int | None:
    try:
        cpus = os.sched_getaffinity(fp.pid)
    except OSError:
        return None
    return next(iter(cpus)) if len(cpus) == 1 else None


def _check_engine(name: str) -> None:
    from zcnet.rx.engines import engine_names

    if name not in engine_names():
        raise SessionError("unsupported", f"rx engine {name!r}; have {engine_names()}")


HANDLERS: dict[str, Callable[[Session, dict[str, Any]], dict[str, Any]]] = {
    "open": Session.on_open,
    "connect": Session.on_connect,
    "probe": Session.on_probe,
    "pin": Session.on_pin,
    "close": Session.on_close,
    "start": Session.on_start,
}


# ---- the server --------------------------------------------------------------------------------

class Server:
    """Accepts control connections, authenticates them (:class:`Handshake`) and runs each
    authenticated one as a :class:`Session` in its own thread.

    ``token``: the shared secret; ``None`` means this user's token file (created on first use).
    """

    def __init__(self, listen: tuple[str, int] = DEFAULT_LISTEN, token: bytes | None = None,
                 limits: Limits | None = None, session_timeout: float = 60.0) -> None:
        host, port = listen
        if not is_loopback(host) and not token:
            raise UsageError(f"listening on {host} without a token would let anyone on the "
                             "network run workers", "pass --token-file FILE (same file for the "
                             "client), or listen on 127.0.0.1")
        if token is not None and len(token) < MIN_TOKEN:
            raise UsageError(f"a token of {len(token)} bytes is too short",
                             f"use at least {MIN_TOKEN} bytes of secret")
        self.token = token if token is not None else default_token(create=True)
        self.limits = limits or Limits()
        self.session_timeout = session_timeout
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(socket.SOMAXCONN)
        except OSError as e:
            self.sock.close()
            raise ZcnetError(f"cannot listen on {host}:{port}: {e.strerror}",
                             "pick another --listen address or port") from None
        self.sock.setblocking(False)
        self.host = host
        self.port = self.sock.getsockname()[1]
        # Data sockets bind where the control socket listens (all addresses for a wildcard).
        self.bind_host = host
        self._sessions: dict[int, tuple[Session, threading.Thread]] = {}
        self._pending: dict[socket.socket, Handshake] = {}   # oldest first
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Start the forkserver now, while this process has a single thread; its temporary
        # files go to a scratch directory that outlives no server (zcnet.bench.scratch).
        with contextlib.ExitStack() as undo:
            undo.callback(self.sock.close)
            scratch.sweep()
            _ctx.set_forkserver_preload(["zcnet.bench.rr", "zcnet.rx.engines", "zcnet.pattern"])
            if scratch.fits():
                with scratch.Scratch().as_tempdir():
                    _start_forkserver()
            else:
                log.warning("temp directory %s: path too long for a scratch directory; a "
                            "killed server may leave pymp-* there", tempfile.gettempdir())
                _start_forkserver()
            undo.pop_all()

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    if key.fileobj is self.sock:
                        self._accept(sel)
                    elif (hs := self._pending.get(key.fileobj)) is not None:  # type: ignore
                        self._step(sel, hs)
                self._expire(sel)
                self._collect()
        finally:
            for hs in list(self._pending.values()):
                self._forget(sel, hs)
                hs.sock.close()
            sel.close()
            self.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        # A bounded batch, so that handshakes in progress are served between batches.
        for _ in range(MAX_PENDING):
            try:
                csock, addr = self.sock.accept()
            except OSError as e:   # EAGAIN: accepted all; or the peer reset before accept
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    # Out of descriptors: the connection stays queued and the socket readable;
                    # free one (or wait a moment) rather than spin on it.
                    log.warning("accept: %s", e.strerror)
                    if self._pending:
                        self._evict_oldest(sel)
                    else:
                        time.sleep(0.1)
                return
            if len(self._pending) >= MAX_PENDING:
                self._evict_oldest(sel)
            peer = f"{addr[0]}:{addr[1]}"
            deadline = time.monotonic() + min(self.session_timeout, HANDSHAKE_TIMEOUT)
            hs = Handshake(csock, peer, self.limits, deadline)
            self._pending[csock] = hs
            sel.register(csock, selectors.EVENT_READ)

    def _evict_oldest(self, sel: selectors.BaseSelector) -> None:
        oldest = next(iter(self._pending.values()))
        log.info("%s: evicted, unauthenticated, for a newer connection", oldest.peer)
        self._forget(sel, oldest)
        oldest.sock.close()

    def _forget(self, sel: selectors.BaseSelector, hs: Handshake) -> None:
        del self._pending[hs.sock]
        sel.unregister(hs.sock)

    def _step(self, sel: selectors.BaseSelector, hs: Handshake) -> None:
        state = hs.step(self.token)
        if state == Handshake.WAIT:
            return
        self._forget(sel, hs)
        if state == Handshake.DROP:
            hs.sock.close()
            return
        self._collect()
        if len(self._sessions) >= MAX_SESSIONS:
            log.warning("refusing %s: %d sessions already", hs.peer, MAX_SESSIONS)
            hs.refuse("busy", f"server busy: {MAX_SESSIONS} sessions already")
            hs.sock.close()
            return
        self._begin(hs)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for hs in [h for h in self._pending.values() if h.deadline <= now]:
            log.info("%s: no authentication within %g s", hs.peer, HANDSHAKE_TIMEOUT)
            self._forget(sel, hs)
            hs.refuse("timeout", "no authentication in time")
            hs.sock.close()

    def _begin(self, hs: Handshake) -> None:
        ident = next(self._ids)
        s = Session(hs.sock, hs.peer, hs.conn, self.session_timeout, self.bind_host, ident)
        t = threading.Thread(target=s.run, name=f"zcnet-session-{ident}", daemon=True)
        with self._lock:
            self._sessions[ident] = (s, t)
        log.info("session %d from %s", ident, hs.peer)
        t.start()

    def _collect(self) -> None:
        with self._lock:
            for ident in [i for i, (_, t) in self._sessions.items() if not t.is_alive()]:
                del self._sessions[ident]

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Stop accepting, end every session (its workers with it), and wait for them."""
        self._stop.set()
        self.sock.close()
        with self._lock:
            sessions = list(self._sessions.values())
        for s, _ in sessions:
            s.abort.set()
            with contextlib.suppress(OSError):
                s.sock.shutdown(socket.SHUT_RDWR)
        for _, t in sessions:
            t.join(GRACE)


def _start_forkserver() -> None:
    from multiprocessing import forkserver

    forkserver.ensure_running()
