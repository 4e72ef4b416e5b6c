"""Zero-copy receive API end to end with the soft provider, on real loopback TCP sockets."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

from zc_helpers import (
    PAT,
    Sender,
    check,
    check_to_eof,
    hold_until_stalled,
    open_asking_for_hugetlb,
    release_in_thread,
)
from zcnet.errors import UsageError, ZcnetError
from zcnet.rx.zc import Chunk, open_receiver, provider, soft

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

@pytest.fixture
def tcp_pair(no_leaks) -> Iterator[tuple[socket.socket, socket.socket]]:
    """(receiving side, sending side) of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
    try:
        yield conn, cli
    finally:
        conn.close()
        if cli.fileno() >= 0:
            cli.close()


def test_256mib_verified_same_thread(tcp_pair):
    conn, cli = tcp_pair
    total = 256 << 20
    snd = Sender(cli, total)
    snd.start()
    got = 0
    with open_receiver(conn, "soft", area_size=8 << 20, buf_size=64 << 10) as rx:
        for chunk in rx:
            assert chunk.stream_offset == got
            check(chunk)
            got += len(chunk)
            chunk.release()
        st = rx.stats
        assert st.delivered == st.released and st.in_flight_bytes == 0
        assert st.delivered_bytes == total
    snd.join()
    assert snd.error is None and got == total


def test_cross_thread_release_through_queue(tcp_pair):
    """The consumer thread verifies and releases; the owner only receives and recycles."""
    conn, cli = tcp_pair
    total = 64 << 20
    snd = Sender(cli, total)
    snd.start()
    with open_receiver(conn, "soft", area_size=4 << 20, buf_size=32 << 10) as rx:
        verified, errors = release_in_thread(rx)
        rx.recv(timeout=0)  # EOF again: drains the last releases made by the consumer
        assert not errors, errors
        assert rx.stats.released == rx.stats.delivered
    snd.join()
    assert verified == total


def test_coalesced_chunks_cover_stream(tcp_pair):
    conn, cli = tcp_pair
    total = 32 << 20
    snd = Sender(cli, total)
    snd.start()
    got = 0
    with open_receiver(conn, "soft", area_size=4 << 20, buf_size=16 << 10, coalesce=True) as rx:
        got += check_to_eof(rx)
        assert rx.stats.delivered == rx.stats.released
        merged = rx.stats.coalesced
    snd.join()
    assert got == total
    assert merged > 0, "bulk loopback stream never produced neighbouring buffers"


def test_exhaustion_then_resume(tcp_pair):
    """Holding every buffer stops the multishot (ENOBUFS); releasing re-arms it."""
    conn, cli = tcp_pair
    total = 8 << 20
    snd = Sender(cli, total)
    snd.start()
    with open_receiver(conn, "soft", area_size=256 << 10, buf_size=32 << 10,
                       max_held=1.0) as rx:
        held = hold_until_stalled(rx, "exhausted")
        assert rx.stats.exhausted >= 1
        assert len(held) == 8 and rx.stats.in_flight == 8
        for c in held:
            check(c)
        got = sum(len(c) for c in held)
        rx.release_many(held)
        got += check_to_eof(rx)
        assert rx.stats.rearms >= 1
    snd.join()
    assert got == total


def test_backpressure_pauses_and_resumes(tcp_pair):
    conn, cli = tcp_pair
    total = 16 << 20
    snd = Sender(cli, total)
    snd.start()
    area = 1 << 20
    with open_receiver(conn, "soft", area_size=area, buf_size=16 << 10, max_held=0.25) as rx:
        held = hold_until_stalled(rx, "backpressure")
        assert rx.stats.backpressure == 1
        assert rx.stats.in_flight_bytes > area // 4
        assert rx.stats.exhausted == 0, "back-pressure must engage before the ring runs dry"
        for c in held:
            check(c)
        got = sum(len(c) for c in held)
        # Release from another thread while the owner waits: the owner wakes and resumes.
        threading.Timer(0.05, rx.release_many, args=(held,)).start()
        got += check_to_eof(rx)
        assert rx.stalled is None
    snd.join()
    assert got == total


