"""The txbench sink: a UDP receiver in its own process (and namespace) that counts and checks.

Run as ``python -m zcnet.tx.sink --bind ADDR --sizes N[,M...]``. It prints one JSON line
``{"port": P}`` once bound, then answers commands read from stdin, one per line:

- ``snap MS``: keep receiving until nothing arrived for MS milliseconds, then print the counters
  (cumulative, as JSON: see :class:`zcnet.tx.payload.Checker`);
- ``quit`` or end of input: print the counters and exit.

It receives with recvmmsg in batches and checks every packet (size, pattern, sequence sum). The
parent side is :class:`Sink`, which starts it (through the caller's ``spawn``, e.g. a lab's
``ns_exec``) and stops it on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack

from zcnet.errors import ClosedError, ZcnetError
from zcnet.tx.mmsg import MsgBatch, recvmmsg
from zcnet.tx.payload import Checker
from zcnet.uapi.socket import SO_RCVBUFFORCE

_MSG_DONTWAIT = 0x40
_RCVBUF = 32 << 20
_CHECK_STDIN_EVERY = 512  # batches between looks at the control pipe while traffic flows


def _open(bind: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, _RCVBUF)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    sock.bind((bind, port))
    sock.setblocking(False)
    return sock


def _emit(doc: dict[str, int]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def serve(sock: socket.socket, sizes: tuple[int, ...], batch_count: int = 256) -> None:
    checker = Checker(sizes)
    # Spare bytes per slot, so an oversized datagram shows as a wrong size, not as a match.
    batch = MsgBatch(batch_count, (max(sizes) + 64) & ~63)
    fd = sock.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(0, select.POLLIN)
    pending = b""
    quiet_ms: int | None = None  # set while a snapshot is draining
    batches = 0
    while True:
        try:
            n = recvmmsg(fd, batch, _MSG_DONTWAIT)
        except BlockingIOError:
            n = 0
        if n:
            checker.check(batch.data, batch.received(n))
            batches += 1
            if batches % _CHECK_STDIN_EVERY:
                continue
        events = dict(poller.poll(0 if n else (quiet_ms if quiet_ms is not None else 200)))
        if quiet_ms is not None and not n and not events:
            _emit(checker.as_dict())  # quiet for quiet_ms: the snapshot is complete
            quiet_ms = None
        if 0 not in events:
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            _emit(checker.as_dict())
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            cmd, *rest = line.decode().split()
            if cmd == "quit":
                _emit(checker.as_dict())
                return
            if cmd == "snap":
                quiet_ms = int(rest[0]) if rest else 100


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zcnet.tx.sink")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--sizes", required=True, help="allowed payload sizes, comma-separated")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the sink stops
    with _open(args.bind, args.port) as sock:
        _emit({"port": sock.getsockname()[1]})
        serve(sock, tuple(int(v) for v in args.sizes.split(",")))
    return 0


class Sink:
    """Start the sink process; ``snapshot()`` reads its counters.

    ``spawn(argv, **popen_kwargs)`` starts it somewhere else (a lab passes
    ``functools.partial(lab.ns_exec, lab.ns_b)``); by default it runs here.

    Use as a context manager: the process is stopped on success, error and Ctrl-C.
    """

    def __init__(self, bind: str, sizes: tuple[int, ...], *,
                 spawn: Callable[..., subprocess.Popen[str]] = subprocess.Popen,
                 port: int = 0) -> None:
        cmd = [sys.executable, "-m", "zcnet.tx.sink", "--bind", bind,
               "--sizes", ",".join(str(s) for s in sizes), "--port", str(port)]
        # One BLAS thread: numpy's pool would only spin on the CPUs the sender needs.
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.bind = bind
        self._closed = False
        self._proc = spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, bufsize=1, env=env)
        with ExitStack() as undo:
            undo.callback(self.close)  # on any failure, Ctrl-C included: no orphaned sink
            try:
                self.port = int(self._read()["port"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ZcnetError(f"txbench sink started but did not report its port: {exc!r}",
                                 "something else writes to the sink's stdout") from exc
            undo.pop_all()

    def _read(self) -> dict[str, int]:
        """The next line the sink wrote: its port, or counters (all whole numbers)."""
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            err = self._proc.stderr.read() if self._proc.stderr else ""
            raise ZcnetError(f"txbench sink failed to start: {err.strip()[-300:] or 'no output'}",
                             "check the bind address exists in the sink's namespace")
        doc: dict[str, int] = json.loads(line)
        return doc

    def snapshot(self, quiet_ms: int = 100) -> dict[str, int]:
        """Counters after the sink saw no packet for ``quiet_ms`` (cumulative since start)."""
        if self._closed:
            raise ClosedError.of(self, "snapshot")
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"snap {quiet_ms}\n")
        self._proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self._closed = True
        proc = self._proc
        if proc.poll() is None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    raise SystemExit(main())
