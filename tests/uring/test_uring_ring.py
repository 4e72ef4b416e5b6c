"""Ring mechanics against the real kernel: wraparound, overflow, multishot, buffer rings, probe."""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import socket
import struct

import numpy as np
import pytest

from uring_backends import ring_backend  # noqa: F401  (autouse: every test on both paths)
from zcnet.errors import ClosedError, UsageError
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing, probe, register_buffers, unregister_buffers, unsupported
from zcnet.uring.mem import Mapping
from zcnet.uring.prep import prep_nop, prep_read_fixed, prep_recv, prep_recv_multishot
from zcnet.uring.ring import Ring

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

FAST = u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN


def test_nop_round_trip_and_close_releases(no_leaks) -> None:
    with Ring(8) as r:
        prep_nop(r, 1234)
        assert r.submit(1) == 1
        c = r.reap()
        assert c.user_data.tolist() == [1234] and c.res.tolist() == [0]


@pytest.mark.parametrize("batch", [1, 3, 7, 8])
def test_sq_and_cq_wrap_around_many_times(no_leaks, batch: int) -> None:
    """Tails pass the ring end (and batches straddle it) many times; order and count hold."""
    with Ring(8, flags=FAST) as r:
        seen: list[int] = []
        nxt = 0
        for _ in range(200):
            ud = np.arange(nxt, nxt + batch, dtype=np.uint64)
            r.prep_batch(u.IORING_OP_NOP, ud)
            nxt += batch
            r.submit(batch)
            seen += r.reap().user_data.tolist()
        assert seen == list(range(nxt))


def test_cq_overflow_loses_nothing(no_leaks) -> None:
    """Submit 4x the CQ size without reaping: the kernel holds the overflow (FEAT_NODROP)."""
    with Ring(16, cq_entries=16) as r:
        assert r.features & u.IORING_FEAT_NODROP
        total = 64
        for i in range(0, total, 16):
            r.prep_batch(u.IORING_OP_NOP, np.arange(i, i + 16, dtype=np.uint64))
            r.submit()
        assert r.cq_overflow
        got: list[int] = []
        while len(got) < total:
            got += r.reap().user_data.tolist()
            if len(got) < total:
                r.get_events()  # flushes overflowed CQEs into the CQ
        assert sorted(got) == list(range(total))
        assert not r.cq_overflow


@pytest.mark.parametrize("flags", [0, u.IORING_SETUP_CQE32])
def test_cq_addresses_read_what_the_ring_reads(no_leaks, flags: int) -> None:
    """cq_addresses() names the CQ words and entries the kernel writes: read through them, the
    head/tail agree with cq_ready, the CQEs carry the user_data of the NOPs (at cqe_size
    strides), the SQ flags word is sq_flags; advancing the head through it consumes the CQEs."""
    with Ring(8, flags=flags, cq_entries=16) as r:
        a = r.cq_addresses()
        assert (a.cq_mask, a.cqe_size) == (15, 32 if flags else 16)
        u32 = ctypes.c_uint32
        head, tail = u32.from_address(a.cq_head), u32.from_address(a.cq_tail)
        r.prep_batch(u.IORING_OP_NOP, np.array([11, 22, 33], dtype=np.uint64))
        r.submit(3)
        assert (tail.value - head.value) & 0xFFFFFFFF == r.cq_ready() == 3
        got = [ctypes.c_uint64.from_address(a.cqes + ((head.value + i) & a.cq_mask)
                                            * a.cqe_size).value for i in range(3)]
        assert got == [11, 22, 33]
        assert u32.from_address(a.sq_flags).value == r.sq_flags
        head.value = tail.value
        assert r.cq_ready() == 0 and r.reap_one() is None


