"""The coordinator: starts a receiver and a sender worker per cell, drives them, never hangs.

Workers are fresh interpreters (``python -m zcnet.bench.worker``: no inherited threads, locks or
multiprocessing helper processes; each pins itself and enters its namespace) speaking JSON lines,
the same dict messages ``zcnet server`` carries between hosts. Every wait has a deadline; a worker
that dies or overstays turns the cell into ``error`` with the reason, the other worker is killed,
and the run goes on. Whatever happens, both processes are gone when ``run_cell`` returns."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from dataclasses import replace
from typing import IO, Any

from zcnet.bench.worker import WorkerSpec

START_TIMEOUT = 20.0   # interpreter start + import + bind/connect (slow on a loaded 2-CPU box)
GRACE = 10.0           # beyond the duration, for draining and reporting


class CellError(Exception):
    """A cell failed; the message is the reason recorded in the results."""


class _Worker:
    """A worker process speaking JSON lines: commands on its stdin, events on its stdout."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.role = spec.role
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zcnet.bench.worker", spec.role, json.dumps(spec.to_dict())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=True,  # Ctrl-C reaches the coordinator only; it stops workers
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[str] = self.proc.stdin
        self._out: IO[str] = self.proc.stdout

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self._in.write(json.dumps(msg) + "\n")
            self._in.flush()
        except BrokenPipeError:
            raise CellError(f"{self.role} worker exited with code {self.proc.poll()}") from None

    def expect(self, timeout: float, *events: str) -> dict[str, Any]:
        ready, _, _ = select.select([self._out], [], [], timeout)
        line = self._out.readline() if ready else None
        if not line:
            try:
                code = self.proc.wait(0.5)
            except subprocess.TimeoutExpired:
                raise CellError(f"{self.role} worker did not answer within {timeout:.0f} s") \
                    from None
            raise CellError(f"{self.role} worker died (exit code {code})")
        msg: dict[str, Any] = json.loads(line)
        ev = msg.get("event")
        if ev == "error":
            raise CellError(msg.get("reason", f"{self.role} worker failed"))
        if ev not in events:
            raise CellError(f"{self.role} worker sent {ev!r}, expected {'/'.join(events)}")
        return msg

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._in.close()
        self._out.close()


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
        s.send({"cmd": "start"})
        result = r.expect(tx.duration + GRACE, "result")
        sent = s.expect(GRACE, "result")
        result["bytes_sent"] = sent["bytes_sent"]
        result["tx_stats"] = sent.get("tx_stats", {})
        if sent["bytes_sent"] != result["bytes"]:
            raise CellError(f"receiver got {result['bytes']} bytes of {sent['bytes_sent']} sent")
        return result
    finally:
        for w in reversed(workers):
            w.stop()

