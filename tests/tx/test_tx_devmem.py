"""devmem TX up to the device boundary on this host: the control message against the uapi byte
layout and against the kernel that parses it, the kernel's refusals (an unknown binding id, no
SO_ZEROCOPY) with nothing sent and no zero-copy id taken, ranges outside the dma-buf refused
before the call, and bind-tx refused by veth with the kernel's own answer. No device here has
netmem TX (and there is no udmabuf module): the end-to-end send is tests/tx/test_tx_devmem_vm.py."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.lab import Lab
from zcnet.netns import in_netns
from zcnet.nic import netdev
from zcnet.nic.device import Device, DeviceUnsupported
from zcnet.nic.nlattr import encode_attrs
from zcnet.tx.devmem import (
    DevmemError,
    DevmemMsg,
    DevmemSender,
    devmem_cmsg,
    egress_ifname,
    open_tx_dmabuf,
)
from zcnet.tx.senders import make_sender
from zcnet.tx.zerocopy import read_completions
from zcnet.uring.dmabuf import UDMABUF_DEV, Udmabuf

pytestmark = pytest.mark.usefixtures("no_leaks")

# From the 7.3 headers, written here rather than taken from zcnet.uapi, so a wrong constant there
# cannot agree with itself: asm-generic/socket.h, linux/socket.h.
K_SOL_SOCKET = 1
K_SCM_DEVMEM_DMABUF = 79
K_SO_ZEROCOPY = 60
K_MSG_ZEROCOPY = 0x4000000
# struct cmsghdr {size_t cmsg_len; int cmsg_level; int cmsg_type;} then the u32 id, padded to
# CMSG_SPACE(4) = 24; cmsg_len = CMSG_LEN(4) = 20.
CMSG = struct.Struct("=QiiI4x")
SIZE = 1 << 20
VETH_REFUSAL = "Driver does not support netmem TX"  # net/core/netdev-genl.c, bind-tx


class MemfdBuffer:
    """A memfd standing in for a dma-buf where the kernel refuses before it looks at the fd
    (bind-tx checks the device first), with a CPU view like Udmabuf's."""

    def __init__(self, size: int = SIZE) -> None:
        self.fd = os.memfd_create("not-a-dmabuf", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size)
        self.view = memoryview(self._map)

    def close(self) -> None:
        self.view.release()
        self._map.close()
        os.close(self.fd)


@pytest.fixture
def memfd_buf(no_leaks) -> Iterator[MemfdBuffer]:
    buf = MemfdBuffer()
    yield buf
    buf.close()


def _nothing_arrives(peer: socket.socket) -> None:
    assert not select.select([peer], [], [], 0.2)[0], "the peer received bytes"


def _next_zc_id(sock: socket.socket, peer: socket.socket) -> int:
    """The zero-copy id the socket hands out next: one plain MSG_ZEROCOPY send, its completion."""
    sock.send(b"x", K_MSG_ZEROCOPY)
    assert peer.recv(1) == b"x"
    for _ in range(50):
        ranges = read_completions(sock)
        if ranges:
            assert len(ranges) == 1 and len(ranges[0]) == 1
            return ranges[0].lo
        select.select([], [], [], 0.02)
    raise AssertionError("no completion for a plain MSG_ZEROCOPY send")


# --- the control message -------------------------------------------------------------------------

def test_cmsg_bytes_match_the_uapi_layout() -> None:
    assert devmem_cmsg(7) == CMSG.pack(20, K_SOL_SOCKET, K_SCM_DEVMEM_DMABUF, 7)
    assert devmem_cmsg(0xFFFFFFFF)[16:20] == b"\xff" * 4
    assert len(devmem_cmsg(1)) == socket.CMSG_SPACE(4)


def test_kernel_parses_the_control_message(tcp_pair) -> None:
    """The same bytes, from memory of this process, three times: with binding id 0 the kernel
    treats the send as plain MSG_ZEROCOPY (0 is "no dma-buf") and they arrive; with id 7 it
    looks the binding up and refuses (EINVAL); with a cmsg_len one word too long it refuses
    before any lookup. So the kernel read our level, type, length and id where we put them."""
    client, server = tcp_pair
    client.setsockopt(K_SOL_SOCKET, K_SO_ZEROCOPY, 1)
    payload = ctypes.create_string_buffer(b"devmem cmsg " * 10)
    addr, n = ctypes.addressof(payload), len(payload.raw)
    msg = DevmemMsg(7, SIZE)
    with pytest.raises(OSError) as ei:
        msg.sendmsg(client.fileno(), addr, n)
    assert ei.value.errno == errno.EINVAL
    _nothing_arrives(server)
    ctrl = msg._ctrl  # the message's own control bytes, rewritten in place
    ctypes.memmove(ctrl, CMSG.pack(24, K_SOL_SOCKET, K_SCM_DEVMEM_DMABUF, 0), 24)
    with pytest.raises(OSError) as ei:
        msg.sendmsg(client.fileno(), addr, n)
    assert ei.value.errno == errno.EINVAL
    ctypes.memmove(ctrl, devmem_cmsg(0), 24)
    assert msg.sendmsg(client.fileno(), addr, n) == n
    got = b""
    while len(got) < n:
        got += server.recv(n)
    assert got == payload.raw


