"""The few-completion fast paths of the ring and the buffer ring give what the general paths
give, and refuse what they refuse (every test on both ring backends)."""

from __future__ import annotations

import numpy as np
import pytest

from uring_backends import ring_backend  # noqa: F401  (autouse: every test on both paths)
from zcnet.errors import ClosedError
from zcnet.uapi import io_uring as u
from zcnet.uring.bufring import BufRing
from zcnet.uring.completions import Completions
from zcnet.uring.prep import prep_nop
from zcnet.uring.ring import Ring

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.mark.parametrize("flags", [0, u.IORING_SETUP_CQE32])
def test_tuples_are_the_fields_of_each_cqe(flags: int) -> None:
    with Ring(8, flags=flags) as r:
        for ud in (7, 1 << 63, 3):
            prep_nop(r, ud)
        r.submit(3)
        c = r.reap()
        want = list(zip(c.user_data.tolist(), c.res.tolist(), c.flags.tolist(), strict=True))
        assert c.tuples() == want and [t[0] for t in want] == [7, 1 << 63, 3]
        assert r.reap().tuples() == []


def test_tuples_of_completions_built_from_arrays() -> None:
    c = Completions(np.array([5, 6], np.uint64), np.array([-11, 4096], np.int32),
                    np.array([0, (9 << 16) | 3], np.uint32))
    assert c.tuples() == [(5, -11, 0), (6, 4096, (9 << 16) | 3)]


def test_one_buffer_completion_accounts_as_the_general_path() -> None:
    with Ring(4) as r, BufRing(r, 4, 4, 4096) as a, BufRing(r, 5, 4, 4096) as b:
        a.take(np.array([0], dtype=np.uint16))
        assert b.consumed_ids(4096, 0) == [0]  # a full buffer is still one buffer
        assert b.consumed_ids(1, 1) == [1]
        a.take(np.array([1], dtype=np.uint16))
        assert (a.head, a.in_ring) == (b.head, b.in_ring) == (2, 2)
        with pytest.raises(RuntimeError, match="expected bid 2, got 3"):
            b.consumed_ids(10, 3)
        assert (b.head, b.in_ring) == (2, 2)  # a refused completion retires nothing
        assert b.consumed_ids(4097, 2) == [2, 3]  # two buffers: the general path
        with pytest.raises(RuntimeError, match="1 buffers consumed, 0 were in the ring"):
            b.consumed_ids(10, 0)
        b.close()
        with pytest.raises(ClosedError):
            b.consumed_ids(10, 0)


def test_one_buffer_accounting_refuses_an_incremental_ring() -> None:
    with Ring(4) as r, BufRing(r, 4, 4, 4096, incremental=True) as br, \
            pytest.raises(ValueError, match="filled"):
        br.consumed_ids(10, 0)


def test_provide_few_refuses_a_negative_id_and_writes_nothing() -> None:
    with Ring(4) as r, BufRing(r, 4, 4, 4096) as br:
        br.take(np.array([0, 1], dtype=np.uint16))
        with pytest.raises(IndexError, match=r"outside 0\.\.3"):
            br.provide_few([-1])
        assert br.in_ring == 2 and br.tail == 4
        br.provide_few([1, 0])
        assert br._bid.tolist() == [1, 0, 2, 3] and br.in_ring == 4
        assert (br._addr - np.uint64(br.base)).tolist() == [4096, 0, 8192, 12288]


