"""The real zcrx provider end to end in copy mode (ZCRX_REG_NODEV): a 7.x kernel, booted by
`zcnet vm run`, copies received TCP bytes into the zcrx area and posts CQE32s; everything above
that (RECV_ZC multishot, area offsets, the refill ring and its flush, re-arming, teardown) is
zcnet's code against the real kernel. No NIC writes into the area here: that stays unverified.
"""

from __future__ import annotations

import errno
import platform
import socket
import threading
import time

import numpy as np
import pytest

from fake_zcrx_kernel import KERNEL_LAYOUTS
from zc_helpers import (
    PAT,
    Sender,
    check,
    check_to_eof,
    hold_until_stalled,
    mapped,
    release_in_thread,
)
from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError
from zcnet.rx.zc import Chunk, Receiver, open_receiver
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.zcrx import (
    RING_FLAGS,
    Registration,
    kernel_offers,
    open_zcrx,
    open_zcrx_queue,
    register_ifq,
)
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring

pytestmark = pytest.mark.vm


@pytest.fixture
def pair(no_leaks, tcp_pair):
    """(receiving, sending) loopback sockets, on a kernel with zcrx copy mode."""
    if not kernel_offers().copy_mode:
        pytest.skip("this kernel has no zcrx copy mode (ZCRX_REG_NODEV, 7.x); run the vm tests "
                    "under `zcnet vm run`")
    client, server = tcp_pair
    return server, client


def receiver(sock, area_size: int, *, rq_entries: int = 4096, max_held: float = 0.75,
             rx_buf_len: int = 0) -> Receiver:
    prov = open_zcrx(sock.fileno(), area_size, rq_entries=rq_entries, rx_buf_len=rx_buf_len,
                     copy=True)
    return Receiver(sock, prov, max_held=max_held, why=prov.note)


def verify_batches(rx: Receiver) -> int:
    """Receive to EOF in batches; every byte checked against the pattern; returns the count."""
    got = 0
    while (b := rx.recv_batch(timeout=60)) is not None or not rx.eof:
        if b is None:
            continue
        assert b.stream_offset == got
        data = np.concatenate(b.arrays())
        assert PAT.matches(got, data), f"mismatch at {got}+{PAT.first_mismatch(got, data)}"
        got += len(data)
        b.release()
    return got


def test_64mib_verified_refill_ring_wraps(pair):
    """64 MiB through a 64-entry refill ring: every byte checked, the ring wrapped > 250
    times, every buffer given back, area and region unmapped at the end. (256 MiB took 70 s
    of the suite under TCG for nothing more.)"""
    conn, cli = pair
    total = 64 << 20
    snd = Sender(cli, total, piece=4 << 20)
    snd.start()
    rx = receiver(conn, 2 << 20, rq_entries=64)
    area_addr, region_addr = rx.area.addr, rx.provider.reg.region_mem.addr
    with rx:
        assert rx.provider.mode == "copy"
        # The host's fake kernel uses these layouts: a new one must be added there.
        assert rx.provider.offsets in KERNEL_LAYOUTS.values(), (platform.release(),
                                                                rx.provider.offsets)
        assert verify_batches(rx) == total
        rx.flush()
        st = rx.stats
        assert st.delivered == st.released and st.in_flight_bytes == 0
        rq = rx.provider.rq
        assert rq.produced == st.released and rq.produced >= 250 * rq.entries
        assert rq.held == 0 and rq.kernel_head() == rq.tail  # the flush consumed everything
        # Copy mode copies every byte, and the kernel's own counter (zcrx_stats) says so, but
        # for payload copied out of an skb's linear part, which io_zcrx_recv_skb (7.3) does not
        # count: now and then a few bytes of the stream (docs/netdevsim.md).
        copied = rx.stats_dict()
        assert total - (64 << 10) <= copied["kernel_copied_bytes"] <= total, copied
        assert copied["zero_copy_share"] == 0.0
        assert copied["kernel_copied_source"] == "zcrx_stats.copy_bytes"
    snd.join()
    assert snd.error is None
    assert not mapped(area_addr) and not mapped(region_addr)


def test_release_from_another_thread(pair):
    conn, cli = pair
    total = 32 << 20
    snd = Sender(cli, total)
    snd.start()
    with receiver(conn, 1 << 20) as rx:
        verified, errors = release_in_thread(rx)
        rx.flush()
        assert rx.stats.in_flight == 0 and rx.stats.released_bytes == total
    snd.join()
    assert not errors and verified == total


def test_held_chunks_backpressure_then_release(pair):
    conn, cli = pair
    total = 8 << 20
    snd = Sender(cli, total)
    snd.start()
    area = 512 << 10
    with receiver(conn, area, max_held=0.5) as rx:
        held = hold_until_stalled(rx, "backpressure")
        assert rx.stats.backpressure == 1 and rx.stats.in_flight_bytes > area // 2
        for c in held:
            check(c)
        got = sum(map(len, held))
        threading.Timer(0.05, rx.release_many, args=(held,)).start()
        got += check_to_eof(rx)
        assert rx.stalled is None
    snd.join()
    assert got == total


