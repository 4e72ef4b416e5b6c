"""Rings with CQEs of 16 and 32 bytes (IORING_SETUP_CQE_MIXED, Linux 6.18), on the real kernel:
a NOP with IORING_NOP_CQE32 posts a 32-byte CQE (its second half carries the SQE's addr), so
every case of the mixed CQ (small, big, the pad before the wrap) is made on demand. Both hot
paths (tests/uring_backends.py): the compiled Core widens in C, the Python ring in
zcnet.uring.mixed."""

from __future__ import annotations

import ctypes
import errno
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uring_backends import ring_backend  # noqa: F401  (autouse: both hot paths)
from zcnet.errors import Unsupported, UsageError
from zcnet.uapi import io_uring as u
from zcnet.uring import mixed, syscall
from zcnet.uring.ring import Ring

MIXED = u.IORING_SETUP_CQE_MIXED


def _mixed_ring(cq_entries: int = 8) -> Ring:
    try:
        return Ring(8, flags=MIXED, cq_entries=cq_entries)
    except Unsupported as e:  # before 6.18: the refusal is tested below
        pytest.skip(e.message)


def _nop(ring: Ring, ud: int, big: bool) -> None:
    ring.prep(u.IORING_OP_NOP, addr=0xA0000 + ud, user_data=ud,
              op_flags=u.IORING_NOP_CQE32 if big else 0)


def _slot_flags(ring: Ring) -> list[int]:
    raw = bytes(ring._cqes)  # what the kernel wrote, before a reap hands the slots back
    return [struct.unpack_from("<I", raw, i * 16 + 12)[0] for i in range(ring.cq_entries)]


def test_a_reap_widens_each_cqe_to_32_bytes_in_order() -> None:
    with _mixed_ring() as r:
        assert r.cqe_mixed and not r.cqe32
        for ud, big in ((1, False), (2, True), (3, False), (4, True)):
            _nop(r, ud, big)
        r.submit(4)
        assert r.cq_ready() == 6  # slots: a big CQE takes two
        c = r.reap()
        assert len(c) == 4 and c.cqe_size == 32 and len(c.raw) == 4 * 32
        assert c.user_data.tolist() == [1, 2, 3, 4]
        assert c.res.tolist() == [0, 0, 0, 0]
        big = (c.flags & u.IORING_CQE_F_32) != 0
        assert big.tolist() == [False, True, False, True]
        # a small CQE's second half is zero; a big one's is the kernel's (the NOP's addr)
        assert c.extra[~big].tolist() == [[0, 0], [0, 0]]
        assert c.extra[big, 1].tolist() == [0xA0002, 0xA0004]
        assert r.cq_ready() == 0 and r.reap_one() is None


def test_the_pad_before_the_wrap_is_stepped_over() -> None:
    with _mixed_ring(8) as r:
        for ud in range(1, 8):  # seven small CQEs: slots 0-6
            _nop(r, ud, False)
        r.submit(7)
        assert r.reap().user_data.tolist() == list(range(1, 8))
        _nop(r, 8, True)       # one slot before the wrap: the kernel pads it, then slots 0-1
        _nop(r, 9, False)
        r.submit(2)
        flags = _slot_flags(r)
        assert flags[7] & u.IORING_CQE_F_SKIP and flags[0] & u.IORING_CQE_F_32
        assert r.cq_ready() == 4
        c = r.reap()
        assert c.user_data.tolist() == [8, 9]
        assert c.extra[0, 1] == 0xA0008 and c.extra[1].tolist() == [0, 0]
        assert r.cq_ready() == 0


def test_reap_one_and_reap_max_n_count_entries_not_slots() -> None:
    with _mixed_ring(8) as r:
        for ud in range(1, 8):
            _nop(r, ud, False)
        r.submit(7)
        r.reap()
        _nop(r, 8, True)  # pad at slot 7, big at 0-1
        _nop(r, 9, True)  # 2-3
        _nop(r, 10, False)
        r.submit(3)
        one = r.reap_one()
        assert one is not None and one[0] == 8 and one[2] & u.IORING_CQE_F_32
        assert r.cq_ready() == 3  # the pad and both halves of 8 went back
        c = r.reap(1)
        assert c.user_data.tolist() == [9] and c.extra[0, 1] == 0xA0009
        assert r.reap_one() == (10, 0, 0)
        assert r.reap_one() is None and len(r.reap(0)) == 0


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5)), min_size=1, max_size=60),
       st.integers(0, 6))
def test_any_mix_of_sizes_and_batches_comes_out_whole(sizes: list[tuple[bool, int]],
                                                      take: int) -> None:
    """Posted in rounds of ``k`` NOPs, reaped in batches of ``take`` (0: all at once, or
    reap_one): every CQE once, in order, with its own second half, across many wraps."""
    with _mixed_ring(16) as r:
        posted: list[tuple[int, bool]] = []
        got: list[tuple[int, int]] = []
        ud = 0
        for big, k in sizes:
            for _ in range(k):
                ud += 1
                _nop(r, ud, big)
                posted.append((ud, big))
            r.submit(k)
            while r.cq_ready():
                if take == 1:
                    one = r.reap_one()
                    assert one is not None
                    got.append((one[0], one[2] & u.IORING_CQE_F_32))
                    continue
                c = r.reap(take or None)
                assert len(c) >= 1
                for d, fl, ex in zip(c.user_data.tolist(), c.flags.tolist(),
                                     c.extra[:, 1].tolist(), strict=True):
                    assert ex == (0xA0000 + d if fl & u.IORING_CQE_F_32 else 0)
                    got.append((d, fl & u.IORING_CQE_F_32))
        assert [d for d, _ in got] == [d for d, _ in posted]
        assert [bool(f) for _, f in got] == [b for _, b in posted]
        assert not r.cq_overflow


def test_compiled_readers_of_fixed_cqes_are_refused_the_cq() -> None:
    with _mixed_ring() as r, pytest.raises(UsageError, match="CQE_MIXED") as e:
        r.cq_addresses()
    assert "reap()" in (e.value.hint or "")


def test_cqe32_and_mixed_together_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match="both given"):
        Ring(8, flags=MIXED | u.IORING_SETUP_CQE32)


def test_a_kernel_without_mixed_cqes_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 6.18 io_uring_setup says EINVAL to the flag; the error names the version."""
    def einval(*args: object) -> int:
        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(syscall, "_syscall", einval)
    with pytest.raises(Unsupported, match="CQE_MIXED") as e:
        Ring(8, flags=MIXED)
    assert "6.18" in (e.value.hint or "")
    with pytest.raises(OSError):  # without the flag, the kernel's own error stays
        Ring(8)


def test_widen_stops_before_half_an_entry() -> None:
    """A 32-byte entry whose second slot is not ready yet is left for the next reap (the
    kernel publishes both halves at once; a reader must still not run past the tail)."""
    cq = bytearray(4 * 16)
    struct.pack_into("<QiI", cq, 0, 7, 1, 0)
    struct.pack_into("<QiI", cq, 16, 0, 0, u.IORING_CQE_F_SKIP)
    struct.pack_into("<QiI", cq, 32, 8, 2, u.IORING_CQE_F_32)
    raw, n, used = mixed.widen(memoryview(cq), 0, 3, 3)
    assert (n, used, len(raw)) == (1, 2, 32)  # entry 7, then the pad; 8 waits
    raw, n, used = mixed.widen(memoryview(cq), 2, 2, 3)
    assert (n, used) == (1, 2) and struct.unpack_from("<QiI", raw) == (8, 2, u.IORING_CQE_F_32)