def test_binding_id_zero_and_out_of_range_are_refused() -> None:
    for bad in (0, -1, 1 << 32):
        with pytest.raises(UsageError, match="out of range") as ei:
            DevmemMsg(bad, SIZE)
        assert ei.value.hint
    with pytest.raises(UsageError, match="must be an int"):
        DevmemMsg(True, SIZE)  # type: ignore[arg-type]


# --- the kernel's refusals: nothing sent, no id taken --------------------------------------------

def test_unknown_binding_id_sends_nothing_and_takes_no_id(tcp_pair) -> None:
    client, server = tcp_pair
    client.setsockopt(K_SOL_SOCKET, K_SO_ZEROCOPY, 1)
    with pytest.raises(DevmemError) as ei:
        DevmemMsg(12345, SIZE, "eth9").send(client, 0, 4096)
    assert ei.value.errno == errno.EINVAL
    assert "knows no TX binding 12345" in ei.value.message and "on eth9" in ei.value.message
    assert "bind-tx" in ei.value.hint
    _nothing_arrives(server)
    assert read_completions(client) == []
    assert _next_zc_id(client, server) == 0  # the refused call took none


def test_socket_without_zerocopy_is_named(tcp_pair) -> None:
    client, server = tcp_pair
    with pytest.raises(DevmemError, match="the socket has no SO_ZEROCOPY") as ei:
        DevmemMsg(3, SIZE).send(client, 0, 100)
    assert ei.value.errno == errno.EINVAL and "SO_ZEROCOPY=1" in ei.value.hint
    _nothing_arrives(server)


@pytest.mark.parametrize(("offset", "length"), [(SIZE, 1), (SIZE - 100, 200), (-4096, 100),
                                                (0, 0), (0, SIZE + 1)])
def test_range_outside_the_dmabuf_is_refused_before_the_kernel(tcp_pair, offset, length) -> None:
    """The kernel would send what lies before the end (tests/tx/test_tx_devmem_vm.py shows it):
    the range is checked first, so nothing at all is sent."""
    client, server = tcp_pair
    client.setsockopt(K_SOL_SOCKET, K_SO_ZEROCOPY, 1)
    with pytest.raises(UsageError, match=f"does not fit the {SIZE} B dma-buf"):
        DevmemMsg(12345, SIZE).send(client, offset, length)
    _nothing_arrives(server)
    assert _next_zc_id(client, server) == 0


# --- the sender's checks before it binds ---------------------------------------------------------

def test_sender_needs_a_dmabuf(tcp_pair) -> None:
    client, _ = tcp_pair
    with pytest.raises(UsageError, match="sends from a dma-buf, not bytearray") as ei:
        make_sender("devmem", client, bytearray(SIZE))
    assert "Udmabuf" in ei.value.hint
    r, w = os.pipe()
    try:
        pipe = type("Pipe", (), {"fd": r, "view": memoryview(bytearray(16))})()
        with pytest.raises(UsageError, match=f"dma-buf fd {r} cannot be used"):
            make_sender("devmem", client, pipe)
    finally:
        os.close(r)
        os.close(w)


def test_view_larger_than_the_dmabuf_is_refused(tcp_pair, memfd_buf) -> None:
    client, _ = tcp_pair
    big = type("Big", (), {"fd": memfd_buf.fd, "view": memoryview(bytearray(SIZE + 1))})()
    with pytest.raises(UsageError, match=f"the view holds {SIZE + 1} B, the dma-buf only"):
        make_sender("devmem", client, big)


def test_socket_bound_to_another_device_is_refused_and_left_as_it_was(tcp_pair, memfd_buf):
    client, server = tcp_pair
    client.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    timeo = client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)
    with pytest.raises(UsageError, match="the socket is bound to lo, the dma-buf would be bound "
                                         "to eth9"):
        DevmemSender(client, memfd_buf, ifname="eth9")
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16) == timeo
    _nothing_arrives(server)


