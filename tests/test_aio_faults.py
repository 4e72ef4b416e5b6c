"""zcnet.aio bad input: wrong sockets, wrong loop or thread, no loop at all."""

from __future__ import annotations

import asyncio
import socket

import pytest

from aio_util import LOOPS, misuse_from_thread, refused_in_thread, run, tcp_pair
from zcnet import aio
from zcnet.errors import UsageError, ZcnetError

pytestmark = pytest.mark.parametrize("loop_kind", list(LOOPS))


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def _listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


def _unconnected() -> socket.socket:
    return socket.socket()


def _unix() -> socket.socket:
    return socket.socketpair()[0]


def _closed() -> socket.socket:
    s = socket.socket()
    s.close()
    return s


@pytest.mark.parametrize(("make", "words"), [
    (_udp, "UDP"), (_listener, "listening"), (_unconnected, "not connected"),
    (_unix, "TCP"), (_closed, "closed"),
])
@pytest.mark.parametrize("opener", ["open_receiver", "open_sender"])
def test_wrong_socket_kind_is_refused_at_open(loop_kind, make, words, opener, no_leaks):
    async def main() -> str:
        s = make()
        try:
            with pytest.raises(UsageError) as ei:
                getattr(aio, opener)(s)
            return str(ei.value)
        finally:
            s.close()

    msg = run(loop_kind, main)
    assert words in msg and "fix:" in msg


def test_transport_socket_is_refused_with_the_adopt_hint(loop_kind, no_leaks):
    async def main() -> str:
        accepted: list[asyncio.StreamWriter] = []
        server = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            with pytest.raises(UsageError) as ei:
                aio.open_receiver(writer.get_extra_info("socket"))
            return str(ei.value)
        finally:
            writer.close()
            for w in accepted:
                w.close()
            server.close()
            await server.wait_closed()
            await asyncio.sleep(0.01)

    assert "adopt" in run(loop_kind, main)


def test_open_without_a_running_loop_is_a_clear_error(loop_kind, tcp_pair, no_leaks):
    _, s = tcp_pair
    with pytest.raises(ZcnetError, match="running asyncio event loop"):
        aio.open_receiver(s)


def test_receiver_used_from_another_thread(loop_kind, no_leaks):
    """Another thread (with its own loop) may not receive; it may release."""

    async def main() -> tuple[str, str]:
        c, s = await tcp_pair()
        await asyncio.get_running_loop().sock_sendall(c, b"x" * 1000)
        async with aio.open_receiver(s, own_socket=True, area_size=256 << 10,
                                     buf_size=16 << 10) as rx:
            chunks = await rx.recv()
            t, errors = misuse_from_thread(rx, chunks, lambda main: asyncio.run(main()))
            await asyncio.get_running_loop().run_in_executor(None, t.join)
            rx.flush()
            assert rx.stats.in_flight == 0
        c.close()
        return errors[0], errors[1]

    use_err, close_err = run(loop_kind, main)
    assert "another thread" in use_err and "fix:" in use_err
    assert "another thread" in close_err


def test_sender_used_from_another_loop(loop_kind, no_leaks):
    async def main() -> str:
        c, s = await tcp_pair()
        tx = aio.open_sender(c, "copy", own_socket=True)
        err = await refused_in_thread(lambda: tx.sendall(b"x"))
        await tx.aclose()  # closes the client: the server reads EOF, and nothing before it
        assert await asyncio.get_running_loop().sock_recv(s, 10) == b""
        s.close()
        return err

    assert "belongs to the loop that opened it" in run(loop_kind, main)


def test_use_after_close(loop_kind, no_leaks):
    async def main() -> None:
        c, s = await tcp_pair()
        rx = aio.open_receiver(s, own_socket=True, area_size=256 << 10, buf_size=16 << 10)
        await rx.aclose()
        with pytest.raises(ValueError, match="closed"):
            await rx.recv()
        await rx.aclose()  # idempotent
        c.close()

    run(loop_kind, main)


def test_receiver_used_from_another_loop_in_the_same_thread(loop_kind, no_leaks):
    """Ownership is checked cheaply on the hot path (its thread, its loop running); a second
    loop run in the same thread while the owner's is stopped is still refused, and the
    receiver still works and closes on its own loop afterwards."""
    a, b = LOOPS[loop_kind](), LOOPS[loop_kind]()
    try:
        async def open_() -> tuple[socket.socket, aio.AsyncReceiver]:
            c, s = await tcp_pair()
            return c, aio.open_receiver(s, own_socket=True)

        c, rx = a.run_until_complete(open_())

        async def use() -> str:
            with pytest.raises(ZcnetError) as e:
                await rx.recv()
            return str(e.value)

        assert "another event loop" in b.run_until_complete(use())

        async def finish() -> bytes:
            await asyncio.get_running_loop().sock_sendall(c, b"ok")
            chunks = await asyncio.wait_for(rx.recv(), 10)
            data = b"".join(bytes(ch.data) for ch in chunks)
            rx.rx.release_many(chunks)
            rx.close()
            await asyncio.sleep(0)  # the guard task's cancellation runs
            return data

        assert a.run_until_complete(finish()) == b"ok"
        c.close()
    finally:
        a.close()
        b.close()
