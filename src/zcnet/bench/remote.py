"""Start a ``zcnet server`` on another host over ssh, and stop it afterwards.

The convention of the kernel's net selftests: the remote command runs under a plain
``ssh HOST -- CMD`` (no tty), the local side keeps the ssh process, and stopping means ending it.

Some facts about ssh and remote lifetimes: without a tty, killing the local ssh does not signal
the remote command; the remote side only sees its stdin reach EOF when the connection goes away.
So the server runs with ``--exit-on-eof`` and the client holds its stdin open: closing it (or the
client dying, which closes it too) stops the server. The server's stderr is a pipe to us: once
it is up, a thread drains it (keeping a tail), or a long run's warnings would fill the pipe and
block the server in its logging for good. The token travels on that same stdin
(``--token-file -``), so it never appears in a process list or a file on the remote host, and the
remote listens beyond loopback only with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import selectors
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from zcnet.bench.proto import DEFAULT_PORT
from zcnet.errors import UsageError, ZcnetError
from zcnet.netns import netns_popen

log = logging.getLogger(__name__)

READY_PREFIX = "zcnet server listening on "
START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0
# A factor on start-up timeouts for slow machines (this one, and the server's wait for a flow
# worker to come up): `zcnet vm run` sets it in an emulated (TCG) guest, where a Python process
# takes many times longer to start.
TIMEOUT_SCALE_ENV = "ZCNET_TIMEOUT_SCALE"


def timeout_scale() -> float:
    """``$ZCNET_TIMEOUT_SCALE``: a number >= 1 (unset: 1)."""
    text = os.environ.get(TIMEOUT_SCALE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        scale = float("nan")
    if not scale >= 1 or scale == float("inf"):
        raise UsageError(f"{TIMEOUT_SCALE_ENV}={text!r} is not a number >= 1",
                         f"unset it, or set e.g. {TIMEOUT_SCALE_ENV}=10 on a slow machine")
    return scale


def start_timeout() -> float:
    """START_TIMEOUT times ``timeout_scale()``."""
    return START_TIMEOUT * timeout_scale()


@dataclass
class RemoteServer:
    """A server on ``host`` for the duration of a ``with`` block."""

    host: str
    port: int = DEFAULT_PORT
    listen: str = "0.0.0.0"
    ssh: str = "ssh"
    python: str = "python3"
    ssh_opts: tuple[str, ...] = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
    server_args: tuple[str, ...] = ()
    token: bytes = field(default_factory=lambda: secrets.token_hex(32).encode())
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    address: str | None = field(default=None, init=False)
    _drain: threading.Thread | None = field(default=None, init=False, repr=False)
    stderr_tail: deque[bytes] = field(default_factory=lambda: deque(maxlen=64), init=False,
                                      repr=False)

    def command(self) -> list[str]:
        """The local argv: ssh, its options, the host, then the remote command as one string."""
        listen = f"[{self.listen}]:{self.port}" if ":" in self.listen else \
            f"{self.listen}:{self.port}"
        remote = [self.python, "-m", "zcnet", "server", "--listen", listen, "--token-file", "-",
                  "--exit-on-eof", *self.server_args]
        return [self.ssh, *self.ssh_opts, self.host, "--", shlex.join(remote)]

    def start(self) -> RemoteServer:
        if self.proc is not None:  # a second server would orphan the first one's process
            raise UsageError(f"the server for {self.host} is already started",
                             "use the running one (or stop() it first); enter `with` once")
        argv = self.command()
        log.info("starting remote server: %s", shlex.join(argv))
        try:
            self.proc = self._launch(argv)
        except OSError as e:
            raise ZcnetError(f"cannot run {self.ssh}: {e.strerror}",
                             "install an ssh client or pass --ssh-cmd") from None
        with contextlib.ExitStack() as undo:
            undo.callback(self.stop)   # unless the server comes up
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(self.token + b"\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass  # ssh already exited (e.g. refused): _wait_ready reports its stderr
            self.address = self._wait_ready()
            self._drain = threading.Thread(target=_drain, args=(self.proc.stderr,
                                                                self.stderr_tail),
                                           name="zcnet-remote-stderr", daemon=True)
            self._drain.start()
            undo.pop_all()
        log.info("remote server on %s is up at %s", self.host, self.address)
        return self

    def _launch(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def _wait_ready(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + start_timeout()
        line = b""
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=deadline - time.monotonic()):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
                # Complete lines only: ssh may hand the ready line over in pieces.
                for text in line.decode(errors="replace").split("\n")[:-1]:
                    if text.startswith(READY_PREFIX):
                        return text[len(READY_PREFIX):].strip()
        finally:
            sel.close()
        err = self._stderr_tail()
        raise ZcnetError(f"remote server on {self.host} did not start: {err or 'no output'}",
                         f"check `{self.ssh} {self.host} {self.python} -m zcnet --version` works")

    def _stderr_tail(self) -> str:
        if self.proc is None or self.proc.stderr is None:
            return ""
        try:  # stdout hit EOF: the process is ending; its exit may lag a moment
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            return ""
        return self.proc.stderr.read().decode(errors="replace").strip()[-400:]

    def stop(self) -> int | None:
        """Close stdin (the server exits on EOF), wait; escalate only if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.stdin is not None:
            with contextlib.suppress(OSError):  # a dead ssh: nothing left to close
                proc.stdin.close()
        try:
            rc = proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                rc = proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
        drain, self._drain = self._drain, None
        if drain is not None:   # EOF follows the exit (unless a grandchild holds the pipe)
            drain.join(STOP_TIMEOUT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return rc

    def __enter__(self) -> RemoteServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _drain(stream: object, tail: deque[bytes]) -> None:
    """Read a pipe to EOF, keeping its last lines (for a post-mortem), so its writer never
    blocks."""
    fd = stream.fileno()  # type: ignore[attr-defined]
    with contextlib.suppress(OSError, ValueError):   # closed under us: nothing more to read
        while chunk := os.read(fd, 65536):
            tail.extend(chunk.splitlines(keepends=True))


@dataclass
class NetnsServer(RemoteServer):
    """The same lifecycle for a server inside a network namespace of this machine (a lab side):
    ``NetnsServer(lab.ns_b, host=lab.addr_b)``; port 0 (default) picks a free port there."""

    netns: str = ""
    port: int = 0
    python: str = sys.executable   # the same interpreter: this machine, same install

    def __post_init__(self) -> None:
        self.listen = self.host

    def command(self) -> list[str]:
        listen = f"[{self.listen}]:{self.port}" if ":" in self.listen else \
            f"{self.listen}:{self.port}"
        return [self.python, "-m", "zcnet", "server", "--listen", listen, "--token-file", "-",
                "--exit-on-eof", *self.server_args]

    def _launch(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return netns_popen(self.netns, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)


@dataclass
class LocalServer(NetnsServer):
    """A server on this host, outside any namespace: the receiving end of a run between two
    real hosts, listening on the address of the NIC under test."""

    def _launch(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
