"""zcnet.aio bad input: wrong sockets, wrong loop or thread, no loop at all."""

from __future__ import annotations

import asyncio
import errno
import socket
import struct

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


OPENERS = {
    "open_receiver": lambda s: aio.open_receiver(s, area_size=256 << 10, buf_size=4096),
    "open_receiver own ring": lambda s: aio.open_receiver(s, shared_ring=False,
                                                          area_size=256 << 10, buf_size=4096),
    "open_sender": lambda s: aio.open_sender(s, "copy"),
    "start_protocol": lambda s: aio.start_protocol(s, aio.ZcProtocol(), area_size=256 << 10,
                                                   buf_size=4096),
}


@pytest.mark.parametrize("handed", ["create_connection", "connect_accepted_socket"])
@pytest.mark.parametrize("opener", list(OPENERS))
def test_the_socket_object_a_transport_reads_is_refused(loop_kind, handed, opener, no_leaks):
    """The socket itself (not the transport's wrapper), still held after it was handed to a
    transport: refused with the adopt hint, and the transport keeps reading it (before, zcnet
    opened on it and each byte went to whichever read first)."""
    async def main() -> tuple[str, bytes]:
        loop = asyncio.get_running_loop()
        c, s = await tcp_pair()
        got: list[bytes] = []

        class Keep(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                got.append(data)

        hand = getattr(loop, handed)
        tr, _ = await (hand(Keep, sock=s) if handed == "create_connection" else hand(Keep, s))
        try:
            with pytest.raises(UsageError) as ei:
                OPENERS[opener](s)
            c.send(b"still the transport's")
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.01)
            return str(ei.value), b"".join(got)
        finally:
            tr.close()
            c.close()
            await asyncio.sleep(0.01)

    msg, got = run(loop_kind, main)
    assert "belongs to an asyncio transport" in msg and "adopt_transport" in msg, msg
    assert got == b"still the transport's"


@pytest.mark.parametrize("opener", list(OPENERS))
def test_a_socket_the_peer_reset_raises_its_reset(loop_kind, opener, no_leaks):
    """A connection the peer reset before the open: ConnectionResetError (errno ECONNRESET,
    what the first receive would raise), not a UsageError about an unconnected socket; an
    open after that on the same socket says the connection is gone (ENOTCONN)."""
    async def main() -> tuple[OSError, OSError]:
        c, s = await tcp_pair()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()  # RST
        try:
            for _ in range(100):  # until the reset has arrived
                if s.getsockopt(socket.SOL_TCP, socket.TCP_INFO, 1)[0] == 7:  # TCP_CLOSE
                    break
                await asyncio.sleep(0.01)
            errs = []
            for _ in range(2):
                with pytest.raises(OSError) as ei:
                    OPENERS[opener](s)
                errs.append(ei.value)
            return errs[0], errs[1]
        finally:
            s.close()

    first, again = run(loop_kind, main)
    assert not isinstance(first, ZcnetError) and first.errno == errno.ECONNRESET, first
    assert opener.split()[0] in str(first)
    assert not isinstance(again, ZcnetError) and again.errno == errno.ENOTCONN, again
    assert "connection is gone" in str(again)


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