def test_reap_takes_its_limit_positionally(no_leaks) -> None:
    """reap(n) as the compiled Core takes it (one positional int, no keyword): at most n
    CQEs, oldest first, the rest left ready; 0 and a negative limit take none; None and a
    limit beyond what is ready take the rest. The same on both paths."""
    with Ring(16) as r:
        for ud in range(10, 16):
            prep_nop(r, ud)
        assert r.submit(6) == 6 and r.cq_ready() == 6
        assert r.reap(2).user_data.tolist() == [10, 11] and r.cq_ready() == 4
        assert len(r.reap(0)) == 0 and len(r.reap(-3)) == 0 and r.cq_ready() == 4
        assert r.reap(1).user_data.tolist() == [12]
        assert r.reap(None).user_data.tolist() == [13, 14, 15] and r.cq_ready() == 0
        prep_nop(r, 16)
        r.submit(1)
        assert r.reap(100).user_data.tolist() == [16]


def test_slow_path_reaches_the_ring_and_names_one_that_is_gone(no_leaks) -> None:
    """A method off its common path (here reap with a keyword) runs the Ring's Python method,
    found through the compiled Core's weak reference to the Ring (on the pure path it is that
    method); once the Ring object is gone, a bound method kept from it raises ClosedError
    instead of touching anything."""
    r = Ring(8)
    fd, maps, backend = r.fd, list(r._maps), r.backend
    try:
        prep_nop(r, 7)
        r.submit(1)
        assert r.reap(max_n=1).user_data.tolist() == [7]
        reap = r.reap
        del r
        gc.collect()
        if backend == "c":  # a Python bound method keeps its Ring alive
            with pytest.raises(ClosedError, match="reap"):
                reap(max_n=1)
        del reap
    finally:
        os.close(fd)
        for m in maps:
            m.close()


def test_negative_res_becomes_oserror_with_errno(no_leaks) -> None:
    with Ring(4) as r:
        prep_recv(r, 1_000_000, 0, 16, user_data=9)  # no such fd
        r.submit(1)
        c = r.reap()
        with pytest.raises(OSError) as ei:
            c.raise_for_errors("recv")
        assert ei.value.errno == errno.EBADF


def test_multishot_recv_terminates_on_eof_and_rearms(no_leaks, tcp_pair) -> None:
    c, s = tcp_pair
    with Ring(16, flags=FAST) as r, BufRing(r, 3, 8, 4096) as br:
        prep_recv_multishot(r, s.fileno(), 3, 1)
        c.sendall(b"a" * 5000)
        r.submit(1)
        got = bytearray()
        while len(got) < 5000:
            cs = r.reap()
            for res, fl in zip(cs.res.tolist(), cs.flags.tolist(), strict=True):
                assert res > 0 and fl & u.IORING_CQE_F_MORE and fl & u.IORING_CQE_F_BUFFER
                bid = fl >> u.IORING_CQE_BUFFER_SHIFT
                got += bytes(br.buffer(bid, res))
                br.provide(br.consumed(res, bid))
            if len(got) < 5000:
                r.wait(1)
        assert bytes(got) == b"a" * 5000
        c.shutdown(socket.SHUT_WR)
        r.wait(1)
        cs = r.reap()
        assert cs.res.tolist()[-1] == 0 and not cs.flags[-1] & u.IORING_CQE_F_MORE


def test_buffer_ring_exhaustion_gives_enobufs_then_recovers(no_leaks, tcp_pair) -> None:
    c, s = tcp_pair
    with Ring(16, flags=FAST) as r, BufRing(r, 5, 2, 4096) as br:
        prep_recv_multishot(r, s.fileno(), 5, 7)
        c.sendall(b"b" * 20000)  # more than 2 x 4 KiB of buffers
        r.submit(1)
        held: list[int] = []
        final = None
        while final is None:
            cs = r.reap()
            if not len(cs):
                r.wait(1)
                continue
            for res, fl in zip(cs.res.tolist(), cs.flags.tolist(), strict=True):
                if res > 0:
                    held += br.consumed(res, fl >> u.IORING_CQE_BUFFER_SHIFT).tolist()
                if not fl & u.IORING_CQE_F_MORE:
                    final = res
        assert final == -errno.ENOBUFS
        assert br.in_ring == 0 and sorted(held) == [0, 1]
        # Recover: give the buffers back and re-arm; the rest of the data arrives.
        br.provide(np.array(held, dtype=np.uint16))
        prep_recv_multishot(r, s.fileno(), 5, 8)
        r.submit(1)
        assert r.reap().res[0] > 0




