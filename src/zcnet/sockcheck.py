"""Checks every socket handed to a zcnet API passes before anything is built on it.

Some facts about what happens without them: a closed socket object has fileno -1, which reaches
the kernel only at the first I/O (EBADF, or from io_uring a failed CQE long after the call that
made the mistake); a UDP socket given to a TCP sender sends datagrams of the wrong sizes without a
complaint; a listening socket given to a receiver waits forever for data that never comes. So
the kind of socket, whether it is open and whether it is connected are asked of the kernel once,
at open, and a mistake is named there with its fix.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from zcnet.errors import UsageError

_KINDS = {socket.SOCK_DGRAM: "datagram", socket.SOCK_RAW: "raw",
          socket.SOCK_SEQPACKET: "seqpacket", socket.SOCK_STREAM: "stream"}
_FAMILIES = {socket.AF_INET: "IPv4", socket.AF_INET6: "IPv6", socket.AF_UNIX: "Unix"}
_PROTOCOLS = {socket.IPPROTO_TCP: "TCP", socket.IPPROTO_UDP: "UDP"}
_TYPE_NAMES = {socket.SOCK_STREAM: "SOCK_STREAM", socket.SOCK_DGRAM: "SOCK_DGRAM"}


def _describe(family: int, kind: int, proto: int) -> str:
    fam = _FAMILIES.get(family, f"family {family}")
    name = _PROTOCOLS.get(proto) if family in (socket.AF_INET, socket.AF_INET6) else None
    return f"an {fam} {name}" if name else f"a {fam} {_KINDS.get(kind, f'type {kind}')}"


@contextmanager
def _opened(sock: socket.socket | int, what: str) -> Iterator[tuple[int, socket.socket]]:
    """(fd, a socket object for it); an int fd is wrapped without taking it over."""
    fd = sock if isinstance(sock, int) else sock.fileno()
    if fd < 0:
        raise UsageError(f"{what}: fd {fd} is not open" if isinstance(sock, int)
                         else f"{what}: the socket is closed",
                         "pass an open socket (this one was closed or detached)")
    if isinstance(sock, socket.socket):
        yield fd, sock
        return
    try:
        s = socket.socket(fileno=fd)
    except OSError as exc:
        if exc.errno == errno.EBADF:
            raise UsageError(f"{what}: fd {fd} is not open", "pass an open socket") from None
        if exc.errno == errno.ENOTSOCK:
            raise UsageError(f"{what}: fd {fd} is not a socket", "pass a socket") from None
        raise
    try:
        yield fd, s
    finally:
        s.detach()  # the fd stays the caller's


_TCP = (socket.SOCK_STREAM, socket.IPPROTO_TCP)
_UDP = (socket.SOCK_DGRAM, socket.IPPROTO_UDP)


def _require(sock: socket.socket | int, what: str, allowed: tuple[tuple[int, int], ...]) -> int:
    names = " or ".join(_PROTOCOLS[proto] for _, proto in allowed)
    types = " or ".join(_TYPE_NAMES[kind] for kind, _ in allowed)
    sol = socket.SOL_SOCKET
    with _opened(sock, what) as (fd, s):
        family = s.getsockopt(sol, socket.SO_DOMAIN)
        got = (s.getsockopt(sol, socket.SO_TYPE), s.getsockopt(sol, socket.SO_PROTOCOL))
        if family not in (socket.AF_INET, socket.AF_INET6) or got not in allowed:
            raise UsageError(f"{what}: fd {fd} is {_describe(family, *got)} socket, not {names}",
                             f"pass a {names} socket (AF_INET or AF_INET6, {types})")
        if s.getsockopt(sol, socket.SO_ACCEPTCONN):
            raise UsageError(f"{what}: fd {fd} is a listening socket",
                             "pass the connected socket that accept() returns")
        try:
            s.getpeername()
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise
            kind = _PROTOCOLS[got[1]]
            raise UsageError(f"{what}: {kind} socket fd {fd} is not connected",
                             "connect() it first" + (" (or pass the socket accept() returns)"
                                                     if got == _TCP else "")) from None
    return fd


def require_tcp(sock: socket.socket | int, what: str) -> int:
    """The fd of ``sock`` if it is an open, connected (not listening) TCP socket; otherwise a
    UsageError that starts with ``what`` and names the problem and the fix."""
    return _require(sock, what, (_TCP,))


def require_udp(sock: socket.socket | int, what: str) -> int:
    """The fd of ``sock`` if it is an open, connected UDP socket (see ``require_tcp``)."""
    return _require(sock, what, (_UDP,))


def require_connected(sock: socket.socket | int, what: str) -> int:
    """The fd of ``sock`` if it is an open, connected TCP or UDP socket."""
    return _require(sock, what, (_TCP, _UDP))
