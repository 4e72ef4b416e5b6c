"""devmem provider: cmsg parsing against the uapi byte layouts, SO_DEVMEM_DONTNEED batches
(accepted by this kernel), recvmsg(MSG_SOCK_DEVMEM) on a real socket, bind-rx encoding and the
kernel's answer on veth."""

from __future__ import annotations

import ctypes
import errno
import heapq
import mmap
import os
import random
import socket
import struct
import threading

import numpy as np
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

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

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


# --- a Receiver over the real DevmemProvider ------------------------------------------------------
#
# Numbers from asm-generic/socket.h and linux/socket.h, written here rather than taken from
# zcnet.uapi, so a wrong constant there cannot agree with itself.
K_SOL_SOCKET = 1
K_SCM_DEVMEM_LINEAR = 78
K_SCM_DEVMEM_DMABUF = 79
K_SO_DEVMEM_DONTNEED = 80
K_MSG_SOCK_DEVMEM = 0x2000000
DMABUF_TOKEN = struct.Struct("=II")  # struct dmabuf_token {token_start, token_count}
PAGE = 4096
BINDING_ID = 7
PAT_DEVMEM = StreamPattern(seed=16)


class FakeBinding:
    """Stands in for the netdev bind-rx binding, the one piece loopback cannot give."""

    def __init__(self, ifname: str, fd: int, queues: list[int]) -> None:
        self.ifname, self.fd, self.queues = ifname, fd, queues
        self.closed = False

    def close(self) -> None:
        self.closed = True


