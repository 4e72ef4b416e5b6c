"""What a Ring refuses or survives on both hot paths: SQPOLL (its design submits from its own
enter), a wait count that only fits once narrowed, 128-byte SQEs (no stale upper half), a
max_n too big for C, and a user_data buffer whose ``__buffer__`` closes the ring (3.12+)."""

from __future__ import annotations

import array
import sys

import numpy as np
import pytest

from uring_backends import ring_backend  # noqa: F401  (autouse: both hot paths)
from zcnet.errors import ClosedError, UsageError
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring


def test_sqpoll_is_refused_with_the_fix() -> None:
    with pytest.raises(UsageError, match="IORING_SETUP_SQPOLL is not supported") as e:
        Ring(8, flags=u.IORING_SETUP_SQPOLL)
    assert "drop the flag" in str(e.value)


@pytest.mark.parametrize("wait_nr", [-1, -(2**32) + 1, 2**32])
def test_a_wait_count_out_of_range_is_a_usage_error(wait_nr: int) -> None:
    with Ring(8) as r:
        r.prep(u.IORING_OP_NOP, user_data=1)
        with pytest.raises(UsageError, match=f"wait_nr={wait_nr} is not a count"):
            r.submit(wait_nr)
        assert r.submit(1) == 1 and r.reap_one() == (1, 0, 0)  # the SQE was kept


def test_128_byte_sqes_are_written_whole() -> None:
    with Ring(8, flags=u.IORING_SETUP_SQE128) as r:
        r._sqes[:] = b"\xab" * len(r._sqes)  # what an earlier 128-byte command leaves
        r.prep(u.IORING_OP_NOP, user_data=5)
        r.prep_batch(u.IORING_OP_NOP, np.array([6, 7], dtype=np.uint64))
        sqes = bytes(r._sqes[:3 * 128])
        assert all(sqes[i * 128 + 64:(i + 1) * 128] == bytes(64) for i in range(3))
        assert r.submit(3) == 3
        assert sorted(ud for ud, _, _ in (r.reap_one() for _ in range(3))) == [5, 6, 7]


def test_reap_with_a_limit_too_big_for_c_takes_everything_ready() -> None:
    with Ring(8) as r:
        r.prep(u.IORING_OP_NOP, user_data=9)
        r.submit(1)
        c = r.reap(2**70)
        assert len(c) == 1 and r.cq_ready() == 0


@pytest.mark.skipif(sys.version_info < (3, 12), reason="__buffer__ in Python needs 3.12")
def test_a_buffer_that_closes_the_ring_gets_closed_error() -> None:
    r = Ring(8)

    class ClosingIds:
        def __buffer__(self, flags: int) -> memoryview:
            r.close()
            return memoryview(array.array("Q", [7]))

    with pytest.raises(ClosedError):
        r.prep_batch(u.IORING_OP_NOP, ClosingIds())