def test_a_capped_multishot_ends_at_its_limit_and_took_counts_by_completion(no_leaks,
                                                                           tcp_pair) -> None:
    """The SQE's optlen caps a multishot receive's bytes (zcnet.aio.pool's quota): with 16 KiB
    of buffers free it ends after the 8 KiB asked, the rest stays in the socket. ``took``
    accounts buffers named by their completions and refuses more than the ring held."""
    c, s = tcp_pair
    with Ring(16, flags=FAST) as r, BufRing(r, 9, 4, 4096) as br:
        c.sendall(b"q" * 40000)
        prep_recv_multishot(r, s.fileno(), 9, 7, limit=8192)
        got = []
        while not got or got[-1][1] & u.IORING_CQE_F_MORE:
            r.submit(1)
            cs = r.reap()
            got += zip(cs.res.tolist(), cs.flags.tolist(), strict=True)
        assert sum(res for res, _ in got) == 8192 and all(res > 0 for res, _ in got)
        br.took(len(got))
        assert br.in_ring == 4 - len(got)
        assert s.recv(65536, socket.MSG_DONTWAIT)  # the rest was left in the socket
        with pytest.raises(RuntimeError, match="buffer ring out of step: 3 buffers taken"):
            br.took(3)
        for bad in (1 << 31, -1):  # the kernel reads optlen as an int: 2**31 is negative
            with pytest.raises(UsageError, match=r"is not 0\.\.2\*\*31-1 bytes"):
                prep_recv_multishot(r, s.fileno(), 9, 8, limit=bad)
        br.close()
        with pytest.raises(ClosedError):
            br.took(1)


def test_kernel_head_follows_the_buffers_the_kernel_took(no_leaks, tcp_pair) -> None:
    """IORING_REGISTER_PBUF_STATUS reports the kernel's head: where ours is once every
    completion is seen, ahead of it while one is not (what zcnet.aio.shared checks before
    handing a registered group to the next receiver)."""
    c, s = tcp_pair
    with Ring(16, flags=FAST) as r, BufRing(r, 6, 4, 4096) as br:
        assert br.kernel_head() == br.head == 0
        prep_recv_multishot(r, s.fileno(), 6, 7)
        c.sendall(b"h" * 3000)
        r.submit(1)
        r.wait(1)
        assert br.kernel_head() == 1 and br.head == 0  # taken, completion not yet seen
        cs = r.reap()
        br.consumed(int(cs.res[0]), int(cs.flags[0]) >> u.IORING_CQE_BUFFER_SHIFT)
        assert br.kernel_head() == br.head == 1
    with Ring(4) as r, BufRing(r, 2, 4, 4096) as br:
        br.close()
        with pytest.raises(ClosedError):
            br.kernel_head()

def test_double_provide_is_refused(no_leaks) -> None:
    with Ring(4) as r, BufRing(r, 1, 4, 4096) as br, pytest.raises(ValueError):
        br.provide(np.array([0], dtype=np.uint16))


def _reap_incremental(r: Ring, br: BufRing, want: int) -> list[tuple[int, int, bytes, bool]]:
    """(bid, offset in the buffer, data, F_BUF_MORE) of each receive until ``want`` bytes came."""
    got: list[tuple[int, int, bytes, bool]] = []
    n = 0
    while n < want:
        cs = r.reap()
        if not len(cs):
            r.wait(1, timeout=2)
            continue
        for res, fl in zip(cs.res.tolist(), cs.flags.tolist(), strict=True):
            assert res > 0 and fl & u.IORING_CQE_F_MORE and fl & u.IORING_CQE_F_BUFFER
            bid, more = fl >> u.IORING_CQE_BUFFER_SHIFT, bool(fl & u.IORING_CQE_F_BUF_MORE)
            at = br.filled(res, bid, more)
            got.append((bid, at, bytes(br.buffer(bid)[at:at + res]), more))
            n += res
    return got


