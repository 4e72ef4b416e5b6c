"""The coordinator: starts a receiver and a sender worker per cell, drives them, never hangs.

Workers are ``spawn``ed processes (no inherited threads or locks; each pins itself and enters
its namespace). Every wait has a deadline; a worker that dies or overstays turns the cell into
``error`` with the reason, the other worker is killed, and the run goes on. Whatever happens, both
processes are gone when ``run_cell`` returns.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from zcnet.bench.worker import WorkerSpec, worker_main

_ctx = mp.get_context("spawn")
START_TIMEOUT = 20.0   # spawn + import + bind/connect (slow on a loaded 2-CPU machine)
GRACE = 10.0           # beyond the duration, for draining and reporting


class CellError(Exception):
    """A cell failed; the message is the reason recorded in the results."""


class _Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.role = spec.role
        self.conn, child = _ctx.Pipe()
        self.proc: BaseProcess = _ctx.Process(target=worker_main, args=(spec.to_dict(), child),
                                              name=f"zcnet-{spec.role}", daemon=True)
        self.proc.start()
        child.close()

    def expect(self, timeout: float, *events: str) -> dict[str, Any]:
        msg = _recv(self.conn, timeout, self)
        ev = msg.get("event")
        if ev == "error":
            raise CellError(msg.get("reason", f"{self.role} worker failed"))
        if ev not in events:
            raise CellError(f"{self.role} worker sent {ev!r}, expected {'/'.join(events)}")
        return msg

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()
        self.proc.close()


def _recv(conn: Connection, timeout: float, w: _Worker) -> dict[str, Any]:
    if not conn.poll(timeout):
        if not w.proc.is_alive():
            raise CellError(f"{w.role} worker exited with code {w.proc.exitcode}")
        raise CellError(f"{w.role} worker did not answer within {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        w.proc.join(1)
        raise CellError(f"{w.role} worker died (exit code {w.proc.exitcode})") from None


def run_cell(rx: WorkerSpec, tx: WorkerSpec) -> dict[str, Any]:
    """Run one flow; returns the receiver's result merged with the sender's byte count.

    Raises CellError (reason in the message) or returns ``{"event": "unsupported", "reason"}``.
    """
    workers: list[_Worker] = []
    try:
        r = _Worker(rx)
        workers.append(r)
        ready = r.expect(START_TIMEOUT, "ready", "unsupported")
        if ready["event"] == "unsupported":
            return ready
        s = _Worker(replace(tx, port=ready["port"]))
        workers.append(s)
        s.expect(START_TIMEOUT, "ready")
        s.conn.send({"cmd": "start"})
        result = r.expect(tx.duration + GRACE, "result")
        sent = s.expect(GRACE, "result")
        result["bytes_sent"] = sent["bytes_sent"]
        if sent["bytes_sent"] != result["bytes"]:
            raise CellError(f"receiver got {result['bytes']} bytes of {sent['bytes_sent']} sent")
        return result
    finally:
        for w in reversed(workers):
            w.stop()
