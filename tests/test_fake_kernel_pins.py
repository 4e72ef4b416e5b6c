"""The fake zcrx kernel's per-kernel layout table is each listed kernel's own, from its BTF.

``fake_zcrx_kernel.KERNEL_LAYOUTS`` says what IORING_REGISTER_ZCRX_IFQ returns in ``offsets``
on each kernel zcnet was run on; the provider is tested against every entry. The vm test checks
only the kernel it boots, so an entry for another kernel could drift unseen. Here each entry is
derived from that kernel's own types: the kernel fills the offsets as ``offsetof`` the refill
ring header's head and tail, and the entries at the header's size aligned to the cache line
(io_uring/zcrx.c, io_fill_zcrx_offsets; the header is ``struct zcrx_rq_hdr`` from 7.3, the
plain ``struct io_uring`` before). The kernels come from the vm cache, fetched when missing."""

from __future__ import annotations

import shutil

import pytest

from btf import Btf
from fake_zcrx_kernel import KERNEL_LAYOUTS
from zcnet.vm.archive import ArchiveUnreachable, NoSuchKernel, fetch

L1_CACHE_BYTES = 64  # x86_64


@pytest.mark.slow
@pytest.mark.parametrize("release", list(KERNEL_LAYOUTS))
def test_each_listed_layout_is_that_kernels_own(release: str) -> None:
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool is missing (apt-get install bpftool)")
    try:
        kernel, _ = fetch(release)
    except (ArchiveUnreachable, NoSuchKernel) as e:
        pytest.skip(f"kernel {release} cannot be fetched, so its layout is not pinned: {e}")
    btf = Btf.load(kernel.path / "vmlinux")
    assert btf is not None, f"no vmlinux with BTF in {kernel.path}"
    hdr = "zcrx_rq_hdr" if ("STRUCT", "zcrx_rq_hdr") in btf.by_name else "io_uring"
    size, members = btf.layout(hdr)
    rqes = -(-size // L1_CACHE_BYTES) * L1_CACHE_BYTES
    assert KERNEL_LAYOUTS[release] == (members["head"][0], members["tail"][0], rqes), hdr