def test_incremental_ring_packs_receives_back_to_back(no_leaks, tcp_pair) -> None:
    """IOU_PBUF_RING_INC: small receives share one buffer, reported with F_BUF_MORE while it is
    partly used; the receive that fills it retires it, the next data goes to the next buffer,
    and a buffer provided again starts from its beginning."""
    c, s = tcp_pair
    with Ring(16, flags=FAST) as r, BufRing(r, 6, 2, 4096, incremental=True) as br:
        prep_recv_multishot(r, s.fileno(), 6, 1)
        r.submit()
        msgs = [b"alpha", b"be", b"gamma-delta"]
        got = []
        for m in msgs:
            c.sendall(m)
            got += _reap_incremental(r, br, len(m))
        assert [g[2] for g in got] == msgs  # one receive per message, data intact
        assert [g[1] for g in got] == [0, 5, 7]  # back to back in the buffer
        first = got[0][0]
        assert all(g[0] == first and g[3] for g in got)
        assert br.in_ring == 2
        # Fill the buffer to its end: the last receive retires it (no F_BUF_MORE).
        rest = 4096 - sum(map(len, msgs))
        c.sendall(b"x" * rest)
        fill = _reap_incremental(r, br, rest)
        assert {g[0] for g in fill} == {first}
        assert [g[3] for g in fill] == [True] * (len(fill) - 1) + [False]
        assert b"".join(g[2] for g in fill) == b"x" * rest and br.in_ring == 1
        # The next data goes to the other buffer, from its start.
        c.sendall(b"next")
        (nxt,) = _reap_incremental(r, br, 4)
        assert nxt[0] != first and nxt[1:] == (0, b"next", True)
        # The retired buffer comes back and is filled again from offset 0.
        br.provide(np.array([first], dtype=np.uint16))
        c.sendall(b"y" * 4092)
        assert _reap_incremental(r, br, 4092)[-1][0] == nxt[0] and br.in_ring == 1
        c.sendall(b"again")
        assert _reap_incremental(r, br, 5) == [(first, 0, b"again", True)]


def test_incremental_and_whole_buffer_accounting_do_not_mix(no_leaks) -> None:
    with Ring(4) as r:
        with BufRing(r, 1, 4, 4096, incremental=True) as br, pytest.raises(ValueError):
            br.consumed(4096, 0)
        with BufRing(r, 2, 4, 4096) as br, pytest.raises(ValueError):
            br.filled(16, 0, True)


def test_read_fixed_from_registered_buffer(no_leaks, tcp_pair) -> None:
    c, s = tcp_pair
    with Ring(4) as r, Mapping.anonymous(8192) as m:
        register_buffers(r, [(m.addr, m.size)])
        c.sendall(b"fixed!")
        prep_read_fixed(r, s.fileno(), m.addr, m.size, 0, user_data=3)
        r.submit(1)
        res = r.reap()
        res.raise_for_errors()
        assert bytes(m.view(np.uint8, 0, int(res.res[0]))) == b"fixed!"
        unregister_buffers(r)


def test_probe_reports_known_ops() -> None:
    ops = probe()
    assert {u.IORING_OP_NOP, u.IORING_OP_RECV, u.IORING_OP_SEND} <= ops
    assert unsupported(u.IORING_OP_NOP) is None
    assert "lacks" in (unsupported(u.IORING_OP_LAST + 5) or "")


