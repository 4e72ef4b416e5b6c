"""The uapi structs zero-copy receive uses (dma-buf, udmabuf, devmem cmsgs) against the running
kernel's BTF, and the ioctl numbers against their published values."""

from __future__ import annotations

import ctypes

import pytest

from btf import Btf
from zcnet.uapi import dmabuf, udmabuf
from zcnet.uapi import socket as usock

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

STRUCTS = (dmabuf.dma_buf_sync, udmabuf.udmabuf_create, usock.dmabuf_cmsg, usock.dmabuf_token)


@pytest.fixture(scope="module")
def btf() -> Btf:
    b = Btf.load()
    if b is None:
        pytest.skip("no BTF at /sys/kernel/btf/vmlinux or no bpftool")
    return b


@pytest.mark.parametrize("struct", STRUCTS, ids=lambda s: s.__name__)
def test_struct_layout_matches_btf(btf: Btf, struct: type[ctypes.Structure]) -> None:
    if ("STRUCT", struct.__name__) not in btf.by_name:
        pytest.skip(f"struct {struct.__name__} not in vmlinux BTF (module not built in)")
    size, members = btf.layout(struct.__name__)
    assert ctypes.sizeof(struct) == size
    for name, _ctype in struct._fields_:
        f = getattr(struct, name)
        assert members[name] == (f.offset, f.size), name


def test_ioctl_numbers():
    # linux/dma-buf.h and linux/udmabuf.h, as strace prints them.
    assert dmabuf.DMA_BUF_IOCTL_SYNC == 0x40086200
    assert udmabuf.UDMABUF_CREATE == 0x40187542
