"""devmem provider: cmsg parsing against the uapi byte layouts, SO_DEVMEM_DONTNEED batches
(accepted by this kernel), recvmsg(MSG_SOCK_DEVMEM) on a real socket, bind-rx encoding and the
kernel's answer on veth."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct

import pytest

from zcnet.errors import Unsupported
from zcnet.pattern import StreamPattern
from zcnet.rx.zc.devmem import (
    MAX_DONTNEED_FRAGS,
    MAX_DONTNEED_TOKENS,
    bind_rx,
    dontneed_batches,
    parse_cmsgs,
    recv_devmem,
)
from zcnet.rx.zc.provider import Delivery
from zcnet.uapi import socket as usock

# struct dmabuf_cmsg {__u64 frag_offset; __u32 frag_size; __u32 frag_token; __u32 dmabuf_id;
# __u32 flags;} -- packed by hand, independently of the ctypes definition the code uses.
DMABUF_CMSG = struct.Struct("=QIIII")
assert DMABUF_CMSG.size == ctypes.sizeof(usock.dmabuf_cmsg) == 24


def frag(off: int, size: int, token: int, binding: int = 5) -> tuple[int, int, bytes]:
    return (usock.SOL_SOCKET, usock.SCM_DEVMEM_DMABUF,
            DMABUF_CMSG.pack(off, size, token, binding, 0))


def linear(size: int) -> tuple[int, int, bytes]:
    return (usock.SOL_SOCKET, usock.SCM_DEVMEM_LINEAR, DMABUF_CMSG.pack(0, size, 0, 0, 0))


def test_dmabuf_cmsgs_become_fragments_in_order():
    out = Delivery()
    anc = [frag(1 << 33, 4096, 17), frag(8192, 1448, 18),
           (socket.SOL_SOCKET, socket.SCM_RIGHTS, b"\0" * 4)]  # foreign cmsg: ignored
    assert parse_cmsgs(anc, b"", out) == 0
    assert out.offsets == [1 << 33, 8192]  # 64-bit offsets survive
    assert out.lengths == [4096, 1448] and out.tokens == [17, 18] and not out.linear


def test_linear_cmsgs_take_bytes_from_the_iov_in_stream_order():
    out = Delivery()
    iov = bytearray(b"HEADERSmore")
    n = parse_cmsgs([linear(7), frag(0, 100, 1), linear(4)], memoryview(iov), out)
    iov[:] = b"X" * len(iov)  # the iov is reused by the next recvmsg: copies must not change
    assert n == 11
    assert out.lengths == [7, 100, 4] and out.tokens == [-1, 1, -1]
    assert out.linear == {0: b"HEADERS", 2: b"more"}


def test_short_cmsg_is_an_error():
    from zcnet.errors import ZcnetError

    with pytest.raises(ZcnetError, match="devmem cmsg of 8 bytes"):
        parse_cmsgs([(usock.SOL_SOCKET, usock.SCM_DEVMEM_DMABUF, b"\0" * 8)], b"", Delivery())


def _decode(arg: bytes) -> list[tuple[int, int]]:
    size = ctypes.sizeof(usock.dmabuf_token)
    assert len(arg) % size == 0
    return [(t.token_start, t.token_count) for t in
            (usock.dmabuf_token.from_buffer_copy(arg, i) for i in range(0, len(arg), size))]


def test_dontneed_runs_and_limits():
    assert [_decode(b) for b in dontneed_batches([5, 3, 4, 9, 10, 1])] == \
        [[(1, 1), (3, 3), (9, 2)]]
    many = dontneed_batches(list(range(2500)))  # one run, split by the 1024-token limit
    assert [_decode(b) for b in many] == [[(0, 1024)], [(1024, 1024)], [(2048, 452)]]
    sparse = dontneed_batches(list(range(0, 600, 2)))  # 300 runs of 1: 128 entries per call
    decoded = [_decode(b) for b in sparse]
    assert [len(d) for d in decoded] == [128, 128, 44]
    assert [s for d in decoded for s, _ in d] == list(range(0, 600, 2))
    for d in decoded + [_decode(b) for b in many]:
        assert len(d) <= MAX_DONTNEED_TOKENS and sum(c for _, c in d) <= MAX_DONTNEED_FRAGS


@pytest.fixture
def tcp_pair(no_leaks):
    with socket.create_server(("127.0.0.1", 0)) as srv:
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
    try:
        yield conn, cli
    finally:
        conn.close()
        cli.close()


def test_kernel_accepts_our_dontneed_batches(tcp_pair):
    """The kernel checks the array's size against its own limits: our largest batch passes
    (no token is held here, so none is freed), one entry more is EINVAL."""
    conn, _ = tcp_pair
    for arg in dontneed_batches(list(range(0, 4 * MAX_DONTNEED_TOKENS, 2))):
        conn.setsockopt(usock.SOL_SOCKET, usock.SO_DEVMEM_DONTNEED, arg)
    too_many = struct.pack("=II", 0, 1) * (MAX_DONTNEED_TOKENS + 1)
    with pytest.raises(OSError) as ei:
        conn.setsockopt(usock.SOL_SOCKET, usock.SO_DEVMEM_DONTNEED, too_many)
    assert ei.value.errno == errno.EINVAL


def test_recvmsg_devmem_on_host_memory_is_linear_and_intact(tcp_pair):
    """Without a bound queue every byte is host memory: delivered, flagged linear, in order."""
    conn, cli = tcp_pair
    pat = StreamPattern(seed=9)
    total = 100_000  # fits the socket buffers: sendall returns before we read
    cli.sendall(pat.expected(0, total))
    cli.close()
    conn.setblocking(False)
    iov = memoryview(bytearray(1 << 16))
    out = Delivery()
    lin = 0
    while out.end is None:
        lin += recv_devmem(conn, iov, out, max_calls=4)
    assert out.end == 0 and lin == total == sum(out.lengths)
    data = b"".join(out.linear[i] for i in sorted(out.linear))
    assert data == pat.expected(0, total).tobytes()
    assert set(out.tokens) == {-1}


def test_bind_rx_request_encoding():
    """netdev bind-rx: ifindex (u32, id 1), fd (u32, id 3), one nested queues (id 2, with
    NLA_F_NESTED) per queue holding id (1) and type rx=0 (3)."""
    from zcnet.nic import netdev
    from zcnet.nic.nlattr import encode_attrs

    def nla(aid: int, payload: bytes) -> bytes:
        raw = struct.pack("=HH", 4 + len(payload), aid) + payload
        return raw + b"\0" * (-len(raw) % 4)

    u32 = struct.Struct("=I").pack
    queue = lambda q: nla(2 | 0x8000, nla(1, u32(q)) + nla(3, u32(0)))  # noqa: E731
    want = nla(1, u32(7)) + nla(3, u32(9)) + queue(2) + queue(3)
    assert encode_attrs(netdev.DMABUF, netdev.bind_rx_request(7, 9, [2, 3])) == want


@pytest.mark.root
def test_bind_rx_on_veth_names_the_missing_capability(no_leaks):
    from zcnet.lab import Lab
    from zcnet.lab.netns import in_netns

    fd = os.memfd_create("not-a-dmabuf", os.MFD_CLOEXEC)
    try:
        with Lab() as lab, in_netns(lab.ns_a), pytest.raises(Unsupported) as ei:
            bind_rx(lab.if_a, fd, [0])
    finally:
        os.close(fd)
    assert "cannot bind a dma-buf to queue(s) [0]" in ei.value.message
    assert "queue management ops" in ei.value.message


@pytest.mark.root
def test_devmem_without_dmabuf_still_names_the_device_problem(no_leaks):
    """No dma-buf here, but the device is asked first (fd -1 fails only after the device
    checks), so the error is about veth, not about the missing udmabuf."""
    from zcnet.lab import Lab
    from zcnet.lab.netns import in_netns
    from zcnet.rx.zc.devmem import open_devmem

    if os.path.exists("/dev/udmabuf"):
        pytest.skip("udmabuf exists: the dma-buf is created before binding")
    with Lab() as lab, in_netns(lab.ns_a), pytest.raises(Unsupported) as ei:
        ifname = lab.if_a
        open_devmem(-1, 1 << 20, ifname=ifname, queue=0)
    assert f"device {ifname} cannot bind a dma-buf" in ei.value.message
