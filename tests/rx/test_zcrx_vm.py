"""The real zcrx provider end to end in copy mode (ZCRX_REG_NODEV): a 7.x kernel, booted by
`zcnet vm run`, copies received TCP bytes into the zcrx area and posts CQE32s; everything above
that (RECV_ZC multishot, area offsets, the refill ring and its flush, re-arming, teardown) is
zcnet's code against the real kernel. No NIC writes into the area here: that stays unverified.
"""

from __future__ import annotations

import errno
import platform
import threading

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
from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.rx.zc import Chunk, Receiver, open_receiver
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.zcrx import (
    RING_FLAGS,
    Registration,
    kernel_offers,
    open_zcrx,
    register_ifq,
)
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


def test_256mib_verified_refill_ring_wraps(pair):
    """256 MiB through a 64-entry refill ring: every byte checked, the ring wrapped > 1000
    times, every buffer given back, area and region unmapped at the end."""
    conn, cli = pair
    total = 256 << 20
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
        assert rq.produced == st.released and rq.produced >= 1000 * rq.entries
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