def test_peer_reset_ends_iteration_held_chunks_stay_valid(tcp_pair):
    conn, cli = tcp_pair
    total = 1 << 20
    snd = Sender(cli, total, reset=True)
    snd.start()
    held: list[Chunk] = []
    rx = open_receiver(conn, "soft", area_size=4 << 20, buf_size=64 << 10)
    area = rx.area
    with pytest.raises(ConnectionResetError):
        for c in rx:
            held.append(c)
            if sum(map(len, held)) >= total:
                snd.go_reset.set()
    snd.join()
    assert sum(map(len, held)) == total
    assert list(rx) == []  # the error is reported once; afterwards the stream is over
    rx.close()
    assert not area.closed, "area freed while the application still holds chunks"
    for c in held:
        check(c)
    rx.release_many(held[:-1])
    assert not area.closed
    held[-1].release()
    assert area.closed


def test_eof_mid_stream_ends_iteration(tcp_pair):
    conn, cli = tcp_pair
    cli.sendall(PAT.expected(0, 1000))
    cli.close()
    with open_receiver(conn, "soft", area_size=1 << 20, buf_size=4096) as rx:
        chunks = list(rx)
        assert sum(map(len, chunks)) == 1000 and rx.eof
        for c in chunks:
            check(c)
        rx.release_many(chunks)


def test_double_release_and_foreign_chunk(tcp_pair):
    conn, cli = tcp_pair
    cli.sendall(PAT.expected(0, 100_000))
    cli.close()
    with socket.create_server(("127.0.0.1", 0)) as srv2:
        cli2 = socket.create_connection(srv2.getsockname())
        conn2, _ = srv2.accept()
    cli2.sendall(b"x" * 10)
    cli2.close()
    with conn2, open_receiver(conn, "soft", area_size=1 << 20, buf_size=4096) as rx, \
            open_receiver(conn2, "soft", area_size=1 << 20, buf_size=4096) as rx2:
        mine = list(rx)
        theirs = rx2.recv()
        assert theirs
        with pytest.raises(ValueError, match="another receiver"):
            rx.release(theirs[0])
        with pytest.raises(ValueError, match="another receiver"):
            rx.release_many([mine[0], theirs[0]])
        # The failed batch released nothing: every chunk is still held and valid.
        assert rx.stats.in_flight == len(mine)
        for c in mine:
            check(c)
        mine[0].release()
        with pytest.raises(ValueError, match="released twice"):
            mine[0].release()
        with pytest.raises(ValueError, match="released twice"):
            rx.release(mine[0])
        with pytest.raises(ValueError, match="twice in one"):
            rx.release_many([mine[1], mine[1]])
        rx.release_many(mine[1:])
        rx2.release_many(theirs)
        rx.recv(timeout=0)
        rx2.recv(timeout=0)
        assert rx.stats.in_flight == 0 and rx2.stats.in_flight == 0
        # The ring did not take a buffer twice: it holds exactly its buffers again.
        assert rx.stats_dict()["in_ring"] == rx.stats_dict()["buffers"]


def test_debug_mode_use_after_release(tcp_pair):
    conn, cli = tcp_pair
    cli.sendall(PAT.expected(0, 50_000))
    cli.close()
    with open_receiver(conn, "soft", area_size=1 << 20, buf_size=8192, debug=True) as rx:
        chunks = list(rx)
        a, b = chunks[0], chunks[1]
        view = a.data
        with a:
            check(a)
        with pytest.raises(ValueError, match="used after release"):
            a.data  # noqa: B018
        with pytest.raises(ValueError, match="released"):
            view[0]
        arr = b.array  # a numpy array cannot be revoked: warned and poisoned instead
        with pytest.warns(ResourceWarning, match="poison"):
            b.release()
        assert (arr == 0xDB).all()
        rx.release_many(chunks[2:])


def test_non_debug_views_stay_cheap_but_chunk_access_checked(tcp_pair):
    conn, cli = tcp_pair
    cli.sendall(PAT.expected(0, 5000))
    cli.close()
    with open_receiver(conn, "soft", area_size=1 << 20, buf_size=8192) as rx:
        chunks = list(rx)
        c = chunks[0]
        assert bytes(c) == PAT.expected(0, len(c)).tobytes()
        assert np.shares_memory(c.array, rx.area.array), "chunk.array must not copy"
        rx.release_many(chunks)
        with pytest.raises(ValueError, match="used after release"):
            c.array  # noqa: B018


