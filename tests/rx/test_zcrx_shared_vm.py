"""Many TCP connections on one zcrx queue against a real 7.x kernel in copy mode
(ZCRX_REG_NODEV, booted by `zcnet vm run`): one ifq, one ring and one refill ring for all of
them, each connection's RECV_ZC capped to its share, completions routed by user_data. Every byte
is checked against the stream its connection was sent. Copy mode has no NIC queue: what a device
adds (its page pool reading the refill ring, SO_RCVBUF bounding the skbs that hold buffers)
is tested on netdevsim and the fake kernel, not here.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from zc_helpers import PAT, Sender, ZcrxServer, connections, send_from_child
from zcnet.errors import ClosedError
from zcnet.rx.zc.zcrx import export_zcrx_queue, kernel_offers, open_zcrx_queue

pytestmark = pytest.mark.vm

MIB = 1 << 20
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "zcrx_shared.py"


@pytest.fixture
def copy_mode(no_leaks):
    if not kernel_offers().copy_mode:
        pytest.skip("this kernel has no zcrx copy mode (ZCRX_REG_NODEV, 7.x); run the vm tests "
                    "under `zcnet vm run`")


def test_64_connections_on_one_queue_verified_none_starved(copy_mode):
    """64 connections of 256 KiB each through one 16 MiB area (a 256 KiB share each): every
    byte verified, no connection held more than its share on any round, and every connection's
    throughput within 2x of the median; then every buffer is back and the queue is freed."""
    n, total = 64, 256 << 10
    with ExitStack() as stack:
        pairs = connections(stack, n)
        zq = stack.enter_context(open_zcrx_queue(16 * MIB, copy=True))
        srv = ZcrxServer(zq, [s for s, _ in pairs])
        assert zq.share_bytes() == 256 << 10
        start = time.monotonic()
        senders = [Sender(c, total, piece=64 << 10, base=i * MIB)
                   for i, (_, c) in enumerate(pairs)]
        for t in senders:
            t.start()
        srv.run(lambda: all(map(srv.finished, range(n))))
        for t in senders:
            t.join(10)
            assert t.error is None
        assert srv.got == [total] * n and not srv.errors
        rates = [total / (t - start) for t in srv.done_at]  # type: ignore[operator]
        med = statistics.median(rates)
        assert all(med / 2 <= r <= med * 2 for r in rates), (min(rates), med, max(rates))
        assert 0 < srv.most_held <= zq.share_bytes()
        assert sum(rx.provider.cap_stops for rx in srv.rx) > 0  # the caps did their work
        for rx in srv.rx:
            rx.close()
        zq.ready(0)  # the last releases back through the refill ring
        assert zq.rq.produced == sum(rx.stats.delivered for rx in srv.rx)


def test_one_connection_keeping_its_chunks_stalls_alone(copy_mode):
    """Connection 0 keeps every chunk: it stops at its share (its receive's cap) while the 7
    others finish; released, it finishes too."""
    n, total = 8, 1 * MIB
    with ExitStack() as stack:
        pairs = connections(stack, n)
        zq = stack.enter_context(open_zcrx_queue(2 * MIB, copy=True))
        srv = ZcrxServer(zq, [s for s, _ in pairs], hold=frozenset({0}))
        senders = [Sender(c, total, piece=64 << 10, base=i * MIB)
                   for i, (_, c) in enumerate(pairs)]
        for t in senders:
            t.start()
        srv.run(lambda: all(map(srv.finished, range(1, n))))
        hog = srv.rx[0]
        assert srv.got[1:] == [total] * (n - 1)
        assert srv.got[0] <= zq.share_bytes() == 256 << 10 and not hog.eof
        assert hog.stats.delivered_bytes - hog.stats.released_bytes == srv.got[0]
        hog.release_many(srv.kept)
        srv.hold, srv.kept = frozenset(), []
        srv.run(lambda: srv.finished(0))
        assert srv.got[0] == total
        for t in senders:
            t.join(10)
        for rx in srv.rx:
            rx.close()


def test_a_reset_a_close_and_the_queue_closing_end_only_their_connections(copy_mode):
    """Of 12 connections: one peer resets (its receiver raises ECONNRESET), one is closed by
    the server mid-stream holding a chunk (still readable), six finish; then the queue is
    closed with the last four open: each raises ClosedError naming the queue."""
    n, total = 12, 512 << 10
    with ExitStack() as stack:
        pairs = connections(stack, n)
        zq = open_zcrx_queue(4 * MIB, copy=True)
        stack.callback(zq.close)
        srv = ZcrxServer(zq, [s for s, _ in pairs])
        senders = [Sender(c, total if i < 8 else 64 * MIB, piece=64 << 10, base=i * MIB,
                          reset=i == 1) for i, (_, c) in enumerate(pairs)]
        for t in senders:
            t.start()
        senders[1].go_reset.set()
        srv.hold = frozenset({2})
        srv.run(lambda: srv.got[2] > 0)
        srv.rx[2].close()  # mid-stream, holding what it got
        kept, srv.kept = srv.kept, []
        srv.run(lambda: all(srv.finished(i) for i in (0, 1, 3, 4, 5, 6, 7)))
        assert isinstance(srv.errors.get(1), ConnectionResetError), srv.errors
        assert [srv.got[i] for i in (0, 3, 4, 5, 6, 7)] == [total] * 6
        assert all(PAT.matches(2 * MIB + c.stream_offset, c.array) for c in kept)
        srv.rx[2].release_many(kept)
        assert all(srv.got[i] > 0 for i in range(8, 12))
        assert zq.close()
        for i in range(8, 12):
            with pytest.raises(ClosedError) as ei:
                while True:
                    srv.rx[i].release_many(srv.rx[i].recv(0))
            assert "the zcrx queue copy mode was closed with this connection open" in str(
                ei.value)
        for rx in srv.rx:
            rx.close()
        for _, c in pairs[8:]:  # the blocked senders end once their peers are gone
            c.shutdown(socket.SHUT_RDWR)
        for t in senders:
            t.join(10)
        assert zq.area.closed


def test_the_shared_queue_benchmark_runs_and_reports_each_count(copy_mode):
    """benchmarks/zcrx_shared.py, tiny: a row per connection count with both ratios."""
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--mib", "4",
                          "--conns", "1,8", "--area-mib", "4"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1", "8"]
    for r in rows:
        assert all(float(x) > 0 for x in r[1:]), r


def test_four_threads_receive_one_queue_through_imports(copy_mode):
    """The queue's thread exports it to three more; each imports it on a ring of its own and
    serves 16 of the 64 connections: every byte verified, the shares split over all 64, one
    refill ring for all. Thread 3 closes its queue and exits holding one connection's chunks;
    released later from the main thread, they go back through the ifq."""
    n, per, total = 64, 16, 128 << 10
    with ExitStack() as stack:
        pairs = connections(stack, n)
        zq = stack.enter_context(open_zcrx_queue(16 * MIB, copy=True))
        exports = [stack.enter_context(export_zcrx_queue(zq)) for _ in range(3)]
        joined = threading.Barrier(4)
        delivered = [0] * 4
        kept: list = []
        failures: list[BaseException] = []

        def serve(k: int, open_queue) -> None:
            try:
                q = open_queue()
                socks = [s for s, _ in pairs[k * per:(k + 1) * per]]
                srv = ZcrxServer(q, socks, first=k * per,
                                 hold=frozenset({0}) if k == 3 else frozenset())
                joined.wait(60)  # every connection joined before any receive is armed
                assert q.mem.members == n and q.share_bytes() == 256 << 10
                srv.run(lambda: all(map(srv.finished, range(per))), timeout=300)
                assert srv.got == [total] * per and not srv.errors
                for rx in srv.rx:
                    rx.close()
                delivered[k] = sum(rx.stats.delivered for rx in srv.rx)
                kept.extend(srv.kept)
                if q is not zq:
                    assert q.close()
            except BaseException as e:  # reported by the test's thread
                failures.append(e)
                joined.abort()

        threads = [threading.Thread(target=serve, args=(k + 1, e.open))
                   for k, e in enumerate(exports)]
        for t in threads:
            t.start()
        sender = send_from_child([c for _, c in pairs], total)
        serve(0, lambda: zq)  # the queue's own thread serves the first 16
        for t in threads:
            t.join(300)
        sender.join(60)
        assert not failures, failures
        assert len(kept) > 0 and all(
            PAT.matches(3 * per * MIB + c.stream_offset, c.array) for c in kept)
        produced = zq.rq.produced
        for c in kept:
            c.release()  # after its receiver, its queue and its thread are gone
        zq.ready(0)
        assert zq.rq.produced == produced + len(kept) == sum(delivered)


def test_a_queue_on_a_mixed_cq_ring_receives_among_small_completions(copy_mode):
    """``cqe_mixed``: the queue's ring takes IORING_SETUP_CQE_MIXED (RECV_ZC CQEs 32 bytes,
    others 16). A NOP before every enter puts a 16-byte CQE among the RECV_ZC ones, so the CQ
    of 2048 slots wraps several times with pads before the wrap, which the reaper steps over:
    the bytes of 8 connections verified as on a CQE32 ring, the NOPs and pads seen."""
    from zcnet.uapi import io_uring as u

    n, total = 8, 2 * MIB
    with ExitStack() as stack:
        pairs = connections(stack, n)
        zq = stack.enter_context(open_zcrx_queue(2 * MIB, copy=True, rq_entries=128,
                                                 cqe_mixed=True))
        ring = zq.ring
        assert ring.cqe_mixed and not ring.cqe32
        assert ring.flags & u.IORING_SETUP_CQE_MIXED and ring.cq_entries == 2048
        srv = ZcrxServer(zq, [s for s, _ in pairs])
        nop_ud = 0xFF << 8  # no member's id: the queue's router drops what it cannot route
        seen = {"nops": 0, "big": 0, "pads": 0}
        reap = ring.reap

        def reap_counting(max_n=None):
            cq, head = ring._cqm, ring._cqm[ring._kcq_head_i]
            for i in range((cq[ring._kcq_tail_i] - head) & 0xFFFFFFFF):
                fl = int.from_bytes(ring._cqes[((head + i) & ring.cq_mask) * 16 + 12:][:4],
                                    "little")
                seen["pads"] += bool(fl & u.IORING_CQE_F_SKIP)
            c = reap(max_n)
            seen["nops"] += int((c.user_data == nop_ud).sum())
            seen["big"] += int(((c.flags & u.IORING_CQE_F_32) != 0).sum())
            return c

        ring.reap = reap_counting
        pump = zq.pump

        def pump_with_a_nop(timeout):
            ring.prep(u.IORING_OP_NOP, user_data=nop_ud)
            pump(timeout)

        zq.pump = pump_with_a_nop
        senders = [Sender(c, total, piece=64 << 10, base=i * MIB)
                   for i, (_, c) in enumerate(pairs)]
        for t in senders:
            t.start()
        srv.run(lambda: all(map(srv.finished, range(n))))
        for t in senders:
            t.join(10)
            assert t.error is None
        assert srv.got == [total] * n and not srv.errors
        assert seen["big"] * 2 >= ring.cq_entries * 2  # the CQ wrapped at least twice
        assert seen["nops"] > 0 and seen["pads"] > 0, seen
        for rx in srv.rx:
            rx.close()
