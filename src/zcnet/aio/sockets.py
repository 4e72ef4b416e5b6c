"""Sockets for zcnet.aio: checking one at open, and taking one over from asyncio.

Some facts about taking a connection from an asyncio transport:

- A transport (asyncio's or uvloop's) owns its socket's fd: it watches it in the loop and
  closes it when the transport closes. ``get_extra_info("socket")`` gives a wrapper, not the
  socket, and anything read through the transport is gone from the kernel's queue.
- So adopting a connection means: stop the transport reading, ``dup`` the fd into a socket of
  our own, close the transport (closing its fd; the connection lives on in the dup, and
  close() without SO_LINGER sends neither FIN nor RST while another fd refers to it).
- A transport starts reading one loop iteration after ``connection_made``. Adopting inside
  ``connection_made`` therefore loses nothing; a ``start_server`` handler runs later, and the
  bytes its StreamReader buffered by then are handed back to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from zcnet.aio.backend import TrioLoop, current_loop
from zcnet.errors import UsageError
from zcnet.sockcheck import require_tcp


def check_tcp_socket(sock: object, what: str) -> socket.socket:
    """``sock`` if it is a connected TCP socket, else a UsageError naming what it is.

    The kind, open/connected and listening checks are :func:`zcnet.sockcheck.require_tcp`'s;
    what is added here is the event loop's case: a transport's socket wrapper, which asyncio
    reads itself, is refused with the way to take the connection over.
    """
    if isinstance(sock, asyncio.trsock.TransportSocket) or (
            not isinstance(sock, socket.socket) and hasattr(sock, "fileno")
            and hasattr(sock, "getpeername")):
        raise _owned_by_transport(what, "this socket")
    if not isinstance(sock, socket.socket):
        raise UsageError(f"{what} needs a socket.socket, got {type(sock).__name__}",
                         "pass the connected TCP socket (accept() or connect() gives one)")
    fd = require_tcp(sock, what)
    _refuse_transport_fd(fd, what)
    return sock


def _owned_by_transport(what: str, which: str) -> UsageError:
    return UsageError(f"{what}: {which} belongs to an asyncio transport, which reads it",
                      "take the connection over first: zcnet.aio.adopt_transport(transport) in "
                      "connection_made, or await zcnet.aio.adopt_stream(reader, writer)")


def _refuse_transport_fd(fd: int, what: str) -> None:
    """The socket object itself, handed to a transport (``create_connection(sock=...)``,
    ``connect_accepted_socket``) and still held: refused when a transport of the running loop
    owns ``fd``, as asyncio and uvloop refuse a reader on it (each byte would go to
    whichever reads first). asyncio's check has no side effect; uvloop runs the same check in
    ``remove_writer``, which finds no writer to remove on a socket nothing else drives."""
    loop = current_loop()
    if loop is None or isinstance(loop, TrioLoop):  # trio has no transports
        return
    probe = getattr(loop, "_ensure_fd_no_transport", None)
    try:
        if probe is not None:
            probe(fd)
        else:
            loop.remove_writer(fd)
    except RuntimeError:  # "File descriptor N is used by transport <...>"
        raise _owned_by_transport(what, f"fd {fd}") from None


def adopt_transport(transport: asyncio.BaseTransport) -> socket.socket:
    """Take a TCP connection away from an asyncio (or uvloop) transport and return it as a
    non-blocking socket that the caller owns. Call it in ``connection_made``: nothing has been
    read yet then. The transport is closed; its protocol gets ``connection_lost(None)``."""
    tsock = transport.get_extra_info("socket")
    if tsock is None:
        raise UsageError("this transport has no socket (not a TCP connection?)")
    if isinstance(transport, asyncio.ReadTransport):
        transport.pause_reading()
    sock = socket.socket(fileno=os.dup(tsock.fileno()))
    with contextlib.ExitStack() as undo:
        undo.callback(sock.close)
        check_tcp_socket(sock, "adopt_transport")
        sock.setblocking(False)
        undo.pop_all()
    transport.close()
    return sock


async def adopt_stream(reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> tuple[socket.socket, bytes]:
    """Take over the connection of a ``start_server`` handler: returns the socket and the bytes
    the StreamReader had already buffered (they come first in the stream; usually empty)."""
    sock = adopt_transport(writer.transport)
    # StreamReader offers no way to take what it buffered without waiting for more; its
    # buffer is a bytearray attribute on both asyncio versions we support.
    buffered = getattr(reader, "_buffer", bytearray())
    early = bytes(buffered)
    buffered.clear()
    writer.close()
    return sock, early
