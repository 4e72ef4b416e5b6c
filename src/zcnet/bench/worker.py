"""The server's handle on one flow worker process (``zcnet.bench.flow_worker``) and its pipe.

Workers come from a ``forkserver``: see ``zcnet.bench.server`` for why.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
from multiprocessing.process import BaseProcess
from typing import TypeVar

from zcnet.bench.flow_worker import Failed, FlowSpec, Unsupported, WorkerEvent, flow_main
from zcnet.bench.remote import timeout_scale

WORKER_TIMEOUT = 20.0     # a worker's ready / accepted report
CTX = mp.get_context("forkserver")


class SessionError(Exception):
    """A request could not be served; ``code`` goes into the error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# A worker's error code -> the session's (a usage mistake in the request, or a failure).
_WORKER_CODES = {"invalid": "invalid", "worker": "worker"}
E = TypeVar("E", bound=WorkerEvent)


class FlowProc:
    """One worker process and its pipe; ``stop`` always leaves neither behind."""

    def __init__(self, flow: int, spec: FlowSpec) -> None:
        self.flow = flow
        self.role = spec.role
        self.conn, child = CTX.Pipe()
        self.proc: BaseProcess = CTX.Process(target=flow_main, args=(spec, child),
                                              name=f"zcnet-{spec.role}{flow}")
        self.proc.start()
        child.close()
        self.cpu: int | None = None
        self.pinned: int | None = None  # from ``pin``: the worker may be gone when results come
        #: What the session holds for this worker (a devmem membership), released at stop.
        self.held = contextlib.ExitStack()

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def expect(self, event: type[E], timeout: float | None = None) -> E:
        if timeout is None:
            timeout = WORKER_TIMEOUT * timeout_scale()  # slow machines (a TCG guest) scale it
        if not self.conn.poll(timeout):
            raise SessionError("worker", f"flow {self.flow} {self.role} worker: no "
                               f"{event.__name__.lower()} within {timeout:.0f} s")
        msg = self.recv()
        if isinstance(msg, event):
            return msg
        if isinstance(msg, Unsupported):
            raise SessionError("unsupported", msg.reason)
        if isinstance(msg, Failed):
            raise SessionError(_WORKER_CODES.get(msg.code, "worker"), msg.reason)
        raise SessionError("worker", f"unexpected {type(msg).__name__}")

    def recv(self) -> WorkerEvent:
        """The worker's next message; a dead worker reads as a failure."""
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(1)
            return Failed(f"{self.role} worker died ({self._how()})")
        return msg if isinstance(msg, WorkerEvent) else Failed("bad message")

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
        with self.held:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
            self.conn.close()
            self.proc.close()