class DevmemNic:
    """The kernel side of a devmem socket, around a real loopback TCP socket.

    Every recvmsg really runs on the loopback socket. In "host" calls its bytes come back as they
    are: host memory, no cmsg, exactly what the kernel does here. In "device" calls they are
    moved as a bound queue would put them: per skb an optional linear head (copied into the iov
    and announced by SCM_DEVMEM_LINEAR) and fragments written into the dma-buf through the
    device's own mapping, each announced by SCM_DEVMEM_DMABUF with a token (lowest free id from
    1, as the kernel's xarray allocates them). Iov bytes not announced are scribbled over.

    SO_DEVMEM_DONTNEED goes to the real kernel (which checks the limits), and its argument bytes
    are decoded here: that is what the kernel was given. A returned token's page is poisoned and
    reused first, so a token given back while its chunk is held corrupts that chunk's bytes.
    """

    def __init__(self, dmabuf_fd: int, size: int, *, device_share: float, seed: int) -> None:
        self.mm = mmap.mmap(dmabuf_fd, size, mmap.MAP_SHARED)
        self.rng = random.Random(seed)
        self.share = device_share  # of the calls, spread evenly
        self.credit = 0.0
        self.free_pages = list(range(size // PAGE))
        self.free_tokens: list[int] = []
        self.next_token = 1
        self.held: dict[int, int] = {}          # token -> page
        self.given: list[int] = []
        self.returned: list[int] = []
        self.placed: dict[int, tuple[int, int]] = {}  # stream position -> (dma-buf offset, size)
        self.stream = 0
        self.calls = {"host": 0, "device": 0}
        self.flags: set[int] = set()

    def socket_class(self) -> type[socket.socket]:
        nic = self

        class NicSocket(socket.socket):
            def recvmsg_into(self, buffers, ancbufsize=0, flags=0):  # type: ignore[no-untyped-def]
                return nic.recvmsg_into(super().recvmsg_into, buffers, ancbufsize, flags)

            def setsockopt(self, level, opt, value, *rest):  # type: ignore[no-untyped-def]
                super().setsockopt(level, opt, value, *rest)
                if (level, opt) == (K_SOL_SOCKET, K_SO_DEVMEM_DONTNEED):
                    nic.dontneed(bytes(value))

        return NicSocket

    def _token(self) -> int:
        if self.free_tokens:
            return heapq.heappop(self.free_tokens)
        self.next_token += 1
        return self.next_token - 1

    def recvmsg_into(self, real, buffers, ancbufsize, flags):  # type: ignore[no-untyped-def]
        self.flags.add(flags)
        (iov,) = buffers
        iov = memoryview(iov).cast("B")
        self.credit += self.share
        if self.credit < 1 or len(self.free_pages) < 2:
            self.calls["host"] += 1
            # A random share of the iov, so a stream takes many calls of both kinds.
            n, anc, mflags, addr = real([iov[:self.rng.randint(1, 1 << 16)]], ancbufsize, flags)
            self.stream += n
            return n, anc, mflags, addr
        self.calls["device"] += 1
        self.credit -= 1
        # At most one fragment per free page, and few enough cmsgs for the control buffer.
        budget = min(len(self.free_pages), 64)
        scratch = bytearray(min(len(iov), budget * PAGE))
        n, anc, mflags, addr = real([scratch], ancbufsize, flags)
        assert not anc, "loopback gave a cmsg"
        out: list[tuple[int, int, bytes]] = []
        iov[:n] = b"\xee" * n
        pos = lin = 0
        while pos < n:
            head = min(n - pos, self.rng.choice((0, 0, self.rng.randint(1, 300))))
            if not self.free_pages:
                head = n - pos  # no page left: the rest of the skb stays linear
            if head:
                iov[lin:lin + head] = scratch[pos:pos + head]
                out.append((K_SOL_SOCKET, K_SCM_DEVMEM_LINEAR, DMABUF_CMSG.pack(0, head, 0, 0, 0)))
                lin += head
                pos += head
            for _ in range(self.rng.randint(1, 4)):
                if pos == n or not self.free_pages:
                    break
                page = heapq.heappop(self.free_pages)
                start = self.rng.choice((0, 0, self.rng.randrange(PAGE)))
                want = self.rng.choice((PAGE, self.rng.randint(1, PAGE)))
                size = min(n - pos, PAGE - start, want)
                off = page * PAGE + start
                self.mm[off:off + size] = scratch[pos:pos + size]
                tok = self._token()
                self.held[tok] = page
                self.given.append(tok)
                self.placed[self.stream + pos] = (off, size)
                out.append((K_SOL_SOCKET, K_SCM_DEVMEM_DMABUF,
                            DMABUF_CMSG.pack(off, size, tok, BINDING_ID, 0)))
                pos += size
        if len(out) * socket.CMSG_SPACE(DMABUF_CMSG.size) > ancbufsize:
            mflags |= socket.MSG_CTRUNC
        self.stream += n
        return n, out, mflags, addr

    def dontneed(self, arg: bytes) -> None:
        assert len(arg) % DMABUF_TOKEN.size == 0
        for start, count in DMABUF_TOKEN.iter_unpack(arg):
            for tok in range(start, start + count):
                assert tok in self.held, f"token {tok} returned but not held by the user"
                page = self.held.pop(tok)
                self.mm[page * PAGE:(page + 1) * PAGE] = b"\xa5" * PAGE
                heapq.heappush(self.free_pages, page)
                heapq.heappush(self.free_tokens, tok)
                self.returned.append(tok)

    def close(self) -> None:
        self.mm.close()


@pytest.fixture
def devmem_rx(monkeypatch, tcp_pair):
    """(open(device_share, seed) -> (Receiver, nic, binding), sending socket)."""
    from zcnet.rx.zc import devmem
    from zcnet.rx.zc.api import Receiver
    from zcnet.rx.zc.area import Area

    conn, cli = tcp_pair
    bindings: list[FakeBinding] = []

    def fake_bind(ifname: str, fd: int, queues: list[int]) -> FakeBinding:
        bindings.append(FakeBinding(ifname, fd, queues))
        return bindings[-1]

    monkeypatch.setattr(devmem, "bind_rx", fake_bind)
    size = 128 * PAGE
    memfd = os.memfd_create("zcnet-test-dmabuf", os.MFD_CLOEXEC)
    os.ftruncate(memfd, size)
    opened: list[tuple[Receiver, DevmemNic]] = []

    def open_rx(device_share: float, seed: int = 1) -> tuple[Receiver, DevmemNic, FakeBinding]:
        nic = DevmemNic(memfd, size, device_share=device_share, seed=seed)
        sockmod = type("socket_module", (), {"__getattr__": lambda _s, k: getattr(socket, k),
                                             "socket": nic.socket_class()})()
        monkeypatch.setattr(devmem, "socket", sockmod)
        area = Area(size, dmabuf_fd=memfd)
        provider = devmem.DevmemProvider(conn.fileno(), area, "lo", 3)
        rx = Receiver(conn, provider)
        opened.append((rx, nic))
        return rx, nic, bindings[-1]

    try:
        yield open_rx, cli
    finally:
        for rx, nic in opened:
            rx.close()
            nic.close()
        os.close(memfd)


def _send_pattern(cli: socket.socket, total: int) -> threading.Thread:
    def run() -> None:
        with cli:
            for off in range(0, total, 1 << 20):
                cli.sendall(PAT_DEVMEM.expected(off, min(1 << 20, total - off)))
            cli.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.timeout(120)
def test_receiver_over_devmem_linear_loopback_every_byte_and_offset(devmem_rx):
    """Only what loopback really delivers (host memory, no cmsg): every byte arrives as a
    linear copy at its stream offset, and nothing is handed to SO_DEVMEM_DONTNEED."""
    open_rx, cli = devmem_rx
    rx, nic, binding = open_rx(device_share=0.0)
    assert (binding.ifname, binding.fd, binding.queues) == ("lo", rx.area.dmabuf_fd, [3])
    total = 3 << 20
    sender = _send_pattern(cli, total)
    expect = 0
    for chunk in rx:
        with chunk:
            assert chunk.offset == -1 and chunk.stream_offset == expect
            assert PAT_DEVMEM.matches(expect, np.frombuffer(chunk.data, np.uint8))
            expect += len(chunk)
    sender.join()
    assert expect == total == nic.stream
    assert rx.provider.linear_bytes == total and rx.stats.linear == total
    assert nic.calls["host"] and not nic.calls["device"]
    assert {f & (K_MSG_SOCK_DEVMEM | socket.MSG_DONTWAIT) for f in nic.flags} == \
        {K_MSG_SOCK_DEVMEM | socket.MSG_DONTWAIT}
    rx.flush()
    assert nic.given == nic.returned == []
    rx.close()
    assert binding.closed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("form", ["chunks", "batches"])
def test_receiver_over_devmem_tokens_return_exactly_once(devmem_rx, form: str):
    """Real loopback bytes, half of the receives moved into the dma-buf with tokens: every byte
    and stream offset is right, every area chunk is where the device put it, chunks held across
    later receives keep their bytes (their tokens are not given back early), and each token
    handed out reaches SO_DEVMEM_DONTNEED exactly once."""
    open_rx, cli = devmem_rx
    rx, nic, binding = open_rx(device_share=0.5, seed=5 if form == "chunks" else 6)
    total = 3 << 20
    sender = _send_pattern(cli, total)
    rng = random.Random(3)
    held: list = []
    expect = 0
    kinds = {"linear": 0, "area": 0}

    def verify(pieces: list[tuple[int, memoryview]]) -> None:
        for start, mv in pieces:
            assert PAT_DEVMEM.matches(start, np.frombuffer(mv, np.uint8)), \
                f"bytes at stream offset {start} changed while held"

    def pieces_of(item) -> list[tuple[int, memoryview]]:  # type: ignore[no-untyped-def]
        if form == "chunks":
            return [(item.stream_offset, item.data)]
        out, s = [], item.stream_offset
        for mv in item.views():
            out.append((s, mv))
            s += len(mv)
        return out

    def release_some(keep: int) -> None:
        rng.shuffle(held)
        # Holding past the receiver's back-pressure mark would only make recv wait.
        while len(held) > keep or sum(map(len, held)) > rx.area.size // 2:
            item = held.pop()
            verify(pieces_of(item))
            item.release()

    while True:
        got = rx.recv(5.0) if form == "chunks" else rx.recv_batch(5.0)
        if not got:
            if rx.eof:
                break
            release_some(keep=0)  # paused by back-pressure: linear copies count as held too
            continue
        items = got if form == "chunks" else [got]
        for item in items:
            assert item.stream_offset == expect
            if form == "chunks":
                spans = [(item.offset, len(item))]
            else:
                spans = list(zip(item.offsets, item.lengths, strict=True))
            pos = expect
            for off, n in spans:
                if off == -1:
                    kinds["linear"] += 1
                else:
                    kinds["area"] += 1
                    assert nic.placed[pos] == (off, n)
                pos += n
            verify(pieces_of(item))
            expect += len(item)
            held.append(item)
        release_some(keep=rng.randint(0, 6))
    release_some(keep=0)
    sender.join()
    assert expect == total == nic.stream
    assert kinds["linear"] and kinds["area"] and nic.calls["host"] and nic.calls["device"], \
        (kinds, nic.calls)
    assert len(nic.given) > 100
    rx.flush()
    assert not nic.held, f"tokens never given back: {sorted(nic.held)[:10]}..."
    assert sorted(nic.returned) == sorted(nic.given)
    assert rx.provider.dontneed_calls > 0
    rx.close()
    assert binding.closed


@pytest.mark.timeout(60)
def test_devmem_chunks_held_at_close_stay_readable_and_free_the_area_last(devmem_rx):
    """Closing the receiver closes the socket (the kernel frees its tokens itself): chunks
    still held keep their bytes, their release gives nothing to SO_DEVMEM_DONTNEED, and the
    area goes with the last one."""
    open_rx, cli = devmem_rx
    rx, nic, binding = open_rx(device_share=1.0)
    sender = _send_pattern(cli, 256 << 10)
    held = []
    while not held or sum(map(len, held)) < 64 << 10:
        held += rx.recv(5.0)
    sender.join()
    returned = list(nic.returned)
    rx.close()
    assert binding.closed and not rx.area.closed
    for c in held:
        assert PAT_DEVMEM.matches(c.stream_offset, np.frombuffer(c.data, np.uint8))
    rx.release_many(held)
    assert rx.area.closed and nic.returned == returned
