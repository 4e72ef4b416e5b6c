"""Added zcrx areas up to the kernel boundary (the host's 6.18 has no ZCRX_CTRL_ADD_AREA; the
VM test registers them for real): an area with room to grow maps more memory right after its
end and gives it back, the refill ring gives added areas' tokens back as the kernel wrote them
(C and numpy paths) and reads their offsets through its table, and a kernel without ADD_AREA
is refused naming the version."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from zcnet.errors import Unsupported, UsageError
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.rx.zc.zcrx_areas import ADD_AREA_SINCE, add_area
from zcnet.rx.zc.zcrx_reg import kernel_offers
from zcnet.rx.zc.zcrx_rings import OFF_MASK, RefillRing

SHIFT = 48


def test_an_area_grows_into_its_reserved_range_and_gives_it_back(no_leaks) -> None:
    a = Area(4 * PAGE_SIZE, capacity=64 * PAGE_SIZE)
    try:
        assert (a.size, a.capacity) == (4 * PAGE_SIZE, 64 * PAGE_SIZE)
        a.array[: a.size] = 1
        at = a.grow(8 * PAGE_SIZE)
        assert at == 4 * PAGE_SIZE and a.size == 12 * PAGE_SIZE
        a.array[at:a.size] = 2  # the new memory is writable through the views made before
        assert bytes(a.view[at - 1:at + 1]) == b"\x01\x02"
        a.ungrow(at)
        assert a.size == at
        assert a.grow(PAGE_SIZE) == at  # the same place again
    finally:
        a.close()


@pytest.mark.parametrize("extra,match", [(0, "positive multiple"), (100, "positive multiple"),
                                         (61 * PAGE_SIZE, "do not fit")])
def test_a_bad_growth_names_the_problem(extra: int, match: str, no_leaks) -> None:
    with Area(4 * PAGE_SIZE, capacity=64 * PAGE_SIZE) as a:
        with pytest.raises(UsageError, match=match):
            a.grow(extra)
        assert a.size == 4 * PAGE_SIZE


def test_only_a_plain_area_with_a_capacity_grows(no_leaks) -> None:
    with Area(4 * PAGE_SIZE) as a, pytest.raises(UsageError, match="without a capacity"):
        a.grow(PAGE_SIZE)
    with pytest.raises(UsageError, match="below its size"):
        Area(8 * PAGE_SIZE, capacity=4 * PAGE_SIZE)
    with pytest.raises(UsageError, match="normal pages"):
        Area(4 * PAGE_SIZE, capacity=8 * PAGE_SIZE, hugetlb=True)


@pytest.mark.parametrize("accel", [True, False], ids=["c", "numpy"])
def test_the_refill_ring_keeps_the_area_a_token_names(accel: bool) -> None:
    entries = 8
    mem = np.zeros(64 + entries * 16, np.uint8)  # head at 0, tail at 4, entries at 64
    rq = RefillRing(mem, 0, 4, 64, entries, area_token=0)
    if not accel:
        rq.accel = None
    elif rq.accel is None:
        pytest.skip("the compiled rx accelerator is not built")
    first = [3 * PAGE_SIZE]
    assert rq.push(first, [100]) == 1
    rq.add_area(1, 16 * PAGE_SIZE)
    rq.add_area(3, 40 * PAGE_SIZE)  # ids need not be dense
    toks = [(1 << SHIFT) | PAGE_SIZE, 2 * PAGE_SIZE, (3 << SHIFT) | 5 * PAGE_SIZE]
    assert rq.push(toks, [10, 20, 30]) == 3
    rqes = mem[64:].view(np.uint64).reshape(entries, 2)[:, 0]
    assert rqes[:4].tolist() == first + toks  # as the kernel wrote them
    assert int(mem[4:8].view(np.uint32)[0]) == 4  # the tail
    assert rq.virtual(toks) == [17 * PAGE_SIZE, 2 * PAGE_SIZE, 45 * PAGE_SIZE]
    arr = rq.virtual(np.array(toks, np.uint64))
    assert isinstance(arr, np.ndarray) and arr.tolist() == [17 * PAGE_SIZE, 2 * PAGE_SIZE,
                                                            45 * PAGE_SIZE]


def test_one_area_keeps_the_masked_push() -> None:
    mem = np.zeros(64 + 8 * 16, np.uint8)
    rq = RefillRing(mem, 0, 4, 64, 8, area_token=0)
    assert rq.area_starts is None and rq.push_mask == OFF_MASK


def test_a_kernel_without_add_area_is_refused_naming_the_version() -> None:
    if kernel_offers().add_area:
        pytest.skip("this kernel has ZCRX_CTRL_ADD_AREA (the VM test covers it)")
    zq = types.SimpleNamespace(closed=False, owner_tid=threading.get_ident(),
                               where="copy mode")
    with pytest.raises(Unsupported, match=rf"ZCRX_CTRL_ADD_AREA, Linux {ADD_AREA_SINCE}\+"):
        add_area(zq, PAGE_SIZE)  # type: ignore[arg-type]
