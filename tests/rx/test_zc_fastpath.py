"""The soft provider's fast paths keep every check that protects the user.

Rounds of CQEs take one of three paths (plain Python for a few CQEs, the vectorized round of
one buffer per CQE, the vectorized bundle path); each test runs on each path, forced through
the ``FEW`` threshold and the bundle setting, with a spy proving which path ran. On each the
same misuse raises the same error: double release, a foreign chunk or batch, use after close,
and the receiver or the area closed under a held batch. Each also runs on both ring hot
paths (the compiled accelerator and pure Python, see uring_backends.py).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import pytest

from uring_backends import ring_backend  # noqa: F401  (autouse: every test on both paths)
from zcnet.errors import ClosedError
from zcnet.rx.zc import soft, soft_group
from zcnet.rx.zc.api import Receiver
from zcnet.uring.bufring import BufRing

PATHS = {
    # name: (FEW threshold, bundle, method that must have run)
    "few": (1 << 30, False, (soft_group.SoftGroup, "take_few")),
    "vector": (0, False, (BufRing, "take")),
    "vector-bundle": (0, True, (soft_group.SoftGroup, "_take")),
}
PAYLOAD = bytes(range(256)) * 1024  # 256 KiB: 64 buffers of 4 KiB


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch) -> Iterator[dict[str, int]]:
    from zcnet.uring.syscall import backend

    few, bundle, (cls, name) = PATHS[request.param]
    if (cls, name) == (BufRing, "take") and backend() == "c":
        name = "take_round"  # the vectorized round in one C call (None: not taken)
    monkeypatch.setattr(soft_group, "FEW", few)
    monkeypatch.setattr(soft_group, "FEW_PURE", few)
    calls = {"n": 0, "bundle": bundle}
    orig = getattr(cls, name)

    def spy(*a, **k):
        got = orig(*a, **k)
        if name != "take_round" or got is not None:
            calls["n"] += 1
        return got

    monkeypatch.setattr(cls, name, spy)
    yield calls
    assert calls["n"], f"the {request.param} path never ran"


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
    return conn, cli


def _receiver(path: dict[str, int], data: bytes = PAYLOAD,
              ) -> tuple[Receiver, socket.socket, socket.socket]:
    """A receiver with ``data`` waiting; the sender stays open (no EOF CQE in the round) and
    the ring has room for all of it, so rounds end with F_MORE as in a running stream."""
    conn, cli = _pair()
    cli.sendall(data)
    prov = soft.open_soft(conn.fileno(), 2 << 20, 4096, bundle=bool(path["bundle"]))
    return Receiver(conn, prov), conn, cli


def _batch(rx: Receiver):
    b = rx.recv_batch(timeout=5)
    assert b is not None and b.parts
    return b


def _bytes(b) -> bytes:
    return b"".join(bytes(v) for v in b.views())


def test_double_release_and_foreign_chunks_and_batches(no_leaks, path) -> None:
    rx, conn, cli = _receiver(path)
    rx2, conn2, cli2 = _receiver(path, b"x" * 10_000)
    with conn, conn2, cli, cli2, rx, rx2:
        b = _batch(rx)
        assert _bytes(b) == PAYLOAD[:b.length]
        cli.sendall(PAYLOAD)
        theirs = _batch(rx2)
        with pytest.raises(ValueError, match="another receiver"):
            rx.release(theirs)
        with pytest.raises(ValueError, match="another receiver"):
            rx.release_many([b, theirs])
        assert rx.stats.in_flight == b.parts  # the failed release_many released nothing
        b.release()
        with pytest.raises(ValueError, match="released twice"):
            b.release()
        with pytest.raises(ValueError, match="released twice"):
            rx.release(b)
        with pytest.raises(ValueError, match="released twice"):
            rx.release_many([b])
        with pytest.raises(ValueError, match="used after release"):
            b.views()
        chunks = rx.recv(timeout=5)
        assert chunks
        with pytest.raises(ValueError, match="twice in one"):
            rx.release_many([chunks[0], chunks[0]])
        with pytest.raises(ValueError, match="another receiver"):
            rx2.release(chunks[0])
        chunks[0].release()
        with pytest.raises(ValueError, match="released twice"):
            chunks[0].release()
        rx.release_many(chunks[1:])
        rx2.release(theirs)
        for r in (rx, rx2):
            r.flush()
            assert r.stats.in_flight == 0
            st = r.stats_dict()
            assert st["in_ring"] == st["buffers"]  # no buffer went back twice


def test_use_after_close(no_leaks, path) -> None:
    rx, conn, cli = _receiver(path)
    with conn, cli:
        with rx:
            _batch(rx).release()
        prov = rx.provider
        for call in (rx.recv_batch, rx.recv, lambda: next(iter(rx)), rx.flush):
            with pytest.raises(ValueError, match="closed"):
                call()
        with pytest.raises(ClosedError):
            prov.reap(0)


def test_receiver_closed_under_a_held_batch(no_leaks, path) -> None:
    rx, conn, cli = _receiver(path)
    with conn, cli:
        b = _batch(rx)
        rx.close()  # the ring and the buffer ring go; the area stays while b is held
        assert not rx.area.closed
        assert _bytes(b) == PAYLOAD[:b.length]
        b.release()
        assert rx.area.closed and rx.stats.in_flight == 0
        with pytest.raises(ValueError, match="used after release"):
            b.views()


def test_area_closed_under_a_held_batch(no_leaks, path) -> None:
    rx, conn, cli = _receiver(path)
    with conn, cli, rx:
        b = _batch(rx)
        rx.area.close()
        with pytest.raises(ValueError, match="released memoryview"):
            b.views()
        b.release()


def test_chunks_are_made_by_the_accelerator_on_its_backend(no_leaks, monkeypatch) -> None:
    """The per-buffer Chunk constructor is the compiled one on the "c" backend (the hot path
    the benchmarks measure), and the same bytes and stream offsets come out on both."""
    from zcnet.rx.zc.accel import rx_accel_for
    from zcnet.uring.syscall import backend

    accel = rx_accel_for("c")
    made: list[int] = []
    if accel is not None:
        real = accel.make_chunks

        def spy(*args):  # type: ignore[no-untyped-def]
            made.append(len(args[1]))
            return real(*args)

        monkeypatch.setattr(accel, "make_chunks", spy)
    conn, cli = _pair()
    data = PAYLOAD[:40_000]
    got = bytearray()

    def take(chunks) -> None:  # type: ignore[no-untyped-def]
        for c in chunks:
            assert c.stream_offset == len(got)
            got.extend(c.data)
            c.release()

    with conn, cli, Receiver(conn, soft.open_soft(conn.fileno(), 2 << 20, 4096)) as rx:
        for end in (20_000, 40_000):  # two rounds at least: the stream offset carries over
            cli.sendall(data[len(got):end])
            while len(got) < end:
                take(rx.recv(timeout=5))
        cli.close()
        take(rx)
        assert got == data and rx.stats.delivered_bytes == len(data)
        if backend() == "c":  # the autouse ring_backend fixture's choice
            assert sum(made) == rx.stats.delivered  # every chunk, none made in Python
        else:
            assert made == []


def test_iterator_and_chunk_release_keep_their_checks(no_leaks) -> None:
    """The iterator's loop and ``chunk.release()`` run in C on the "c" backend (ChunkIter,
    CompiledChunk); on both backends a loop left early gives back the round's rest, a second
    release is refused, a mixed drain (chunks with a batch) gives every buffer back once, and
    chunks held across close stay valid until their release unmaps the area."""
    conn, cli = _pair()
    cli.sendall(PAYLOAD)
    with conn, cli:
        rx = Receiver(conn, soft.open_soft(conn.fileno(), 2 << 20, 4096))
        try:
            _check_iterator_and_release(rx, cli)
        finally:
            rx.close()


def _check_iterator_and_release(rx: Receiver, cli: socket.socket) -> None:
    from zcnet.rx.zc.chunks import Chunk
    from zcnet.uring.syscall import backend

    it = iter(rx)
    compiled = type(it).__name__ == "ChunkIter"
    assert compiled == (backend() == "c")
    first = [next(it) for _ in range(3)]
    assert (type(first[0]).release is not Chunk.release) == compiled
    assert b"".join(bytes(c.data) for c in first) == PAYLOAD[:3 * 4096]
    assert rx.stats.in_flight > 3  # the round had more than the loop took
    first[0].release()
    with pytest.raises(ValueError, match="released twice"):
        first[0].release()
    del it  # left early: the rest of the round goes back
    rx.flush()
    assert rx.stats.in_flight == 2
    cli.sendall(PAYLOAD)
    b = _batch(rx)
    first[1].release()
    b.release()  # one drain holds a chunk and a batch
    rx.flush()
    assert rx.stats.in_flight == 1
    st = rx.stats_dict()
    assert st["in_ring"] == st["buffers"] - 1
    rx.close()
    assert bytes(first[2].data) == PAYLOAD[2 * 4096:3 * 4096]
    first[2].release()  # after close: accounted, and the area goes with the last chunk
    assert rx.area.closed and rx.stats.in_flight == 0
    with pytest.raises(ValueError, match="released twice"):
        first[2].release()


def test_refill_ring_paths_on_both_backends() -> None:
    """zcrx's refill ring pushes in one C call on the "c" backend when everything fits, and
    through numpy (holding back what does not fit) otherwise: the refill ring tests of
    test_zc_zcrx, run here on both backends."""
    from test_zc_zcrx import (
        test_refill_ring_fills_holds_and_counts_full_events_at_any_layout as holds,
    )
    from test_zc_zcrx import test_refill_ring_push_wraps_holds_and_keeps_order as order
    from test_zc_zcrx import test_refill_ring_wraps_its_u32_indices as wraps

    holds()
    wraps()
    for kind in (list, np.array):
        order(kind)


def _raw_cqe32(entries: list[tuple[int, int, int, int]]):
    """CQE32s as the kernel writes them, in a Completions over their bytes (as a reap makes)."""
    import struct

    from zcnet.uring.completions import Completions

    raw = bytearray(32 * len(entries))
    for i, (ud, res, flags, off) in enumerate(entries):
        struct.pack_into("<QiIQQ", raw, 32 * i, ud, res, flags, off, 0)
    return Completions.from_raw(raw, len(entries), True)


def test_zcrx_round_parses_as_the_numpy_path() -> None:
    """zcrx's common round in one C call on the "c" backend gives the numpy path's arrays, and
    any other round (another request's CQE, the final one) is the numpy path's on both."""
    from test_zc_zcrx import TOKEN

    from zcnet.rx.zc.accel import rx_accel_for
    from zcnet.rx.zc.zcrx import parse_completions
    from zcnet.uapi import io_uring as u
    from zcnet.uring.syscall import backend

    fast = rx_accel_for(backend())
    more = u.IORING_CQE_F_MORE
    rounds = {
        "common": [(1, 4096, more, TOKEN | 0), (1, 1000, more, TOKEN | 8192 + 96)],
        "other request": [(1, 4096, more, TOKEN | 0), (7, 10, more, TOKEN | 4096),
                          (1, 1448, more, TOKEN | 12288)],
        "final": [(1, 4096, more, TOKEN | 0), (1, 0, 0, 0)],
    }
    for name, cqes in rounds.items():
        got, want = parse_completions(_raw_cqe32(cqes), fast=fast), parse_completions(
            _raw_cqe32(cqes))
        for field in ("offsets", "lengths", "tokens"):
            assert list(map(int, getattr(got, field))) == list(map(int, getattr(want, field))), name
        assert (got.end, got.stopped) == (want.end, want.stopped), name
        if name == "common":
            assert (type(got.offsets) is np.ndarray and type(want.offsets) is np.ndarray)
            assert list(map(int, got.tokens)) == [TOKEN, TOKEN | 8288]
