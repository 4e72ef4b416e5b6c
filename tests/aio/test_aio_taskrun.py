"""The loop's rings hear of arriving data inside the system call that brought it, whichever
task-run mode the kernel probe chose (zcnet.aio.taskrun): on a kernel whose DEFER_TASKRUN
eventfd signal comes an RCU grace period late, an idle connection otherwise waited ~16 ms."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from zcnet import aio
from zcnet.aio import sender, shared, taskrun
from zcnet.errors import UsageError
from zcnet.uapi import io_uring as u
from zcnet.uring.eventfd import drain, register_eventfd
from zcnet.uring.ring import Ring


@contextlib.asynccontextmanager
async def _closing(sock: socket.socket) -> AsyncIterator[None]:
    try:
        yield
    finally:
        sock.close()


def _peer_and_receiver(kw: dict[str, bool]) -> tuple[socket.socket, aio.AsyncReceiver]:
    """A loopback connection: its peer, and a soft zcnet.aio receiver (``kw``) on its other
    end (in a running loop)."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        peer = socket.create_connection(srv.getsockname()[:2])
        conn = srv.accept()[0]
    conn.setblocking(False)
    return peer, aio.open_receiver(conn, "soft", own_socket=True, area_size=1 << 20,
                                   buf_size=16 << 10, **kw)


@pytest.fixture
def fresh_choice() -> Iterator[None]:
    taskrun.taskrun_flag.cache_clear()
    yield
    taskrun.taskrun_flag.cache_clear()


def _signalled_by_send(flags: int, rounds: int = 20) -> int:
    """How many of ``rounds`` one-byte sends left a ring with ``flags`` (eventfd registered,
    a receive armed) signalled by the time send() returned."""
    with socket.create_server(("127.0.0.1", 0)) as srv, \
            socket.create_connection(srv.getsockname()[:2]) as tx, \
            srv.accept()[0] as rx, Ring(8, flags=flags) as ring:
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            register_eventfd(ring, efd)
            buf = ctypes.create_string_buffer(64)
            hits = 0
            for _ in range(rounds):
                ring.prep(u.IORING_OP_RECV, rx.fileno(), ctypes.addressof(buf), len(buf))
                ring.submit()
                drain(efd)
                tx.send(b"x")
                hits += drain(efd) > 0
                ring.get_events()
                ring.reap()
            return hits
        finally:
            os.close(efd)


@pytest.mark.parametrize("flags", [shared.RING_FLAGS, sender.RING_FLAGS], ids=["shared", "sender"])
def test_the_loops_rings_are_signalled_inside_the_send(flags: int, no_leaks: None) -> None:
    assert _signalled_by_send(flags | taskrun.taskrun_flag()) == 20, taskrun.taskrun_name()


def test_the_probe_picks_defer_only_where_its_signal_is_prompt(no_leaks: None) -> None:
    late = _signalled_by_send(u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN) < 20
    assert taskrun.deferred_signal_is_prompt() is not late
    assert taskrun.taskrun_name() == ("coop" if late else "defer")


def test_an_idle_connection_is_answered_through_the_shared_ring(no_leaks: None) -> None:
    """An echo over the shared ring after the loop went idle: the reply comes (the wake-up is
    the ring's eventfd, not a later event), every byte checked."""
    async def main() -> None:
        peer, rx = _peer_and_receiver({})
        peer.setblocking(False)
        loop = asyncio.get_running_loop()
        async with rx, _closing(peer):
            for i in range(5):
                await asyncio.sleep(0.01)  # the loop sleeps in epoll
                msg = f"ping {i}".encode()
                await loop.sock_sendall(peer, msg)
                got = b""
                while len(got) < len(msg):
                    for c in await asyncio.wait_for(rx.recv(), 5):
                        got += bytes(c.data)
                        c.release()
                assert got == msg
    asyncio.run(main())


@pytest.mark.parametrize("value,flag", [("defer", u.IORING_SETUP_DEFER_TASKRUN),
                                        ("coop", u.IORING_SETUP_COOP_TASKRUN)])
def test_the_environment_decides_when_set(value: str, flag: int, fresh_choice: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(taskrun.ENV, value)
    assert taskrun.taskrun_flag() == flag
    assert taskrun.taskrun_name() == value


def test_a_bad_mode_names_the_variable_and_the_choices(fresh_choice: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(taskrun.ENV, "lazy")
    with pytest.raises(UsageError, match=r"ZCNET_AIO_TASKRUN='lazy' is not a task-run mode"
                       r".*defer, coop"):
        taskrun.taskrun_flag()


@pytest.mark.parametrize("kw", [{"shared_ring": False}, {"incremental": True}],
                         ids=["shared_ring=False", "incremental"])
def test_a_receiver_with_a_ring_of_its_own_is_signalled_inside_the_send(
        kw: dict[str, bool], no_leaks: None) -> None:
    """Such a receiver's ring (the soft provider's) is opened in the loop's task-run mode: its
    Wakeup's eventfd is raised by the time a same-thread send returns. The synchronous API
    keeps DEFER_TASKRUN (it waits inside its own enter)."""
    async def main() -> None:
        peer, rx = _peer_and_receiver(kw)
        async with rx, _closing(peer):
            wake = rx._wake  # the receiver's own eventfd is what is checked
            assert wake is not None and wake.efd >= 0
            hits = 0
            for i in range(10):
                got = b""
                t = asyncio.ensure_future(rx.recv())  # arms the receive, then sleeps
                await asyncio.sleep(0.005)
                peer.send(b"%d" % i)
                # Peek, not drain: the loop's reader must still see the signal.
                hits += bool(select.select([wake.efd], [], [], 0)[0])
                for c in await asyncio.wait_for(t, 5):
                    got += bytes(c.data)
                    c.release()
                assert got == b"%d" % i
            assert hits == 10, taskrun.taskrun_name()
    asyncio.run(main())
    assert provider_flags_now() & u.IORING_SETUP_DEFER_TASKRUN  # the context var was reset


def provider_flags_now() -> int:
    from zcnet.rx.zc.provider import soft_ring_flags
    return soft_ring_flags()