def test_recv_only_in_owner_thread(tcp_pair):
    conn, _ = tcp_pair
    with open_receiver(conn, "soft", area_size=1 << 20, buf_size=8192) as rx:
        err: list[BaseException] = []
        t = threading.Thread(target=lambda: err.extend(_catch(rx.recv, 0)))
        t.start()
        t.join()
        assert err and isinstance(err[0], ZcnetError)


def _catch(f, *a) -> list[BaseException]:
    try:
        f(*a)
    except BaseException as e:
        return [e]
    return []


def test_bad_arguments(tcp_pair):
    conn, _ = tcp_pair
    with pytest.raises(UsageError, match="unknown zero-copy provider"):
        open_receiver(conn, "magic")
    with pytest.raises(UsageError, match="fewer than 2 buffers"):
        open_receiver(conn, "soft", area_size=4096, buf_size=4096)
    with pytest.raises(UsageError, match="max_held"):
        open_receiver(conn, "soft", area_size=1 << 20, buf_size=4096, max_held=0)


def test_auto_falls_back_to_soft_and_says_why(tcp_pair):
    conn, cli = tcp_pair
    cli.sendall(b"hello")
    cli.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rx = open_receiver(conn, "auto", area_size=1 << 20, buf_size=4096)
    with rx:
        assert rx.name == "soft"
        assert rx.why.startswith("soft, because zcrx:")
        chunks = list(rx)
        assert b"".join(bytes(c) for c in chunks) == b"hello"
        rx.release_many(chunks)


def test_batches_cover_the_stream_and_release_as_one(tcp_pair):
    conn, cli = tcp_pair
    total = 64 << 20
    snd = Sender(cli, total)
    snd.start()
    got = 0
    merged_views = 0
    with open_receiver(conn, "soft", area_size=4 << 20, buf_size=32 << 10) as rx:
        while (b := rx.recv_batch()) is not None or not rx.eof:
            if b is None:
                continue
            assert b.stream_offset == got
            pos = got
            for a in b.arrays():
                assert PAT.matches(pos, a)
                pos += len(a)
            assert pos - got == b.length == sum(b.lengths)
            merged = b.arrays(coalesce=True)
            merged_views += len(b.offsets) - len(merged)
            assert sum(map(len, merged)) == b.length
            assert PAT.matches(got, np.concatenate(merged))
            got += b.length
            b.release()
            with pytest.raises(ValueError, match="released twice"):
                b.release()
        rx.flush()
        assert rx.stats.released == rx.stats.delivered and rx.stats.in_flight_bytes == 0
    snd.join()
    assert got == total and merged_views > 0


def test_batch_debug_revokes_views(tcp_pair):
    conn, cli = tcp_pair
    cli.sendall(PAT.expected(0, 20_000))
    cli.close()
    with open_receiver(conn, "soft", area_size=1 << 20, buf_size=4096, debug=True) as rx:
        b = rx.recv_batch()
        assert b is not None
        views = b.views()
        b.release()
        with pytest.raises(ValueError):
            views[0][0]
        with pytest.raises(ValueError, match="used after release"):
            b.views()
        while (rest := rx.recv_batch(timeout=0.5)) is not None or not rx.eof:
            if rest is not None:
                rest.release()


def test_interrupt_mid_stream_cancels_and_frees_everything(tcp_pair):
    """An exception (Ctrl-C) while receiving: the armed multishot is cancelled, the ring and
    its mappings go at once, the area when the held chunk is released (no_leaks checks)."""
    conn, cli = tcp_pair
    snd = Sender(cli, 64 << 20)
    snd.start()
    held = None
    with pytest.raises(KeyboardInterrupt), \
            open_receiver(conn, "soft", area_size=1 << 20, buf_size=16 << 10) as rx:
        for c in rx:
            if held is None:
                held = c
                continue
            c.release()
            if c.stream_offset > 1 << 20:
                raise KeyboardInterrupt
    assert held is not None and not rx.area.closed
    check(held)
    held.release()
    assert rx.area.closed
    # The sender may sit in sendall() against a full window: shutting its own socket down wakes
    # it with EPIPE (a receiver-side SHUT_RD alone need not, and joining could then hang).
    with contextlib.suppress(OSError):
        cli.shutdown(socket.SHUT_RDWR)
    snd.join(timeout=30)
    assert not snd.is_alive(), "the sender did not stop after its socket was shut down"


