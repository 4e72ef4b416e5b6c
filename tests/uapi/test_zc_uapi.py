"""The uapi zero-copy receive and devmem TX use: structs (dma-buf, udmabuf, devmem cmsgs, the
sendmsg headers) and bind-tx's netdev enums against the running kernel's BTF (the vm variant
against a 7.x kernel's), socket constants and ioctl numbers against their published values."""

from __future__ import annotations

import ctypes

import pytest

from btf import Btf
from zcnet.uapi import dmabuf, udmabuf
from zcnet.uapi import netdev as unetdev
from zcnet.uapi import socket as usock

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

STRUCTS = (dmabuf.dma_buf_sync, udmabuf.udmabuf_create, usock.dmabuf_cmsg, usock.dmabuf_token,
           usock.iovec, usock.user_msghdr, usock.mmsghdr, usock.cmsghdr)
# What devmem TX sends with: bind-tx and the attributes of its request and reply.
DEVMEM_TX_ENUMS = ("NETDEV_CMD_BIND_TX", "NETDEV_A_DMABUF_IFINDEX", "NETDEV_A_DMABUF_FD",
                   "NETDEV_A_DMABUF_ID")


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


def test_socket_constants_as_in_the_headers():
    # asm-generic/socket.h and linux/socket.h of Linux 7.3, as published; the host kernel's
    # parsing of SCM_DEVMEM_DMABUF is shown in tests/tx/test_tx_devmem.py.
    assert (usock.SO_DEVMEM_LINEAR, usock.SCM_DEVMEM_LINEAR) == (78, 78)
    assert (usock.SO_DEVMEM_DMABUF, usock.SCM_DEVMEM_DMABUF) == (79, 79)
    assert usock.SO_DEVMEM_DONTNEED == 80
    assert (usock.SO_ZEROCOPY, usock.MSG_ZEROCOPY, usock.MSG_SOCK_DEVMEM) == (60, 0x4000000,
                                                                               0x2000000)


def _devmem_tx_enums(btf: Btf) -> dict[str, tuple[int, int | None]]:
    return {k: (getattr(unetdev, k), btf.enums.get(k)) for k in DEVMEM_TX_ENUMS}


def test_devmem_tx_netdev_enums_match_btf(btf: Btf) -> None:
    """bind-tx and its attributes, as this kernel (6.18 here) numbers them."""
    assert all(ours == theirs for ours, theirs in _devmem_tx_enums(btf).values()), \
        _devmem_tx_enums(btf)


@pytest.mark.vm
def test_devmem_tx_netdev_enums_match_a_7x_btf(btf: Btf) -> None:
    if "ZCRX_REG_NODEV" not in btf.enums:
        pytest.skip("this kernel is older than the 7.x headers; run under `zcnet vm run`")
    assert all(ours == theirs for ours, theirs in _devmem_tx_enums(btf).values()), \
        _devmem_tx_enums(btf)