def test_setup_flags_and_cqe32_extra_words(no_leaks) -> None:
    flags = (u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN
             | u.IORING_SETUP_SUBMIT_ALL | u.IORING_SETUP_CQE32)
    with Ring(8, flags=flags, cq_entries=64) as r:
        assert r.cqe32 and r.cq_entries == 64
        prep_nop(r, 77)
        r.submit(1)
        c = r.reap()
        assert c.user_data.tolist() == [77]
        assert c.extra is not None and c.extra.shape == (1, 2)
    with Ring(8, flags=u.IORING_SETUP_COOP_TASKRUN | u.IORING_SETUP_SUBMIT_ALL) as r:
        prep_nop(r, 1)
        assert r.submit(1) == 1


def test_send_zc_posts_result_then_notification(no_leaks, tcp_pair) -> None:
    from zcnet.uring.prep import prep_send_zc

    c, s = tcp_pair
    with Ring(8) as r, Mapping.anonymous(4096) as m:
        m.view(np.uint8)[:5] = np.frombuffer(b"hello", dtype=np.uint8)
        prep_send_zc(r, c.fileno(), m.addr, 5, user_data=11)
        r.submit(2)
        got = r.reap()
        while len(got) < 2:
            r.wait(1)
            more = r.reap()
            got = type(got)(np.concatenate([got.user_data, more.user_data]),
                             np.concatenate([got.res, more.res]),
                             np.concatenate([got.flags, more.flags]))
        assert got.user_data.tolist() == [11, 11]
        assert got.res[0] == 5 and got.flags[0] & u.IORING_CQE_F_MORE
        assert got.flags[1] & u.IORING_CQE_F_NOTIF
        assert s.recv(16) == b"hello"


def test_wait_with_timeout_returns_without_completions(no_leaks, tcp_pair) -> None:
    import time

    _, s = tcp_pair
    with Ring(4, flags=FAST) as r, Mapping.anonymous(4096) as m:
        prep_recv(r, s.fileno(), m.addr, 16, user_data=1)  # nothing will arrive
        t0 = time.monotonic()
        r.wait(1, timeout=0.2)
        assert time.monotonic() - t0 >= 0.15
        assert len(r.reap()) == 0 and r.pending == 0


class _Interrupted(Exception):
    pass


def _raise_interrupted(_sig: int, _frame: object) -> None:
    raise _Interrupted


@pytest.mark.timeout(60, method="thread")  # the test uses SIGALRM itself
def test_signal_during_wait_keeps_the_pending_count_true(no_leaks, tcp_pair) -> None:
    """A signal handler that raises (Ctrl-C) right after the enter consumed the SQEs must not
    leave a stale pending count: a later enter would ask for SQEs that do not exist, the
    kernel then skips the wait, and every wait loop above spins instead of sleeping."""
    import signal
    import time

    _, s = tcp_pair
    old = signal.signal(signal.SIGALRM, _raise_interrupted)
    try:
        with Ring(4, flags=FAST) as r, Mapping.anonymous(4096) as m:
            prep_recv(r, s.fileno(), m.addr, 16, user_data=1)  # nothing will arrive
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            with pytest.raises(_Interrupted):
                r.submit(1)
            assert r.pending == 0  # the kernel took the SQE before the wait was interrupted
            t0 = time.monotonic()
            r.wait(1, timeout=0.2)
            assert time.monotonic() - t0 >= 0.15
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.timeout(60, method="thread")  # the test uses SIGALRM itself
def test_wait_with_timeout_ends_under_a_stream_of_signals(no_leaks, tcp_pair) -> None:
    """A signal handler that returns (a sampling profiler's timer, SIGCHLD) interrupts the wait
    with EINTR; retrying with the full timeout again would never end while signals keep
    coming faster than the timeout."""
    import signal
    import time

    _, s = tcp_pair
    ticks = 0

    def tick(_sig: int, _frame: object) -> None:
        nonlocal ticks
        ticks += 1
        if ticks > 1500:  # the failure guard against a wait that never ends: 30 s of signals
            raise _Interrupted

    old = signal.signal(signal.SIGALRM, tick)
    try:
        with Ring(4, flags=FAST) as r, Mapping.anonymous(4096) as m:
            prep_recv(r, s.fileno(), m.addr, 16, user_data=1)  # nothing will arrive
            r.submit()
            signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
            t0 = time.monotonic()
            r.wait(1, timeout=0.2)
            elapsed = time.monotonic() - t0
            signal.setitimer(signal.ITIMER_REAL, 0)
            # The lower bound is the timeout's contract (a clock cannot make it fail); how
            # soon after the timeout it returns is no test's business, the guard above only
            # catches a wait that never ends.
            assert elapsed >= 0.15
            assert ticks
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.timeout(60, method="thread")  # the test uses SIGALRM itself
@pytest.mark.parametrize("timeout", [None, 5.0])
def test_submit_and_wait_waits_on_after_a_signal(no_leaks, tcp_pair, timeout) -> None:
    """When a signal (handler returns) ends the wait of the enter that also submitted, the
    kernel returns the submit count with no completion; submit(wait_nr) must still return
    only with wait_nr completions ready (callers index reap()[0], count a burst as sent)."""
    import signal
    import threading

    c, s = tcp_pair
    old = signal.signal(signal.SIGALRM, lambda *_: None)
    sender = threading.Timer(0.3, c.sendall, (b"late",))
    try:
        with Ring(4, flags=FAST) as r, Mapping.anonymous(4096) as m:
            prep_recv(r, s.fileno(), m.addr, 16, user_data=1)
            sender.start()
            signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
            assert r.submit(1, timeout) == 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            got = r.reap()
            assert len(got) == 1 and int(got.res[0]) == 4
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sender.join()


