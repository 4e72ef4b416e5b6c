"""Every public receive operation and its misuse, as a table run on both paths: the table behind
tests/project/test_rx_ops_both_paths.py. ``python rx_ops_cases.py`` runs every case on the path
ZCNET_PURE selects and prints one line, ``OUTCOMES <json>``: case -> ["ok", result] or [exception
type, message]. The test runs it once per path, each in an interpreter of its own, and holds the
two to each other: the same result, or the same exception type and message.

Each case opens its own receiver over a real TCP connection on loopback (the soft provider,
which runs on this kernel), so what is compared is what a user sees.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable

from zcnet import aio
from zcnet.rx.zc import Receiver, open_receiver

SMALL = {"area_size": 256 << 10, "buf_size": 4096}
DATA = bytes(range(256)) * 160  # 40 KiB: several 4 KiB buffers
Result = object

CASES: dict[str, Callable[[], Result]] = {}


def case(fn: Callable[[], Result]) -> Callable[[], Result]:
    CASES[fn.__name__.replace("_", "-")] = fn
    return fn


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        c = socket.create_connection(ls.getsockname())
        s, _ = ls.accept()
    return c, s


def opened(**kw: object) -> tuple[socket.socket, socket.socket, Receiver]:
    c, s = tcp_pair()
    return c, s, open_receiver(s, "soft", **{**SMALL, **kw})  # type: ignore[arg-type]


def first_round(rx: Receiver, c: socket.socket, n: int = len(DATA)) -> list:
    c.sendall(DATA[:n])
    got = rx.recv(5)
    assert got, "no data within 5 s"
    return got


def whole_stream(rx: Receiver, c: socket.socket) -> bytes:
    c.sendall(DATA)
    c.close()
    out = bytearray()
    for ch in rx:
        out += ch.data
        ch.release()
    return bytes(out)


# --- the blocking Receiver: operations -------------------------------------------------------
@case
def iterate_to_eof() -> Result:
    c, s, rx = opened()
    with s, rx:
        got = whole_stream(rx, c)
        return [got == DATA, rx.eof, rx.stats.delivered_bytes, rx.stats.in_flight]


@case
def recv_and_release_many() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        got = first_round(rx, c, 4096)
        offsets = [ch.stream_offset for ch in got]
        data = b"".join(ch.data for ch in got)
        rx.release_many(got)
        rx.flush()
        return [offsets, data == DATA[:4096], rx.stats.in_flight]


@case
def recv_batch_views() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        c.sendall(DATA[:10000])
        b = rx.recv_batch(5)
        assert b is not None
        data = b"".join(bytes(v) for v in b.views())
        n, off = b.length, b.stream_offset
        b.release()
        return [n, off, data == DATA[:n]]


@case
def recv_timeout_zero_without_data() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        return [rx.recv(0), rx.recv_batch(0)]


@case
def stats_dict_keys() -> Result:
    c, s, rx = opened()
    with s, rx:
        whole_stream(rx, c)
        return sorted(rx.stats_dict())


# --- the blocking Receiver: misuse ---------------------------------------------------------
@case
def release_twice() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        ch = first_round(rx, c)[0]
        ch.release()
        ch.release()
    return None


@case
def release_many_twice_in_one_call() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        ch = first_round(rx, c)[0]
        rx.release_many([ch, ch])
    return None


@case
def release_to_another_receiver() -> Result:
    c1, s1, rx1 = opened()
    c2, s2, rx2 = opened()
    with c1, s1, rx1, c2, s2, rx2:
        ch = first_round(rx1, c1)[0]
        rx2.release(ch)
    return None


@case
def data_of_a_released_chunk() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        ch = first_round(rx, c)[0]
        ch.release()
        return bytes(ch.data)


@case
def negative_timeout() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        return rx.recv(-1)


@case
def nan_timeout() -> Result:
    c, s, rx = opened()
    with c, s, rx:
        return rx.recv_batch(float("nan"))


@case
def max_held_out_of_range() -> Result:
    c, s = tcp_pair()
    with c, s:
        open_receiver(s, "soft", max_held=1.5, **SMALL)  # type: ignore[arg-type]
    return None


@case
def recv_after_close() -> Result:
    c, s, rx = opened()
    with c, s:
        rx.close()
        return rx.recv(0)


@case
def flush_after_close() -> Result:
    c, s, rx = opened()
    with c, s:
        rx.close()
        rx.flush()
    return None


@case
def release_after_close() -> Result:
    c, s, rx = opened()
    with c, s:
        ch = first_round(rx, c)[0]
        rx.close()
        ch.release()
        return [rx.stats.in_flight >= 0, rx.area.closed]


@case
def recv_from_another_thread() -> Result:
    c, s, rx = opened()
    out: list[BaseException] = []

    def other() -> None:
        try:
            rx.recv(0)
        except Exception as e:
            out.append(e)

    with c, s, rx:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    raise out[0]


# --- zcnet.aio ---------------------------------------------------------------------------
async def _aio_pair() -> tuple[socket.socket, socket.socket, aio.AsyncReceiver]:
    c, s = tcp_pair()
    return c, s, aio.open_receiver(s, provider="soft", **SMALL)  # type: ignore[arg-type]


def _aio(fn: Callable[[socket.socket, aio.AsyncReceiver], object]) -> Result:
    async def main() -> Result:
        c, s, rx = await _aio_pair()
        try:
            return await fn(c, rx)  # type: ignore[misc]
        finally:
            rx.close()
            c.close()
            s.close()
    return asyncio.run(main())


@case
def aio_async_for_to_eof() -> Result:
    async def run(c: socket.socket, rx: aio.AsyncReceiver) -> Result:
        c.sendall(DATA)
        c.shutdown(socket.SHUT_WR)
        out = bytearray()
        async for ch in rx:
            out += ch.data
            ch.release()
        return [bytes(out) == DATA, rx.stats.in_flight]
    return _aio(run)


@case
def aio_release_twice() -> Result:
    async def run(c: socket.socket, rx: aio.AsyncReceiver) -> Result:
        c.sendall(DATA[:4096])
        got = await rx.recv()
        got[0].release()
        got[0].release()
    return _aio(run)


@case
def aio_recv_after_close() -> Result:
    async def run(c: socket.socket, rx: aio.AsyncReceiver) -> Result:
        rx.close()
        return await rx.recv()
    return _aio(run)


def outcome(fn: Callable[[], Result]) -> list[object]:
    try:
        return ["ok", fn()]
    except Exception as e:
        return [type(e).__name__, str(e)]


if __name__ == "__main__":
    print("OUTCOMES " + json.dumps({name: outcome(fn) for name, fn in CASES.items()},
                                   default=repr))
