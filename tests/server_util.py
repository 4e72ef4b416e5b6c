"""Helpers for the tests that run ``zcnet server`` processes: start one, read raw frames from it,
find its flow workers."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zcnet.bench import proto

READY = "zcnet server listening on "


@dataclass
class ServerProc:
    proc: subprocess.Popen[str]
    address: str
    log: Path

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    def log_text(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def server(tmp_path: Path, host: str, *extra: str) -> Iterator[ServerProc]:
    """A ``zcnet -v server`` subprocess on HOST:free-port, stopped with SIGTERM and reaped."""
    log = tmp_path / f"server-{host}-{len(list(tmp_path.iterdir()))}.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "zcnet", "-v", "server", "--listen",
                                 f"{host}:0", *extra], stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(READY), f"server did not start: {line!r} {log.read_text()}"
        yield ServerProc(proc, line[len(READY):].strip(), log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def flow_workers(root: int) -> list[int]:
    """Flow worker processes below ``root`` (workers name themselves zcnet-rxN / zcnet-txN)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            todo.extend(kids)
            for k in kids:
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{k}/comm").read_text().startswith(("zcnet-rx", "zcnet-tx")):
                        out.append(k)
    return out


def wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def raw_session(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_frame(sock: socket.socket) -> dict:
    dec = proto.Decoder()
    while True:
        data = sock.recv(65536)
        if not data:
            raise EOFError
        dec.feed(data)
        msg = dec.next()
        if msg is not proto.NEED_DATA:
            return msg