def test_a_bad_prep_argument_leaves_no_sqe_behind(no_leaks) -> None:
    """The slot is taken only after the SQE is written: a failed prep submits nothing."""
    with Ring(4, flags=FAST) as r:
        with pytest.raises(struct.error):
            r.prep(u.IORING_OP_NOP, fd=1 << 40)
        assert r.pending == 0
        r.prep(u.IORING_OP_NOP, user_data=5)
        assert r.submit(1) == 1 and r.reap_one() == (5, 0, 0) and r.reap_one() is None


@pytest.mark.parametrize("bad", [{"fd": 1 << 40}, {"fd": -(1 << 31) - 1}, {"user_data": -1},
                                 {"user_data": 1 << 64}, {"flags": 256}, {"ioprio": 1 << 16},
                                 {"length": 1 << 32}, {"buf_index": -1}, {"addr": "0"}])
def test_every_out_of_range_prep_field_raises_the_same_error(no_leaks, bad) -> None:
    """Each backend refuses a value its SQE field cannot hold with the pure path's own error
    (the compiled prep hands such calls to it), and takes no slot."""
    with Ring(4, flags=FAST) as r:
        with pytest.raises(struct.error):
            r.prep(u.IORING_OP_NOP, **bad)
        with pytest.raises(struct.error):
            r.prep(256)
        assert r.pending == 0


def test_prep_fills_every_field_where_the_kernel_reads_it(no_leaks) -> None:
    """All twelve fields, positionally and by keyword, land at their uapi offsets (the
    compiled prep writes the SQE itself: its layout must be the pure path's)."""
    with Ring(4, flags=FAST) as r:
        slot = r.prep(u.IORING_OP_RECV, 7, 0x1122334455667788, 0x99AABBCC, 0xDEADBEEF00000001,
                      0xFEEDFACECAFEBEEF, flags=0x81, ioprio=0x1234, op_flags=0x55667788,
                      buf_index=0xABCD, file_index=0x01020304, addr3=0x0102030405060708)
        sqe = u.io_uring_sqe.from_buffer_copy(r._sqes[slot * 64:(slot + 1) * 64])
        assert (sqe.opcode, sqe.flags, sqe.ioprio, sqe.fd) == (u.IORING_OP_RECV, 0x81, 0x1234, 7)
        assert (sqe.off, sqe.addr, sqe.len) == (0xDEADBEEF00000001, 0x1122334455667788,
                                                0x99AABBCC)
        assert (sqe.rw_flags, sqe.user_data, sqe.buf_index) == (0x55667788,
                                                                 0xFEEDFACECAFEBEEF, 0xABCD)
        assert (sqe.splice_fd_in, sqe.addr3, sqe.personality) == (0x01020304,
                                                                  0x0102030405060708, 0)
        r.prep(u.IORING_OP_NOP, user_data=3)  # the previous SQE is never submitted: fd 7
        assert r.pending == 2


