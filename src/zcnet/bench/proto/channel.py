"""A blocking channel: one protocol :class:`Connection` over one connected socket.

Both ends use it: the client for its requests, a server session for its conversation. It sends a
message whole, and waits for the next one for at most a given time, reading in slices so that
the caller's ``stop`` (a server shutting down) is seen promptly. A socket error reads as the
peer closing the connection: the protocol then reports the end of stream where it stood.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable

from zcnet.bench.proto.connection import Connection
from zcnet.bench.proto.errors import LocalProtocolError
from zcnet.bench.proto.framing import NeedData
from zcnet.bench.proto.schema import Message

READ_SIZE = 1 << 16


class Channel:
    def __init__(self, sock: socket.socket, conn: Connection) -> None:
        self.sock = sock
        self.conn = conn

    def send(self, msg: Message) -> None:
        self.sock.sendall(self.conn.send(msg))

    def send_error(self, code: str, message: str, timeout: float = 1.0) -> None:
        """Tell the peer why the conversation ends, if it still listens; never raises."""
        with contextlib.suppress(OSError, LocalProtocolError):
            self.sock.settimeout(timeout)
            self.sock.sendall(self.conn.send_error(code, message))

    def read(self, timeout: float) -> None:
        """Feed what arrives within ``timeout`` (possibly nothing) to the protocol."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(READ_SIZE)
        except TimeoutError:
            return
        except OSError:
            data = b""
        self.conn.receive_data(data)

    def receive(self, timeout: float, *, slice_s: float | None = None,
                stop: Callable[[], bool] | None = None) -> Message | None:
        """The next message (an ``error`` one included), or None when none came within
        ``timeout`` or ``stop()`` became true. Raises the protocol's errors as they are."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.conn.next_event()
            if not isinstance(ev, NeedData):
                return ev
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop()):
                return None
            self.read(left if slice_s is None else min(left, slice_s))

    def close(self) -> None:
        self.sock.close()