def test_loopback_refuses_and_make_sender_does_not_fall_back(tcp_pair, memfd_buf) -> None:
    """Loopback cannot carry devmem (the kernel would have to copy): the error is lo's, there is
    no copy sender instead, and the socket keeps its device binding and send timeout."""
    client, server = tcp_pair
    assert egress_ifname(client) == "lo"
    timeo = client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)
    with pytest.raises(Unsupported) as ei:
        make_sender("devmem", client, memfd_buf)
    assert ei.value.message == f"device lo cannot send from a dma-buf ({VETH_REFUSAL})"
    assert "msgzc" in ei.value.hint
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, 16).strip(b"\0") == b""
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16) == timeo
    _nothing_arrives(server)


# --- bind-tx -------------------------------------------------------------------------------------

def test_bind_tx_request_encoding() -> None:
    """netdev bind-tx: ifindex (u32, id 1) and fd (u32, id 3), nothing else."""
    def nla(aid: int, value: int) -> bytes:
        return struct.pack("=HHI", 8, aid, value)

    assert encode_attrs(netdev.DMABUF, netdev.bind_tx_request(7, 9)) == nla(1, 7) + nla(3, 9)


@pytest.fixture
def lab_flow(no_leaks) -> Iterator[tuple[Lab, socket.socket, socket.socket]]:
    """A TCP connection from lab side a (the sender) to side b (after no_leaks: its check sees
    the lab gone)."""
    with ExitStack() as stack:
        lab = stack.enter_context(Lab())
        with in_netns(lab.ns_b):
            listener = stack.enter_context(socket.create_server((lab.addr_b, 0)))
        accepted: list[socket.socket] = []
        t = threading.Thread(target=lambda: accepted.append(listener.accept()[0]))
        t.start()
        with in_netns(lab.ns_a):
            client = stack.enter_context(
                socket.create_connection(listener.getsockname(), timeout=10))
        t.join(10)
        server = stack.enter_context(accepted[0])
        yield lab, client, server


@pytest.mark.root
def test_bind_tx_on_veth_is_the_kernels_refusal_in_one_line(lab_flow, memfd_buf) -> None:
    lab, _, _ = lab_flow
    with in_netns(lab.ns_a), Device.open(lab.if_a) as dev:
        assert netdev.has_op(dev, netdev.n.NETDEV_CMD_BIND_TX)
        for fd in (memfd_buf.fd, netdev.NO_FD):  # the device is asked before the fd
            with pytest.raises(DeviceUnsupported) as ei:
                netdev.bind_tx(dev, fd)
            assert ei.value.errno == errno.EOPNOTSUPP and ei.value.extack == VETH_REFUSAL
            assert "\n" not in str(ei.value)


@pytest.mark.root
def test_devmem_sender_on_veth_is_refused_with_nothing_sent(lab_flow, memfd_buf) -> None:
    lab, client, server = lab_flow
    with in_netns(lab.ns_a):
        assert egress_ifname(client) == lab.if_a
        with pytest.raises(Unsupported) as ei:
            make_sender("devmem", client, memfd_buf)
        assert ei.value.message == (f"device {lab.if_a} cannot send from a dma-buf "
                                    f"({VETH_REFUSAL})")
        # Without a dma-buf at all the device is still what is named, not the missing udmabuf.
        with pytest.raises(Unsupported, match=f"device {lab.if_a} cannot send from a dma-buf"):
            open_tx_dmabuf(client, SIZE)
    _nothing_arrives(server)
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, 16).strip(b"\0") == b""


# --- udmabuf on a host without it ---------------------------------------------------------------

def test_udmabuf_missing_or_bad_size_is_named() -> None:
    with pytest.raises(UsageError, match="must be positive"):
        Udmabuf(0)
    if os.path.exists(UDMABUF_DEV):
        pytest.skip(f"{UDMABUF_DEV} exists: tests/tx/test_tx_devmem_vm.py covers udmabuf")
    with pytest.raises(ZcnetError, match=f"{UDMABUF_DEV} does not exist") as ei:
        Udmabuf(SIZE)
    assert "modprobe udmabuf" in ei.value.hint  # and its memfd is closed (no_leaks)


# --- the bench ------------------------------------------------------------------------------------

@pytest.mark.root
def test_bench_tx_devmem_on_veth_is_the_devices_refusal(tmp_path) -> None:
    """The lab's veth cannot send from a dma-buf: the cell says so in one line, with the fix."""
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "zcnet", "bench", "--engine", "epoll", "--tx",
                        "devmem", "--mtu", "1500", "--placement", "same", "--duration", "0.3",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (cell,) = json.loads(out.read_text())["results"]
    assert cell["status"] == "error" and "\n" not in cell["reason"]
    assert cell["reason"].startswith("tx worker (send path devmem): device ")
    assert f"cannot send from a dma-buf ({VETH_REFUSAL})" in cell["reason"]
    assert "--tx msgzc" in cell["reason"]