@pytest.mark.parametrize("ud", [np.arange(5, dtype=np.uint64) << np.uint64(40),
                                np.arange(5, dtype=np.int64), [7, 8, 9],
                                np.arange(10, dtype=np.uint64)[::2]])
def test_prep_batch_writes_what_prep_writes(no_leaks, ud) -> None:
    """A batch (wrapping the SQ end) holds byte for byte the SQEs ``prep`` writes one by one,
    whatever the user_data's dtype or layout (the compiled path takes contiguous uint64)."""
    fields = {"fd": 9, "addr": 0x1000, "length": 77, "flags": 4, "ioprio": 3, "op_flags": 2,
              "buf_index": 1}
    with Ring(8, flags=FAST) as r:
        for i in range(5):  # move the tail so the batch wraps
            r.prep(u.IORING_OP_NOP, user_data=i)
        r.submit(5)
        start = r._sqm[r._ktail_i]
        r.prep_batch(u.IORING_OP_NOP, ud, **fields)  # a NOP ignores the other fields
        n = len(ud)
        batch = [bytes(r._sqes[(start + i) % 8 * 64:][:64]) for i in range(n)]
        r.submit(n)
        for i, x in enumerate(ud):
            slot = r.prep(u.IORING_OP_NOP, fields["fd"], fields["addr"], fields["length"], 0,
                          int(x), flags=4, ioprio=3, op_flags=2, buf_index=1)
            assert bytes(r._sqes[slot * 64:(slot + 1) * 64]) == batch[i]
            r.submit()


def test_the_backend_asked_for_is_the_one_that_runs(request: pytest.FixtureRequest) -> None:
    backend = request.getfixturevalue("ring_backend")
    with Ring(4, flags=FAST) as r:
        assert r.backend == backend
        compiled = not hasattr(r.submit, "__func__")  # a builtin, not a bound Python method
        assert compiled == (backend == "c")


def test_a_subclass_override_is_not_shadowed_by_the_compiled_methods(no_leaks) -> None:
    calls: list[int] = []

    class Counting(Ring):
        def submit(self, wait_nr: int = 0, timeout: float | None = None) -> int:
            calls.append(wait_nr)
            return super().submit(wait_nr, timeout)

    with Counting(4, flags=FAST) as r:
        r.prep(u.IORING_OP_NOP, user_data=9)
        assert r.submit(1) == 1 and calls == [1] and r.reap_one() == (9, 0, 0)


@pytest.mark.parametrize(("name", "call"), [("prep", lambda r: r.prep(0, user_data=1)),
                                            ("submit", lambda r: r.submit(1)),
                                            ("submit", lambda r: r.wait(1, 0.01)),
                                            ("reap_one", lambda r: r.reap_one())])
def test_use_after_close_raises_the_same_closed_error(no_leaks, name, call) -> None:
    r = Ring(4, flags=FAST)
    r.prep(0)
    r.close()
    with pytest.raises(ClosedError) as ei:
        call(r)
    assert str(ei.value) == str(ClosedError.of(r, name))


def test_prep_on_a_full_sq_submits_to_make_room(no_leaks) -> None:
    with Ring(2, flags=FAST, cq_entries=8) as r:
        for i in range(5):
            r.prep(u.IORING_OP_NOP, user_data=i)
        r.submit(1)
        assert sorted(r.reap().user_data.tolist()) == [0, 1, 2, 3, 4]