def test_multishot_ends_when_area_is_exhausted_and_rearms(pair):
    """Holding every buffer: the kernel's copy finds none free and ends the multishot (-ENOMEM);
    releasing re-arms it and the stream continues intact."""
    conn, cli = pair
    total = 4 << 20
    snd = Sender(cli, total)
    snd.start()
    with receiver(conn, 16 * PAGE_SIZE, max_held=1.0) as rx:
        held = hold_until_stalled(rx, "exhausted")
        assert rx.stats.exhausted >= 1 and len(held) == 16 and not rx.core.armed
        got = sum(map(len, held))
        for c in held:
            check(c)
        rx.release_many(held)
        got += check_to_eof(rx)
        assert rx.stats.rearms >= 1 and rx.eof
    snd.join()
    assert got == total


def test_peer_reset_mid_stream(pair):
    conn, cli = pair
    total = 1 << 20
    snd = Sender(cli, total, reset=True)
    snd.start()
    held: list[Chunk] = []
    rx = receiver(conn, 4 << 20)
    with pytest.raises(ConnectionResetError):
        for c in rx:
            held.append(c)
            if sum(map(len, held)) >= total:
                snd.go_reset.set()
    snd.join()
    assert sum(map(len, held)) == total
    for c in held:
        check(c)
    rx.release_many(held)
    rx.close()
    assert rx.area.closed


def test_close_with_chunks_held(pair):
    conn, cli = pair
    snd = Sender(cli, 2 << 20)
    snd.start()
    rx = receiver(conn, 1 << 20)
    held = rx.recv(timeout=30)
    while sum(map(len, held)) < 64 << 10:
        held += rx.recv(timeout=30)
    addr = rx.area.addr
    rx.close()  # cancels the multishot and frees the ifq; the area stays for the held chunks
    assert not rx.area.closed and mapped(addr)
    for c in held:
        check(c)
    rx.release_many(held)
    assert rx.area.closed and not mapped(addr)
    snd.join()


def test_rx_buf_len_where_offered(pair):
    conn, _ = pair
    offers = kernel_offers()
    if not offers.rx_buf_len:
        pytest.skip("this kernel does not offer rx_buf_len (ZCRX_FEATURE_RX_PAGE_SIZE)")
    with receiver(conn, 1 << 20, rx_buf_len=PAGE_SIZE) as rx:
        assert rx.provider.buf_len == PAGE_SIZE  # written back by the kernel
        assert rx.stats_dict()["rx_buf_len"] == PAGE_SIZE
    with pytest.raises(Unsupported, match="copy mode fills 4096-byte buffers only"):
        receiver(conn, 1 << 20, rx_buf_len=2 * PAGE_SIZE)
    with pytest.raises(UsageError, match="power of two"):
        receiver(conn, 1 << 20, rx_buf_len=3 * PAGE_SIZE)
    # Our refusal matches the kernel's: registering it anyway is EOPNOTSUPP.
    with Area(1 << 20) as area:
        reg = Registration.build(area, 0, 0, 64, nodev=True, rx_buf_len=2 * PAGE_SIZE)
        with Ring(8, flags=RING_FLAGS) as ring, pytest.raises(ZcnetError) as ei:
            register_ifq(ring, reg)
        reg.release()
    assert ei.value.errno == errno.EOPNOTSUPP  # type: ignore[attr-defined]


def test_open_receiver_says_the_kernel_copies_and_auto_stays_soft(pair):
    conn, _ = pair
    with open_receiver(conn, "zcrx", area_size=1 << 20) as rx:
        assert rx.name == "zcrx" and "copy mode" in rx.why and "kernel copies" in rx.why
        assert rx.stats_dict()["zcrx_copy"] == 1
    with open_receiver(conn, "auto", area_size=1 << 20) as rx:
        assert rx.name == "soft" and rx.why.startswith("soft, because zcrx:")


def test_bench_zcrx_cell_in_a_lab_is_ok_and_labelled_copy(no_leaks):
    if not kernel_offers().copy_mode:
        pytest.skip("this kernel has no zcrx copy mode; run under `zcnet vm run`")
    from zcnet.bench.run import BenchOptions, run_bench
    from zcnet.report.bench_table import bench_notes, cell_text

    doc = run_bench(BenchOptions(mtus=(1500,), engines=("zcrx",), placements=("split",),
                                 duration=0.5, lab=True, verify=True))
    (cell,) = doc.results
    assert cell.status == "ok", cell.reason
    stats = cell.engine_stats or {}
    assert cell.zcrx_mode == "copy" and stats["zcrx_copy"] == 1
    # Over the veth lab every byte is the kernel's copy, counted by the kernel, carried in the cell.
    assert (stats["kernel_copied_bytes"], stats["zero_copy_share"]) == (cell.bytes, 0.0)
    assert cell.verify is not None and cell.verify.mismatches == 0
    assert cell.verify.checked_bytes > 0
    assert " copy" in cell_text(cell).plain
    assert any("zcrx copy mode" in n for n in bench_notes(doc))


