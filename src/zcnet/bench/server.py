"""``zcnet server``: the daemon a client drives, one session per control connection.

Each session runs in a thread of the server and owns the flow workers it started: one process per
flow end (``zcnet.bench.flow_worker``), pinned where the client asks. The session speaks the
protocol of ``zcnet.bench.proto`` over its socket; any invalid message gets an
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
import itertools
import logging
import selectors
import socket
import tempfile
import threading
import time
from multiprocessing import forkserver

from zcnet.bench import scratch
from zcnet.bench.authtoken import default_token
from zcnet.bench.endpoint import DEFAULT_LISTEN, check_listener
from zcnet.bench.proto import GRACE, Limits
from zcnet.bench.session import HANDSHAKE_TIMEOUT, Handshake, Session
from zcnet.bench.worker import CTX
from zcnet.errors import ZcnetError

log = logging.getLogger(__name__)

MAX_SESSIONS = 64         # authenticated sessions at once; beyond, an error "busy"
MAX_PENDING = 128         # unauthenticated connections held at once; beyond, the oldest goes


class Server:
    """Accepts control connections, authenticates them (:class:`Handshake`) and runs each
    authenticated one as a :class:`Session` in its own thread.

    ``token``: the shared secret; ``None`` means this user's token file (created on first use).
    """

    def __init__(self, listen: tuple[str, int] = DEFAULT_LISTEN, token: bytes | None = None,
                 limits: Limits | None = None, session_timeout: float = 60.0) -> None:
        host, port = listen
        check_listener(host, token)
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
            CTX.set_forkserver_preload([
                "zcnet.bench.flow_worker", "zcnet.rx.registry", "zcnet.pattern"])
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
    forkserver.ensure_running()
