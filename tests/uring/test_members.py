"""zcnet.uring.members: a shared ring's completions split by member, against CQEs a real ring
posted (NOPs with tagged user_data), so the layout is the kernel's."""

from __future__ import annotations

import numpy as np
import pytest

from zcnet.uapi import io_uring as u
from zcnet.uring.completions import Completions
from zcnet.uring.members import split_by_member
from zcnet.uring.ring import Ring


def posted(user_data: list[int], cqe32: bool = False) -> Completions:
    flags = u.IORING_SETUP_CQE32 if cqe32 else 0
    with Ring(64, flags=flags) as ring:
        for ud in user_data:
            ring.prep(u.IORING_OP_NOP, user_data=ud)
        ring.submit(len(user_data))
        return ring.reap()


@pytest.mark.parametrize("cqe32", [False, True])
def test_groups_keep_the_kernels_order_and_the_second_half(cqe32):
    uds = [3 << 8 | 1, 1 << 8 | 2, 3 << 8 | 2, 0 << 8 | 1, 1 << 8 | 1, 3 << 8 | 1]
    c = posted(uds, cqe32)
    groups = split_by_member(c, 8)
    assert [mid for mid, _ in groups] == [0, 1, 3]
    got = {mid: g.user_data.tolist() for mid, g in groups}
    assert got == {0: [1], 1: [2, 1], 3: [1, 2, 1]}  # local ids, each member's in order
    for _, g in groups:
        assert (g.res == 0).all()
        assert (g.extra is not None) == cqe32
    whole = dict(split_by_member(c, 8, local=False))
    assert whole[3].user_data.tolist() == [3 << 8 | 1, 3 << 8 | 2, 3 << 8 | 1]


def test_one_members_round_is_passed_through_whole():
    c = posted([5 << 8 | 1] * 4, cqe32=True)
    [(mid, g)] = split_by_member(c, 8, local=False)
    assert mid == 5 and g is c  # no copy: the raw CQEs stay for a compiled parse
    [(mid, g)] = split_by_member(c, 8)
    assert mid == 5 and g.user_data.tolist() == [1] * 4
    assert np.array_equal(g.extra, c.extra)


def test_nothing_reaped_is_no_group():
    with Ring(8) as ring:
        assert split_by_member(ring.reap(), 8) == []