def test_prep_batch_templates_follow_the_scalar_fields(no_leaks) -> None:
    """prep_batch caches its template while the scalars stay the same: switching opcode or fd
    and back must give each batch its own SQEs (NOP res 0, RECV on a bad fd -EBADF)."""
    with Ring(8, flags=FAST) as r:
        got: list[tuple[int, int]] = []
        for i, (op, fd) in enumerate([(u.IORING_OP_NOP, -1), (u.IORING_OP_RECV, 1_000_000),
                                      (u.IORING_OP_RECV, 1_000_001), (u.IORING_OP_NOP, -1)]):
            ud = np.arange(3, dtype=np.uint64) + 10 * i
            r.prep_batch(op, ud, fd=fd, addr=0, length=np.full(3, 16, np.uint32))
            r.submit(3)
            c = r.reap()
            got += list(zip(c.user_data.tolist(), c.res.tolist(), strict=True))
        want = [(10 * i + k, 0 if i in (0, 3) else -errno.EBADF) for i in range(4)
                for k in range(3)]
        assert sorted(got) == want


def test_reap_one_and_reap_take_cqes_in_order(no_leaks) -> None:
    with Ring(8, flags=FAST) as r:
        r.prep_batch(u.IORING_OP_NOP, np.arange(6, dtype=np.uint64))
        r.submit(6)
        assert r.reap_one() == (0, 0, 0)
        c = r.reap(max_n=3)
        assert len(c) == 3 and c.user_data.tolist() == [1, 2, 3]
        assert c.res.tolist() == [0, 0, 0] and c.flags.tolist() == [0, 0, 0] and c.extra is None
        assert r.reap().user_data.tolist() == [4, 5] and len(r.reap()) == 0


def test_buffer_ring_accounting_refuses_completions_out_of_step(no_leaks) -> None:
    """take/consumed_ids check the kernel's consumption against the ring order we published."""
    with Ring(4) as r, BufRing(r, 4, 8, 4096) as br:
        br.take(np.array([0, 1], dtype=np.uint16))
        with pytest.raises(RuntimeError, match="out of step"):
            br.take(np.array([3], dtype=np.uint16))
        assert br.consumed_ids(5000, 2) == [2, 3]
        with pytest.raises(RuntimeError, match="out of step"):
            br.consumed_ids(10, 7)
        with pytest.raises(RuntimeError, match="out of step"):
            br.take(np.arange(4, 9, dtype=np.uint16))  # more than the ring holds
        br.provide(np.array([1, 0, 3, 2], dtype=np.uint16))
        with pytest.raises(ValueError, match="double release"):
            br.provide(np.array([5], dtype=np.uint16))
        br.take(np.array([4], dtype=np.uint16))
        with pytest.raises(IndexError):
            br.provide(np.array([99], dtype=np.uint16))  # an id outside the ring
        assert br.in_ring == 7


def test_provide_few_writes_the_entries_provide_writes(no_leaks) -> None:
    """The list path for a few ids leaves the ring exactly as ``provide`` does (across the
    wrap), and refuses what ``provide`` refuses."""
    with Ring(4) as r, BufRing(r, 6, 8, 4096) as a, BufRing(r, 7, 8, 4096) as b:
        for br in (a, b):
            br.take(np.arange(0, 6, dtype=np.uint16))  # the tail is 8 (mask 7): next ones wrap
        a.provide(np.array([5, 2, 4], dtype=np.uint16))
        b.provide_few([5, 2, 4])
        a.provide(np.array([0, 1, 3], dtype=np.uint16))
        b.provide_few([0, 1, 3])
        assert a.in_ring == b.in_ring == 8 and a.tail == b.tail
        assert (a._bid.tolist(), a._len.tolist()) == (b._bid.tolist(), b._len.tolist())
        assert (a._addr - np.uint64(a.base)).tolist() == (b._addr - np.uint64(b.base)).tolist()
        with pytest.raises(ValueError, match="double release"):
            b.provide_few([0])
        b.take(np.array([6, 7, 5], dtype=np.uint16))
        with pytest.raises(IndexError):
            b.provide_few([99])  # an id outside the ring
        assert b.in_ring == 5