def test_mlx5_zcrx_plan_measures_zcrx_here():
    if not kernel_offers().copy_mode:
        pytest.skip("this kernel has no zcrx copy mode; run under `zcnet vm run`")
    from zcnet.bench.experiments import ExperimentRig, plan
    from zcnet.bench.spec import builtin_spec

    p = plan(builtin_spec("mlx5-zcrx"), ExperimentRig())
    assert not p.substitutions
    assert {c["engine"] for c in p.cells if "peer" not in c} == {"epoll", "uring", "zcrx"}


# --- added areas (ZCRX_CTRL_ADD_AREA, 7.3): a queue that grows --------------------------------

FIRST = 64 << 10   # 16 buffers
ADDED = 128 << 10  # 32 more
PAYLOAD = bytes(range(256)) * 600  # 150 KiB: more than the first area holds


@pytest.fixture
def growable(no_leaks):
    if not kernel_offers().add_area:
        pytest.skip("this kernel has no ZCRX_CTRL_ADD_AREA (7.3); run the vm tests under "
                    "`zcnet vm run`")
    zq = open_zcrx_queue(FIRST, copy=True, area_capacity=1 << 20)
    try:
        yield zq
    finally:
        zq.close()


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        tx = socket.create_connection(ls.getsockname()[:2])
        rx, _ = ls.accept()
    return tx, rx


def _receive_holding(rx: Receiver, n: int) -> tuple[bytes, list]:
    """``n`` bytes, every chunk held (so the kernel must find buffers elsewhere)."""
    got, held = bytearray(), []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        for c in rx.recv(1.0):
            got += bytes(c.data)
            held.append(c)
    return bytes(got), held


def test_data_the_first_area_cannot_hold_lands_in_the_added_one(growable) -> None:
    zq = growable
    assert zq.buffers() == FIRST // PAGE_SIZE
    area_id = zq.add_area(ADDED)
    assert area_id >= 1 and zq.rq.area_starts is not None
    assert zq.rq.area_starts[area_id] == FIRST  # (id, start) as the kernel named it
    assert zq.area.size == FIRST + ADDED and zq.buffers() == (FIRST + ADDED) // PAGE_SIZE
    tx, s = _pair()
    with tx, s:
        rx = Receiver(s, zq.join(s.fileno()))
        try:
            for rnd in range(2):  # the second round reuses buffers the refill ring gave back
                tx.sendall(PAYLOAD)
                got, held = _receive_holding(rx, len(PAYLOAD))
                assert got == PAYLOAD, rnd
                assert max(c.offset + c.length for c in held) > FIRST  # the added area
                assert all(c.offset >= 0 and c.offset + c.length <= zq.area.size for c in held)
                for c in held:
                    c.release()
        finally:
            rx.close()


def test_misuse_is_refused_and_the_queue_still_receives(growable) -> None:
    zq = growable
    with pytest.raises(UsageError, match="multiple of 4096"):
        zq.add_area(1000)
    with pytest.raises(UsageError, match=r"do not fit.*area_capacity"):
        zq.add_area(2 << 20)
    refused: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(refused, zq.add_area, ADDED))
    t.start()
    t.join()
    assert len(refused) == 1 and "single-issuer" in str(refused[0])
    assert zq.area.size == FIRST and zq.rq.area_starts is None  # nothing half-added
    tx, s = _pair()
    with tx, s:
        rx = Receiver(s, zq.join(s.fileno()))
        try:
            tx.sendall(PAYLOAD[:FIRST // 2])
            got, held = _receive_holding(rx, FIRST // 2)
            assert got == PAYLOAD[:FIRST // 2]
            for c in held:
                c.release()
        finally:
            rx.close()


def test_a_queue_without_room_to_grow_says_how_to_get_it(no_leaks) -> None:
    if not kernel_offers().add_area:
        pytest.skip("this kernel has no ZCRX_CTRL_ADD_AREA (7.3)")
    zq = open_zcrx_queue(FIRST, copy=True)
    try:
        with pytest.raises(UsageError, match="area_capacity="):
            zq.add_area(ADDED)
    finally:
        zq.close()
    with pytest.raises(ClosedError):
        zq.add_area(ADDED)


def test_the_kernel_names_the_added_area_in_its_token(growable) -> None:
    """The id add_area returns is the kernel's (rq_area_token >> IORING_ZCRX_AREA_SHIFT), and
    refill entries keep it: the ring's table maps it to where its memory starts."""
    zq = growable
    first = zq.add_area(ADDED)
    second = zq.add_area(4 * PAGE_SIZE)
    assert second == first + 1
    table = zq.rq.area_starts
    assert table is not None and list(table[[0, first, second]]) == [0, FIRST, FIRST + ADDED]
    assert zq.rq.push_mask == (1 << 64) - 1 and zq.rq.area_token == 0
    assert u.IORING_ZCRX_AREA_SHIFT == 48


def _catch(into: list[BaseException], f, *args) -> None:  # type: ignore[no-untyped-def]
    try:
        f(*args)
    except Exception as e:  # handed to the test thread
        into.append(e)