def soft_inc(conn: socket.socket, area: int, buf: int, **kw):
    rx = open_receiver(conn, "soft", area_size=area, buf_size=buf, incremental=True, **kw)
    assert rx.stats_dict().get("incremental") == 1, "this kernel has IOU_PBUF_RING_INC (6.12+)"
    return rx


def test_incremental_buffers_pack_small_messages(tcp_pair):
    """Small writes land back to back in one big buffer; every buffer comes back at the end."""
    conn, cli = tcp_pair
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sizes = [1 + (i * 7919) % 3000 for i in range(2000)]
    total = sum(sizes)

    def send() -> None:
        off = 0
        with cli:
            for n in sizes:
                cli.sendall(PAT.expected(off, n))
                off += n

    t = threading.Thread(target=send)
    t.start()
    got = 0
    offsets = []
    with soft_inc(conn, 8 << 20, 1 << 20) as rx:
        for c in rx:
            check(c)
            offsets.append((c.offset, c.length))
            got += len(c)
            c.release()
        st = rx.stats_dict()
    t.join()
    assert got == total
    # Consecutive chunks follow each other in the area (until a buffer is full).
    follow = sum(a + n == b for (a, n), (b, _) in itertools.pairwise(offsets))
    assert follow >= len(offsets) // 2
    assert st["in_ring"] == st["buffers"] and st["released"] == st["delivered"]


def test_incremental_exhaustion_then_resume(tcp_pair):
    conn, cli = tcp_pair
    total = 8 << 20
    snd = Sender(cli, total)
    snd.start()
    with soft_inc(conn, 1 << 20, 256 << 10, max_held=1.0, coalesce=True) as rx:
        held = hold_until_stalled(rx, "exhausted")
        assert sum(map(len, held)) == 1 << 20  # every byte of the area, nothing more
        got = 0
        for c in held:
            check(c)
            got += len(c)
        rx.release_many(held)
        got += check_to_eof(rx)
        assert rx.stats.coalesced > 0
    snd.join()
    assert got == total


def test_non_blocking_socket_streams_and_keeps_its_flags(tcp_pair):
    """An O_NONBLOCK socket (asyncio's), armed before any data exists: the multishot waits
    for data instead of ending with EAGAIN, and the socket stays non-blocking."""
    conn, cli = tcp_pair
    conn.setblocking(False)
    snd = Sender(cli, 4 << 20)
    threading.Timer(0.2, snd.start).start()
    got = 0
    with open_receiver(conn, "soft", area_size=1 << 20, buf_size=16 << 10) as rx:
        assert rx.recv(timeout=0.05) == [] and not rx.eof
        got += check_to_eof(rx)
    snd.join()
    assert got == 4 << 20 and conn.getblocking() is False


def test_fd_backed_area(tcp_pair):
    """The dma-buf area path (size from the fd, shared CPU mapping) with a memfd standing in
    for the dma-buf, which this machine cannot make."""
    import os

    conn, cli = tcp_pair
    fd = os.memfd_create("area", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 1 << 20)
        snd = Sender(cli, 8 << 20)
        snd.start()
        got = 0
        with open_receiver(conn, "soft", area_size=1 << 20, buf_size=64 << 10,
                           dmabuf_fd=fd) as rx:
            assert rx.area.kind == "dmabuf" and rx.area.size == 1 << 20
            for c in rx:
                check(c)
                # The same bytes through the fd: the area really is the fd's memory.
                assert os.pread(fd, 16, c.offset) == bytes(c.data[:16])
                got += len(c)
                c.release()
        snd.join()
        assert got == 8 << 20
    finally:
        os.close(fd)


