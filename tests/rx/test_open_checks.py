"""Validation at open: every API that takes a socket asks the kernel up front whether it is
open, of the right protocol, not listening and connected, and names the problem and the fix;
before, a UDP, listening, unconnected or closed socket was accepted and failed later or never."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from zcnet.errors import UsageError, ZcnetError
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import engine_names, make_engine
from zcnet.rx.zc.api import open_receiver
from zcnet.rx.zc.area import Area
from zcnet.tx.senders import KINDS, make_sender
from zcnet.tx.udp_modes import MODES
from zcnet.tx.uring_send import UringSender


def _udp(stack: ExitStack, connected: bool = True) -> socket.socket:
    sink = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sink.bind(("127.0.0.1", 0))
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    if connected:
        sock.connect(sink.getsockname())
    return sock


def _tcp_connected(stack: ExitStack) -> socket.socket:
    ls = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
    sock = stack.enter_context(socket.create_connection(ls.getsockname()))
    stack.enter_context(ls.accept()[0])
    return sock


def _closed(stack: ExitStack) -> socket.socket:
    sock = socket.socket()
    sock.close()
    return sock


def _unix(stack: ExitStack) -> socket.socket:
    a, b = socket.socketpair()
    stack.enter_context(b)
    return stack.enter_context(a)


# name -> (make the bad socket, what the error must say)
NOT_TCP: dict[str, tuple[Callable[[ExitStack], Any], str]] = {
    "udp": (_udp, "is an IPv4 UDP socket, not TCP"),
    "unix": (_unix, "is a Unix stream socket, not TCP"),
    "listening": (lambda st: st.enter_context(socket.create_server(("127.0.0.1", 0))),
                  "is a listening socket"),
    "unconnected": (lambda st: st.enter_context(socket.socket()), "is not connected"),
    "closed": (_closed, "the socket is closed"),
}
NOT_UDP: dict[str, tuple[Callable[[ExitStack], Any], str]] = {
    "tcp": (_tcp_connected, "is an IPv4 TCP socket, not UDP"),
    "unconnected": (lambda st: _udp(st, connected=False), "UDP socket fd"),
    "closed": (_closed, "the socket is closed"),
}

TCP_APIS: dict[str, Callable[[Any], Any]] = {
    "open_receiver": lambda s: open_receiver(s, "soft", area_size=1 << 20, buf_size=64 << 10),
    **{f"make_sender-{k}": (lambda s, k=k: make_sender(k, s, bytearray(1 << 14), slots=2))
       for k in KINDS},
    **{f"engine-{e}": (lambda s, e=e: make_engine(e, EngineOptions()).run(s, None))
       for e in engine_names()},
}
UDP_APIS: dict[str, Callable[[Any], Any]] = {
    **{f"burst-{m}": (lambda s, m=m: MODES[m](s, [100] * 4)) for m in MODES},
    "burst-uring": lambda s: UringSender(s, [100] * 4),
}


def _cases(apis: dict[str, Any], bad: dict[str, Any]) -> Iterator[Any]:
    for api in apis:
        for b in bad:
            yield pytest.param(api, b, id=f"{api}-{b}")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("api", "bad"), list(_cases(TCP_APIS, NOT_TCP)))
def test_tcp_apis_refuse_at_open(api: str, bad: str, no_leaks: None) -> None:
    make, text = NOT_TCP[bad]
    with ExitStack() as stack, pytest.raises(UsageError) as ei:
        obj = TCP_APIS[api](make(stack))
        stack.callback(getattr(obj, "close", lambda: None))
    assert text in ei.value.message and ei.value.hint


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("api", "bad"), list(_cases(UDP_APIS, NOT_UDP)))
def test_udp_senders_refuse_at_open(api: str, bad: str, no_leaks: None) -> None:
    make, text = NOT_UDP[bad]
    with ExitStack() as stack, pytest.raises(UsageError) as ei:
        obj = UDP_APIS[api](make(stack))
        stack.callback(obj.close)
    assert text in ei.value.message and ei.value.hint


def test_receiver_fd_that_is_not_open_or_not_a_socket(no_leaks: None) -> None:
    r, w = os.pipe()
    os.close(w)
    try:
        with pytest.raises(UsageError, match=f"fd {r} is not a socket"):
            open_receiver(r, "soft")
    finally:
        os.close(r)
    with pytest.raises(UsageError, match=f"fd {r} is not open"):
        open_receiver(r, "soft")  # closed now


def test_connected_tcp_socket_passes_and_fd_is_kept(tcp_pair: Any, no_leaks: None) -> None:
    client, server = tcp_pair
    with open_receiver(server.fileno(), "soft", area_size=1 << 20, buf_size=64 << 10) as rx:
        client.sendall(b"abc")
        got = rx.recv(timeout=5)
        assert b"".join(bytes(c) for c in got) == b"abc"
        rx.release_many(got)
    os.fstat(server.fileno())  # the check wrapped the int fd without taking it over


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timeout", [float("nan"), -1.0])
@pytest.mark.parametrize("method", ["recv", "recv_batch"])
def test_receive_timeout_that_is_no_duration_is_refused(tcp_pair: Any, no_leaks: None,
                                                        method: str, timeout: float) -> None:
    # NaN never reached its deadline: the call waited forever
    with open_receiver(tcp_pair[1], "soft", area_size=1 << 20, buf_size=64 << 10) as rx, \
            pytest.raises(UsageError, match="timeout must be seconds >= 0 or None"):
        getattr(rx, method)(timeout=timeout)


def test_receive_timeout_inf_waits_like_none(tcp_pair: Any, no_leaks: None) -> None:
    client, server = tcp_pair
    with open_receiver(server, "soft", area_size=1 << 20, buf_size=64 << 10) as rx:
        client.sendall(b"x")
        got = rx.recv(timeout=float("inf"))  # was OverflowError from the ring's timespec
        assert b"".join(map(bytes, got)) == b"x"
        rx.release_many(got)


def test_a_server_handle_started_twice_is_refused(no_leaks: None) -> None:
    from zcnet.bench.remote import LocalServer

    with LocalServer("127.0.0.1") as srv:
        first = srv.proc
        with pytest.raises(UsageError, match="already started"):
            srv.start()
        assert srv.proc is first and first is not None and first.poll() is None


def _closed_fd() -> int:
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    return r


def _pipe_fd(stack: ExitStack) -> int:
    r, w = os.pipe()
    stack.callback(os.close, r)
    stack.callback(os.close, w)
    return r


# name -> (open with the bad input, given an ExitStack and a connected TCP socket; the error)
BAD_INPUT: dict[str, tuple[Callable[[ExitStack, socket.socket], Any], type[Exception], str]] = {
    "area-closed-dmabuf-fd": (lambda st, s: Area(4096, dmabuf_fd=_closed_fd()), UsageError,
                              "cannot be used: Bad file descriptor"),
    "area-pipe-as-dmabuf": (lambda st, s: Area(4096, dmabuf_fd=_pipe_fd(st)), UsageError,
                            "cannot be used: Illegal seek"),
    "area-larger-than-memory": (lambda st, s: Area(1 << 50), ZcnetError, "cannot map an area"),
    "receiver-larger-than-memory": (lambda st, s: open_receiver(s, "soft", area_size=1 << 50),
                                    ZcnetError, "cannot map an area"),
    "sender-buffer-not-a-buffer": (lambda st, s: make_sender("copy", s, 42), UsageError,
                                   "must be a writable buffer"),
    "sender-fractional-slots": (lambda st, s: make_sender("msgzc", s, bytearray(100), slots=2.5),
                                UsageError, "slots must be a positive integer"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_at_open_is_named(case: str, tcp_pair: Any, no_leaks: None) -> None:
    make, exc, text = BAD_INPUT[case]
    with ExitStack() as stack, pytest.raises(exc, match=text):
        obj = make(stack, tcp_pair[1])
        stack.callback(obj.close)