def test_batch_provide_and_take_on_a_ring_smaller_than_its_mapping() -> None:
    """A 4-entry ring sits in a whole page: entries go at ``tail & 3`` (not past the ring's
    end), for lists and arrays alike, with every field and the tail written; an id out of range
    and an out-of-step completion are refused and change nothing. On the "c" backend the
    batch writes and the in-step check are the compiled ones."""
    from zcnet.uring.syscall import backend

    with Ring(4) as r, BufRing(r, 4, 4, 4096) as br:
        assert (br.accel is not None) == (backend() == "c")
        br.take(np.array([0, 1, 2, 3], dtype=np.uint16))
        br.provide([2, 0])
        br.provide(np.array([3, 1], dtype=np.uint16))
        assert br._bid.tolist() == [2, 0, 3, 1] and br.in_ring == 4 and br.tail == 8
        assert (br._addr - np.uint64(br.base)).tolist() == [8192, 0, 12288, 4096]
        assert br._len.tolist() == [4096] * 4 and int(br._ktail[7]) == 8
        with pytest.raises(RuntimeError, match="out of step"):
            br.take(np.array([0], dtype=np.uint16))  # the next one in ring order is 2
        assert (br.head, br.in_ring) == (4, 4)
        br.take(np.array([2, 0], dtype=np.uint16))
        with pytest.raises(IndexError):
            br.provide([1, 7])
        assert br._bid.tolist() == [2, 0, 3, 1] and br.tail == 8 and br.in_ring == 2
        br.provide(np.array([0, 2], dtype=np.uint16))
        assert br._bid.tolist() == [0, 2, 3, 1] and int(br._ktail[7]) == 10


def _raw_cqes(entries: list[tuple[int, int, int]]) -> Completions:
    import struct

    raw = bytearray(16 * len(entries))
    for i, (ud, res, flags) in enumerate(entries):
        struct.pack_into("<QiI", raw, 16 * i, ud, res, flags)
    return Completions.from_raw(raw, len(entries), False)


def test_take_round_takes_only_the_common_round() -> None:
    """A round of one-buffer CQEs of our request, in ring order, the last with F_MORE: one C
    call checks and accounts it ("c" backend; None and nothing accounted on the pure path).
    Each way a round can differ (another request, a buffer out of order, more than a buffer's
    bytes, no F_MORE at the end, no buffer) returns None and accounts nothing."""
    from zcnet.rx.zc.accel import rx_accel_for
    from zcnet.rx.zc.soft_group import SOFT_RECORD
    from zcnet.uring.syscall import backend

    accel = rx_accel_for(backend())
    parse = None if accel is None else accel.soft_round

    def take(br: BufRing, c: Completions):  # type: ignore[no-untyped-def]
        got = br.take_round(c, 5, parse)
        if got is None:
            return None
        records, k, final = got
        return np.frombuffer(records, SOFT_RECORD, count=k), final

    more, buf = u.IORING_CQE_F_MORE, u.IORING_CQE_F_BUFFER
    shift = u.IORING_CQE_BUFFER_SHIFT

    def cqe(bid: int, res: int = 100, flags: int = more | buf, ud: int = 5):
        return (ud, res, flags | bid << shift)

    with Ring(4) as r, BufRing(r, 4, 8, 4096) as br:
        bad = {
            "another request": [cqe(0), cqe(1, ud=6)],
            "out of order": [cqe(1), cqe(0)],
            "over a buffer": [cqe(0), cqe(1, res=4097)],
            "ends with a buffer": [cqe(0), cqe(1, res=0)],
            "no buffer": [cqe(0), cqe(1, flags=more)],
            "error": [cqe(0), cqe(1, res=-5)],
        }
        for name, cqes in bad.items():
            assert take(br, _raw_cqes(cqes)) is None, name
            assert (br.head, br.in_ring) == (0, 8), name
        got = take(br, _raw_cqes([cqe(0, 4096), cqe(1, 1), cqe(2)]))
        if backend() != "c":
            assert got is None and (br.head, br.in_ring) == (0, 8)
            return
        assert got is not None and got[1] is None and (br.head, br.in_ring) == (3, 5)
        rec = got[0]
        assert rec["bid"].tolist() == [0, 1, 2] and rec["length"].tolist() == [4096, 1, 100]
        assert rec["offset"].tolist() == [0, 4096, 8192]
        # The multishot's end: data in its last buffer (final > 0), or none (EOF, -errno).
        got = take(br, _raw_cqes([cqe(3), cqe(4, res=7, flags=buf)]))
        assert got is not None and got[1] == 7 and got[0]["bid"].tolist() == [3, 4]
        got = take(br, _raw_cqes([cqe(5), (5, -105, 0)]))
        assert got is not None and got[1] == -105 and got[0]["bid"].tolist() == [5]
        assert (br.head, br.in_ring) == (6, 2)
        assert take(br, _raw_cqes([cqe(6)] * 3)) is None  # more than the ring holds