@pytest.mark.parametrize("incremental", [False, True])
def test_provider_close_interrupted_in_cancel_still_frees_its_buffer_ring(
        no_leaks, tcp_pair, monkeypatch, incremental: bool) -> None:
    server, _client = tcp_pair
    prov = soft.open_soft(server.fileno(), 1 << 20, 64 << 10, incremental=incremental)
    try:
        prov.arm()
        buf = prov.buf

        def interrupted(*_a: object) -> bool:
            raise KeyboardInterrupt

        monkeypatch.setattr(provider, "cancel_multishot", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prov.close(armed=True)
        assert buf._mem.closed  # the buffer ring's memory went with the ring
    finally:
        prov.area.close()


# --- the provider itself, under the Receiver's protocol ----------------------------------------

def _reap_all(prov, nbytes: int) -> tuple[bytes, list[int], list[int]]:
    """Reap until ``nbytes`` arrived: the bytes read in place at each (offset, length), and the
    tokens and lengths to give back. Every offset is its buffer id times the buffer size."""
    got = bytearray()
    tokens: list[int] = []
    lengths: list[int] = []
    bs = prov.buf_size
    for _ in range(100):
        if len(got) >= nbytes:
            break
        d = prov.reap(2.0)
        assert d.end is None, d.end
        for off, ln, tok in zip(list(d.offsets), list(d.lengths), list(d.tokens), strict=True):
            assert off == int(tok) * bs and 0 < ln <= bs
            got += prov.area.array[off:off + ln].tobytes()
        tokens += [int(t) for t in d.tokens]
        lengths += [int(x) for x in d.lengths]
    return bytes(got), tokens, lengths


@pytest.mark.parametrize("bundle", [False, True], ids=["plain", "bundle"])
@pytest.mark.parametrize("kind", [list, np.array], ids=["list", "array"])
def test_soft_provider_delivers_in_place_and_every_buffer_comes_back(tcp_pair, bundle, kind):
    """Three rounds of 24 buffers' worth through 64 buffers: the bytes are right in place, no
    buffer is handed out twice at once, and recycled ones (a few at a time, or many in one
    call) are filled again."""
    conn, cli = tcp_pair
    bs = 4096
    prov = soft.open_soft(conn.fileno(), 64 * bs, bs, bundle=bundle)
    try:
        assert prov.bundle is bundle and prov.note == f"64 buffers of {bs} bytes"
        assert prov.extra_stats() == {"buffers": 64, "buf_size": bs, "in_ring": 64}
        assert prov.held_back() == 0 and prov.can_arm()
        prov.arm()
        delivered = 0
        for rnd in range(3):
            data = PAT.expected(rnd * 24 * bs, 24 * bs).tobytes()
            cli.sendall(data)
            got, tokens, lengths = _reap_all(prov, len(data))
            assert got == data
            assert len(set(tokens)) == len(tokens), "a buffer delivered twice"
            assert prov.extra_stats()["in_ring"] == 64 - len(tokens)
            delivered += len(tokens)
            prov.recycle(kind(tokens[:3]), kind(lengths[:3]))  # a few, then the rest at once
            prov.recycle(kind(tokens[3:]), kind(lengths[3:]))
            assert prov.extra_stats()["in_ring"] == 64
        assert delivered > 64  # the last round could only fill recycled buffers
    finally:
        assert prov.close(armed=True)  # the multishot's cancel was confirmed
        prov.area.close()


def test_every_call_on_a_closed_soft_provider_names_itself(tcp_pair):
    from zcnet.errors import ClosedError

    conn, _ = tcp_pair
    prov = soft.open_soft(conn.fileno(), 16 * 4096, 4096)
    try:
        prov.arm()
        assert prov.close(armed=True)  # the multishot was cancelled
        prov.close()  # twice is harmless
        assert prov.extra_stats() == {"buffers": 16, "buf_size": 4096, "in_ring": 0}
        calls = {"can_arm": prov.can_arm, "arm": prov.arm, "reap": lambda: prov.reap(0),
                 "recycle": lambda: prov.recycle([0], [1])}
        for name, call in calls.items():
            with pytest.raises(ClosedError) as ei:
                call()
            assert ei.value.message == f"{name}() on a closed SoftProvider"
    finally:
        prov.area.close()


def test_a_bundle_that_takes_the_last_buffer_ends_the_multishot_with_its_data(tcp_pair):
    """The kernel fact behind sizing an area at twice rcvlowat (docs/aio.md): with more queued
    than the ring holds, a bundle receive fills every buffer and its CQE, with the data, is the
    multishot's last (no F_MORE: stopped "rearm"); without bundles the ring's last buffer is
    filled and the next receive ends it with -ENOBUFS ("exhausted"). Either way every queued
    byte that fit is delivered in place, and the rest arrives after a release and a re-arm."""
    conn, cli = tcp_pair
    bs = 4096
    data = PAT.expected(0, 12 * bs).tobytes()
    cli.sendall(data)
    got = bytearray()
    for bundle, stop in ((True, "rearm"), (False, "exhausted")):
        prov = soft.open_soft(conn.fileno(), 4 * bs, bs, bundle=bundle)
        try:
            assert prov.bundle is bundle
            prov.arm()
            tokens: list[int] = []
            for _ in range(100):
                d = prov.reap(2.0)
                for off, ln in zip(list(d.offsets), list(d.lengths), strict=True):
                    got += prov.area.array[off:off + ln].tobytes()
                tokens += [int(t) for t in d.tokens]
                if d.stopped or d.end is not None:
                    break
            assert (d.stopped, d.end) == (stop, None), bundle
            assert len(tokens) == 4 and prov.extra_stats()["in_ring"] == 0
        finally:
            prov.close()
            prov.area.close()
    assert got == data[:len(got)] and len(got) == 8 * bs  # two rings' worth, in order


@pytest.mark.parametrize("nbuf", [8, 32], ids=["few-cqes", "many-cqes"])
def test_soft_provider_exhausted_stops_and_one_buffer_back_lets_it_arm(tcp_pair, nbuf):
    """All buffers full: the multishot ends with -ENOBUFS (stopped "exhausted", not armed,
    cannot arm); one buffer back and it can arm again, and the rest of the stream arrives.
    Half the buffers are filled (and held) first, so the last round is the other half and the
    final CQE: for 8 buffers at most 16 CQEs, for 32 more (the filtering path) yet under the
    kernel's 32 CQEs per multishot run."""
    conn, cli = tcp_pair
    bs = 4096
    data = PAT.expected(0, (nbuf + 4) * bs).tobytes()
    cli.sendall(data[:nbuf // 2 * bs])
    prov = soft.open_soft(conn.fileno(), nbuf * bs, bs, bundle=False)
    try:
        prov.arm()
        got, tokens, lengths = bytearray(), [], []
        rest = data[nbuf // 2 * bs:]
        for _ in range(100):
            if rest and len(tokens) == nbuf // 2:
                cli.sendall(rest)
                rest = b""
            d = prov.reap(2.0)
            for off, ln, tok in zip(list(d.offsets), list(d.lengths), list(d.tokens),
                                    strict=True):
                got += prov.area.array[off:off + ln].tobytes()
                tokens.append(int(tok))
                lengths.append(int(ln))
            if d.stopped:
                break
        assert d.stopped == "exhausted" and d.end is None
        assert not prov.can_arm() and len(tokens) == nbuf
        assert prov.extra_stats()["in_ring"] == 0
        prov.recycle(tokens[:1], lengths[:1])
        assert prov.can_arm() and prov.extra_stats()["in_ring"] == 1
        prov.recycle(tokens[1:], lengths[1:])
        prov.arm()
        while len(got) < len(data):
            d = prov.reap(2.0)
            assert d.end is None and d.lengths is not None and len(d.lengths), "stalled"
            for off, ln in zip(list(d.offsets), list(d.lengths), strict=True):
                got += prov.area.array[off:off + ln].tobytes()
            prov.recycle(list(d.tokens), list(d.lengths))
        assert bytes(got) == data
        cli.close()
        d = prov.reap(2.0)
        assert d.end == 0  # EOF ends the multishot
    finally:
        prov.close()
        prov.area.close()


def test_open_soft_refuses_a_dmabuf_the_cpu_cannot_map(tcp_pair, tmp_path):
    """An fd with a size that mmap refuses (a write-only file) stands in for device memory."""
    import os

    conn, _ = tcp_pair
    path = tmp_path / "device-memory"
    path.write_bytes(bytes(1 << 16))
    fd = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(ZcnetError) as ei:
            soft.open_soft(conn.fileno(), 1 << 16, 4096, dmabuf_fd=fd)
        assert ei.value.message == "the soft provider needs a dma-buf the CPU can map"
        assert ei.value.hint == "use zcrx/devmem for device memory, or omit dmabuf_fd"
    finally:
        os.close(fd)


def test_open_soft_options_reach_the_provider(tcp_pair, monkeypatch):
    """Defaults: normal pages, whole buffers, bundles as the kernel offers them. hugetlb=True
    asks for 2 MiB pages; incremental falls back to whole buffers only on EINVAL (a kernel
    without IOU_PBUF_RING_INC), any other error is raised with the area released."""
    import errno
    import os

    conn, _ = tcp_pair
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no hugetlb fallback warning by default
        prov = soft.open_soft(conn.fileno(), 1 << 16, 4096)
    try:
        assert type(prov) is soft.SoftProvider and prov.area.kind == "anon"
        assert prov.bundle is bool(prov._ring.features & soft.u.IORING_FEAT_RECVSEND_BUNDLE)
    finally:
        prov.close()
        prov.area.close()
    prov = open_asking_for_hugetlb(
        lambda: soft.open_soft(conn.fileno(), 2 << 20, 64 << 10, hugetlb=True))
    prov.close()
    prov.area.close()
    prov = soft.open_soft(conn.fileno(), 1 << 16, 4096, incremental=True)
    try:
        assert type(prov) is soft.IncrementalSoftProvider
    finally:
        prov.close()
        prov.area.close()
    areas = []
    real_area = soft.Area

    def area(*a, **kw):
        areas.append(real_area(*a, **kw))
        return areas[-1]

    def refuse(err: int):
        def make(*a, **kw):
            raise OSError(err, os.strerror(err))
        return make

    monkeypatch.setattr(soft, "Area", area)
    monkeypatch.setattr(soft, "IncrementalSoftProvider", refuse(errno.EINVAL))
    prov = soft.open_soft(conn.fileno(), 1 << 16, 4096, incremental=True)
    try:
        assert type(prov) is soft.SoftProvider and prov.entries == 16
    finally:
        prov.close()
        prov.area.close()
    monkeypatch.setattr(soft, "IncrementalSoftProvider", refuse(errno.EPERM))
    with pytest.raises(OSError) as ei:
        soft.open_soft(conn.fileno(), 1 << 16, 4096, incremental=True)
    assert ei.value.errno == errno.EPERM and areas[-1].closed


@pytest.mark.parametrize("bundle", [False, True], ids=["plain", "bundle"])
def test_soft_provider_a_round_ending_the_stream_keeps_its_one_byte_tail(tcp_pair, bundle):
    """20 full buffers, 1 byte, EOF, all queued before arming: one round of more than 16 CQEs
    (the filtering path, for its final CQE) or a few bundle CQEs; every byte, then EOF."""
    conn, cli = tcp_pair
    bs = 4096
    data = PAT.expected(0, 20 * bs + 1).tobytes()
    cli.sendall(data)
    cli.close()
    prov = soft.open_soft(conn.fileno(), 64 * bs, bs, bundle=bundle)
    try:
        prov.arm()
        got, lengths, end = bytearray(), [], None
        for _ in range(50):
            d = prov.reap(2.0)
            for off, ln in zip(list(d.offsets), list(d.lengths), strict=True):
                got += prov.area.array[off:off + ln].tobytes()
                lengths.append(int(ln))
            if d.end is not None:
                end = d.end
                break
        assert bytes(got) == data and end == 0
        assert lengths[-1] == 1 and sum(lengths) == len(data)
    finally:
        prov.close()
        prov.area.close()


def _uring_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("io_uring" in line for line in f)


def test_a_soft_provider_that_cannot_build_its_buffer_ring_closes_its_ring(tcp_pair, tmp_path):
    """An area the CPU cannot map has no buffer ring: the io_uring made for it is closed before
    the error is seen (not when the traceback's frames die)."""
    import os

    from zcnet.rx.zc.area import Area

    conn, _ = tcp_pair
    path = tmp_path / "device-memory"
    path.write_bytes(bytes(1 << 16))
    fd = os.open(path, os.O_WRONLY)  # mmap refuses it: an area without a CPU mapping
    try:
        with Area(1 << 16, dmabuf_fd=fd) as area:
            before = _uring_maps()
            with pytest.raises(ZcnetError) as ei:
                soft.SoftProvider(conn.fileno(), area, 4096)
            assert ei.value.message == "this dma-buf cannot be mapped by the CPU"
            assert ei.value.__traceback__ is not None  # its frames still hold the ring object
            assert _uring_maps() == before
    finally:
        os.close(fd)
