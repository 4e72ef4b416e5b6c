"""The stream sender loops every zcnet flow uses: the verification pattern for a duration.

``copy`` sends views of the tiled pattern (no user-space copy at all); the zcnet.tx paths
(MSG_ZEROCOPY, SEND_ZC, devmem ...) send from slots of one buffer (for devmem a udmabuf, written
through its memfd mapping), and with ``verify`` each slot is filled with the pattern at its
stream offset just before it is sent (a copy, which is why only verifying runs pay it). Either
way the receiver can check every byte it gets.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import TYPE_CHECKING

import numpy as np

from zcnet.pattern import PERIOD, TILED, pattern_view
from zcnet.tx.devmem import DmabufMemory, open_tx_dmabuf
from zcnet.tx.senders import make_sender
from zcnet.tx.sendzc import send_buffer
from zcnet.tx.slots import SendStats

if TYPE_CHECKING:
    from zcnet.tx.slots import SendBuffer


def _send_copy(sock: socket.socket, duration: float, chunk: int) -> tuple[int, SendStats]:
    chunk = min(chunk, PERIOD)
    mv = memoryview(TILED)
    sent = 0
    calls = 0
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        for _ in range(8):  # amortize the clock read
            start = sent % PERIOD
            sent += sock.send(mv[start:start + chunk])
        calls += 8
    return sent, SendStats(kind="copy", path="copy", sends=calls, bytes=sent)


def _send_via(sock: socket.socket, tx: str, duration: float, chunk: int,
              verify: bool) -> tuple[int, SendStats]:
    slots, chunk = 8, min(chunk, 256 << 10)
    pos = 0

    def fill(slot: int, view: memoryview) -> None:
        nonlocal pos
        np.frombuffer(view, dtype=np.uint8)[:chunk] = pattern_view(pos, chunk)
        pos += chunk

    with contextlib.ExitStack() as stack:
        if tx == "devmem":  # the device reads the payload from a dma-buf bound to it
            dmabuf = stack.enter_context(open_tx_dmabuf(sock, slots * chunk))
            mem: SendBuffer | DmabufMemory = dmabuf
            buf = np.frombuffer(dmabuf.view, dtype=np.uint8)
            writing = dmabuf.cpu_write()
        else:
            mem = buf = np.frombuffer(send_buffer(slots * chunk), dtype=np.uint8)  # never a THP
            writing = contextlib.nullcontext()
        with writing:
            for i in range(slots):
                buf[i * chunk:(i + 1) * chunk] = pattern_view(i * chunk, chunk)
        sender = make_sender(tx, sock, mem, slots=slots, on_fill=fill if verify else None)
        sent = 0
        try:
            deadline = time.monotonic() + duration
            while time.monotonic() < deadline:
                for _ in range(8):
                    sent += sender.send(chunk)
            sender.flush()
        finally:
            sender.close()
    return sent, sender.stats()


def send_stream(sock: socket.socket, *, tx: str, duration: float, chunk: int,
                verify: bool) -> tuple[int, SendStats]:
    """Send the pattern for ``duration`` seconds by ``tx``; (bytes sent, send-path stats)."""
    if tx == "copy":
        return _send_copy(sock, duration, chunk)
    return _send_via(sock, tx, duration, chunk, verify)
