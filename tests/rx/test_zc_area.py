"""Registered areas: anonymous, 2 MiB hugetlb (and the fallback), udmabuf-backed dma-buf."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from zc_helpers import mapped
from zcnet.errors import UsageError
from zcnet.rx.zc.area import HUGE_2MB, PAGE_SIZE, Area

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


def huge_pages_in(addr: int) -> bool:
    """Whether the mapping holding ``addr`` is hugetlb, from /proc/self/smaps (KernelPageSize).
    Anonymous neighbours may be merged into one VMA, so look for the range containing it."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        with contextlib.suppress(ValueError, IndexError):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                for follow in lines[i + 1:i + 30]:
                    if follow.startswith("KernelPageSize:"):
                        return int(follow.split()[1]) == 2048
    raise AssertionError(f"mapping {addr:#x} not in smaps")


def test_anonymous_area_is_page_aligned_and_writable(no_leaks):
    with Area(10_000) as a:
        assert a.kind == "anon" and a.size == 3 * PAGE_SIZE and a.addr % PAGE_SIZE == 0
        a.view[:5] = b"hello"
        assert bytes(a.array[:5]) == b"hello"
        assert not huge_pages_in(a.addr)
    assert a.closed


def test_area_outlives_close_while_views_exist(no_leaks):
    a = Area(PAGE_SIZE)
    piece = a.view[0:10]
    piece[:3] = b"abc"
    assert a.close() is False  # still mapped: the slice would otherwise point at nothing
    assert bytes(piece[:3]) == b"abc"
    del piece


@pytest.mark.parametrize("kind", ["memoryview", "numpy"])
def test_area_is_unmapped_when_its_last_view_dies(no_leaks, kind):
    a = Area(4 * PAGE_SIZE)
    addr = a.addr
    piece = a.view[PAGE_SIZE:PAGE_SIZE + 10] if kind == "memoryview" else a.array[5:9]
    assert a.close() is False and a.closed and mapped(addr)
    piece[0] = 1
    assert piece[0] == 1
    del piece
    assert not mapped(addr)
    with Area(PAGE_SIZE) as b:  # no view outlives the area: close unmaps at once
        addr = b.addr
        assert mapped(addr)
    assert not mapped(addr)


def test_bad_size():
    for bad in (0, -4096):
        with pytest.raises(UsageError, match=f"area size must be positive, got {bad}$"):
            Area(bad)
    # zcnet.aio's shared receivers make their Area directly: a wrong type is named here too.
    for bad in ("1M", 4096.0, True, None):
        with pytest.raises(UsageError) as ei:
            Area(bad)  # type: ignore[arg-type]
        assert ei.value.message == f"area size must be an int, got {type(bad).__name__} {bad!r}"
        assert "64 << 20" in ei.value.hint


@pytest.fixture
def hugepages():
    """Two free 2 MiB pages for the test, the system's setting restored afterwards."""
    before = NR_HUGEPAGES.read_text().strip()
    try:
        NR_HUGEPAGES.write_text(str(int(before) + 2))
    except OSError as e:
        pytest.skip(f"cannot reserve hugetlb pages: {e}")
    try:
        yield
    finally:
        NR_HUGEPAGES.write_text(before)


@pytest.mark.root
def test_hugetlb_area_uses_2mib_pages(no_leaks, hugepages):
    with Area(3 << 20, hugetlb=True) as a:
        if a.kind != "hugetlb":
            pytest.skip("the kernel could not assemble two free 2 MiB pages")
        assert a.size == 2 * HUGE_2MB and a.addr % HUGE_2MB == 0
        a.array[:] = 7
        assert huge_pages_in(a.addr)


def test_hugetlb_falls_back_with_a_warning(no_leaks):
    if int(Path("/proc/meminfo").read_text().split("HugePages_Free:")[1].split()[0]) >= 64:
        pytest.skip("hugetlb pages are free here, so there is nothing to fall back from")
    with pytest.warns(RuntimeWarning, match="no 2 MiB hugetlb pages") as w, \
            Area(128 << 20, hugetlb=True) as a:
        assert a.kind == "anon" and a.size == 128 << 20
    assert "nr_hugepages" in str(w[0].message)


@pytest.fixture
def udmabuf():
    if not os.path.exists("/dev/udmabuf"):
        try:
            r = subprocess.run(["modprobe", "udmabuf"], capture_output=True, text=True,
                               check=False)
            why = r.stderr.strip() or f"exit {r.returncode}"
        except FileNotFoundError:
            why = "modprobe is not installed"
        if not os.path.exists("/dev/udmabuf"):
            pytest.skip(f"no /dev/udmabuf and modprobe udmabuf failed: {why}")


def test_udmabuf_area(no_leaks, udmabuf):
    with Area.udmabuf(1 << 20) as a:
        assert a.kind == "udmabuf" and a.dmabuf_fd is not None and a.size == 1 << 20
        a.sync(start=True)
        a.array[:4096] = np.arange(4096) % 251
        a.sync(start=False)
        assert int(a.array[300]) == 300 % 251


def test_missing_udmabuf_is_a_clear_error(no_leaks):
    if os.path.exists("/dev/udmabuf"):
        pytest.skip("/dev/udmabuf exists here")
    from zcnet.errors import ZcnetError

    with pytest.raises(ZcnetError, match="/dev/udmabuf does not exist"):
        Area.udmabuf(1 << 20)
