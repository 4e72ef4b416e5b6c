"""Every receive engine sets its socket's SO_RCVLOWAT from ``rcvlowat`` (the wake-up threshold)
and still reads the whole stream, the tail below the threshold included; a bad value is a usage
error before anything is read."""

from __future__ import annotations

import socket
import threading

import pytest

from zcnet.errors import UsageError
from zcnet.rx.engine import RCVLOWAT, EngineOptions
from zcnet.rx.registry import make_engine
from zcnet.sockcheck import set_rcvlowat

ENGINES = ("epoll", "uring", "uring-mshot", "soft-zc")


def _run(engine: str, opts: EngineOptions, total: int) -> tuple[int, int]:
    """(bytes the engine read, the socket's SO_RCVLOWAT after the run) for a stream of
    ``total`` bytes whose sender ends with FIN."""
    eng = make_engine(engine, opts)
    if why := eng.unsupported():
        pytest.skip(why)
    ls = socket.create_server(("127.0.0.1", 0))
    tx = socket.create_connection(ls.getsockname())
    rx, _ = ls.accept()
    ls.close()

    def send() -> None:
        tx.sendall(bytes(total))
        tx.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=send)
    t.start()
    try:
        st = eng.run(rx, None)
        return st.bytes, rx.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
    finally:
        t.join(10)
        rx.close()
        tx.close()
        eng.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_sets_the_threshold_and_reads_the_tail_below_it(no_leaks, engine: str) -> None:
    total = 3 * RCVLOWAT + 12345  # ends with less than the threshold queued
    assert _run(engine, EngineOptions(rcvlowat=RCVLOWAT), total) == (total, RCVLOWAT)


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_default_is_its_own(no_leaks, engine: str) -> None:
    """With no ``rcvlowat`` option an engine sets its own default: epoll wakes on any data (the
    kernel's 1 byte, measured faster for it in the lab), the io_uring engines once 1 MiB is
    queued; the option, when given, wins (the test above)."""
    eng = make_engine(engine, EngineOptions())
    assert eng.default_rcvlowat == (0 if engine == "epoll" else RCVLOWAT)
    total = 2 * RCVLOWAT + 999
    assert _run(engine, EngineOptions(), total) == (total, eng.default_rcvlowat or 1)


@pytest.mark.parametrize("engine", ENGINES)
def test_rcvlowat_zero_leaves_the_kernel_default(no_leaks, engine: str) -> None:
    assert _run(engine, EngineOptions(rcvlowat=0), 100) == (100, 1)


@pytest.mark.parametrize("value", [-1, 1 << 31])
def test_bad_rcvlowat_is_a_usage_error(no_leaks, tcp_pair, value: int) -> None:
    _, server = tcp_pair
    with pytest.raises(UsageError, match="rcvlowat") as e:
        make_engine("epoll", EngineOptions(rcvlowat=value)).run(server, None)
    assert f"default is {RCVLOWAT}" in (e.value.hint or "")


def test_rcvlowat_is_a_checked_engine_option() -> None:
    assert EngineOptions.from_mapping({"rcvlowat": 0}).rcvlowat == 0
    with pytest.raises(UsageError, match="rcvlowat"):
        EngineOptions.from_mapping({"rcvlowat": "big"})


def test_rcvlowat_helper_names_a_socket_that_is_not_tcp(no_leaks) -> None:
    """zcnet.sockcheck.set_rcvlowat (the one helper the engines and zcnet.aio share) refuses a
    UDP socket, naming what it is, and leaves its SO_RCVLOWAT alone; 0 touches nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        with pytest.raises(UsageError, match=r"caller.*UDP socket, not TCP") as e:
            set_rcvlowat(udp, RCVLOWAT, "caller")
        assert "pass a TCP socket" in (e.value.hint or "")
        assert udp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        set_rcvlowat(udp, 0, "caller")


def test_rcvlowat_helper_names_a_closed_socket(no_leaks) -> None:
    s = socket.socket()
    s.close()
    with pytest.raises(UsageError, match="caller: the socket is closed"):
        set_rcvlowat(s, RCVLOWAT, "caller")
