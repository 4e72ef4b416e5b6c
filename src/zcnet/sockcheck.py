"""Checks every socket handed to a zcnet API passes before anything is built on it.

Some facts about what happens without them: a closed socket object has fileno -1, which reaches
the kernel only at the first I/O (EBADF, or from io_uring a failed CQE long after the call that
made the mistake); a UDP socket given to a TCP sender sends datagrams of the wrong sizes without a
complaint; a listening socket given to a receiver waits forever for data that never comes. So
the kind of socket, whether it is open and whether it is connected are asked of the kernel once,
at open, and a mistake is named there with its fix. A connection the peer already reset is not
a mistake of the caller's: it is not connected any more and carries the reset as its pending
error (SO_ERROR), which is raised as the OSError the first I/O would have raised.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from zcnet.errors import UsageError, require_int
from zcnet.uapi.tcp import SOL_TCP, TCP_INFO, tcp_info

_KINDS = {socket.SOCK_DGRAM: "datagram", socket.SOCK_RAW: "raw",
          socket.SOCK_SEQPACKET: "seqpacket", socket.SOCK_STREAM: "stream"}
_FAMILIES = {socket.AF_INET: "IPv4", socket.AF_INET6: "IPv6", socket.AF_UNIX: "Unix"}
_PROTOCOLS = {socket.IPPROTO_TCP: "TCP", socket.IPPROTO_UDP: "UDP"}
_TYPE_NAMES = {socket.SOCK_STREAM: "SOCK_STREAM", socket.SOCK_DGRAM: "SOCK_DGRAM"}
_INT_MAX = (1 << 31) - 1  # SO_RCVLOWAT is a C int

# The SO_RCVLOWAT zcnet gives a bulk stream (the io_uring receive engines' default, not epoll's:
# see zcnet.rx.copying; zcnet.aio's ``rcvlowat`` option for ingest). TCP wakes a waiting reader
# (poll, epoll, io_uring's internal poll) only once this much is queued, instead of on every
# segment. With the softirq on the sender's CPU (veth, lo) each wake-up costs that CPU, the
# bottleneck, a cross-CPU wake, and the reader copies a few segments per wake-up. Measured in the
# lab (split placement, a C sender writing 1 MiB): at MTU 9000 on a quiet machine 256 KiB took
# uring-mshot and soft-zc from ~26 to ~39 Gbit/s and halved their sys CPU per GiB (a C
# blocking-read receiver: ~24 -> ~41); 1 MiB, against 256 KiB in the same runs, halved the
# wake-ups again and gained 5-30 % at MTU 1500 and 9000 (loaded machine), and on loopback took
# every engine from ~43 to ~64 Gbit/s. The kernel grows the receive buffer to fit
# (tcp_set_rcvlowat); the end of a stream (FIN) wakes the reader whatever is queued.
RCVLOWAT = 1 << 20


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


def _kind(s: socket.socket, fd: int, what: str,
          allowed: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The (type, protocol) of ``s`` if it is an IPv4/IPv6 socket of one of the ``allowed``
    kinds; otherwise a UsageError naming what it is."""
    sol = socket.SOL_SOCKET
    family = s.getsockopt(sol, socket.SO_DOMAIN)
    got = (s.getsockopt(sol, socket.SO_TYPE), s.getsockopt(sol, socket.SO_PROTOCOL))
    if family not in (socket.AF_INET, socket.AF_INET6) or got not in allowed:
        names = " or ".join(_PROTOCOLS[proto] for _, proto in allowed)
        types = " or ".join(_TYPE_NAMES[kind] for kind, _ in allowed)
        raise UsageError(f"{what}: fd {fd} is {_describe(family, *got)} socket, not {names}",
                         f"pass a {names} socket (AF_INET or AF_INET6, {types})")
    return got


def _was_connected(s: socket.socket) -> bool:
    """Whether the TCP socket ``s`` ever exchanged a segment (a connection that is gone, not
    one never made)."""
    raw = s.getsockopt(SOL_TCP, TCP_INFO, ctypes.sizeof(tcp_info))
    info = tcp_info.from_buffer_copy(raw.ljust(ctypes.sizeof(tcp_info), b"\0"))
    return bool(info.tcpi_segs_in or info.tcpi_segs_out)


def _require(sock: socket.socket | int, what: str, allowed: tuple[tuple[int, int], ...]) -> int:
    sol = socket.SOL_SOCKET
    with _opened(sock, what) as (fd, s):
        got = _kind(s, fd, what, allowed)
        if s.getsockopt(sol, socket.SO_ACCEPTCONN):
            raise UsageError(f"{what}: fd {fd} is a listening socket",
                             "pass the connected socket that accept() returns")
        try:
            s.getpeername()
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise
            # Not connected any more, with an error pending: the peer reset it (or its
            # connect failed). That is the connection's failure, not the caller's mistake:
            # the kernel's errno, as the first receive or send would have raised it.
            err = s.getsockopt(sol, socket.SO_ERROR)
            if err:
                raise OSError(err, f"{what}: socket fd {fd}: {os.strerror(err)}") from None
            if got == _TCP and _was_connected(s):  # that error was reported already
                raise OSError(errno.ENOTCONN, f"{what}: TCP socket fd {fd}: its connection is "
                              "gone (reset by the peer, or timed out)") from None
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


def set_rcvlowat(sock: socket.socket | int, rcvlowat: int, what: str) -> None:
    """Give the TCP socket ``sock`` SO_RCVLOWAT ``rcvlowat`` bytes; 0 leaves the kernel's
    default (wake on any data) and touches nothing. A value that is not an int in 0..2**31-1, or
    a socket that is not TCP, is a UsageError that starts with ``what`` (the caller's name).

    For bulk streams: TCP then wakes the reader (poll, epoll, io_uring's internal poll) once
    that much is queued instead of on every segment, so each wake-up reads about ``rcvlowat``
    bytes and the kernel's per-wake-up work is paid far less often (see :data:`RCVLOWAT`). The
    kernel still wakes the reader with less queued at the end of the stream (FIN), on an error
    (RST), under memory pressure and when the receive window closes, so a stream is always read
    to its end. It is NOT for request/response protocols: a small request below the threshold
    would wait until one of those happens.
    """
    fix = (f"0 wakes the reader on any data; bulk streams want more (the io_uring receive "
           f"engines' default is {RCVLOWAT}, 1 MiB)")
    require_int(f"{what}: rcvlowat (bytes)", rcvlowat, fix)
    if not 0 <= rcvlowat <= _INT_MAX:
        raise UsageError(f"{what}: rcvlowat={rcvlowat}: expected 0..{_INT_MAX} bytes", fix)
    if not rcvlowat:
        return
    with _opened(sock, what) as (fd, s):
        _kind(s, fd, f"{what} (rcvlowat, SO_RCVLOWAT)", (_TCP,))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, rcvlowat)
