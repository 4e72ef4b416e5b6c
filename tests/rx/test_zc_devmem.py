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
    bind_rx,
    dontneed_batches,
    parse_cmsgs,
    recv_devmem,
)
from zcnet.rx.zc.provider import Delivery
from zcnet.uapi import socket as usock

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

# Numbers from asm-generic/socket.h and linux/socket.h, written here rather than taken from
# zcnet.uapi, so a wrong constant there cannot agree with itself.
K_SOL_SOCKET = 1
K_SCM_DEVMEM_LINEAR = 78
K_SCM_DEVMEM_DMABUF = 79
K_SO_DEVMEM_DONTNEED = 80
K_MSG_SOCK_DEVMEM = 0x2000000
# net/core/sock.c: SO_DEVMEM_DONTNEED takes at most 128 entries and 1024 tokens per call.
K_DONTNEED_ENTRIES = 128
K_DONTNEED_TOKENS = 1024
DMABUF_TOKEN = struct.Struct("=II")  # struct dmabuf_token {token_start, token_count}
# struct dmabuf_cmsg {__u64 frag_offset; __u32 frag_size; __u32 frag_token; __u32 dmabuf_id;
# __u32 flags;} -- packed by hand, independently of the ctypes definition the code uses.
DMABUF_CMSG = struct.Struct("=QIIII")
assert DMABUF_CMSG.size == ctypes.sizeof(usock.dmabuf_cmsg) == 24


def frag(off: int, size: int, token: int, binding: int = 5) -> tuple[int, int, bytes]:
    return (K_SOL_SOCKET, K_SCM_DEVMEM_DMABUF,
            DMABUF_CMSG.pack(off, size, token, binding, 0))


def linear(size: int) -> tuple[int, int, bytes]:
    return (K_SOL_SOCKET, K_SCM_DEVMEM_LINEAR, DMABUF_CMSG.pack(0, size, 0, 0, 0))


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
        parse_cmsgs([(K_SOL_SOCKET, K_SCM_DEVMEM_DMABUF, b"\0" * 8)], b"", Delivery())


def _decode(arg: bytes) -> list[tuple[int, int]]:
    assert len(arg) % DMABUF_TOKEN.size == 0
    return list(DMABUF_TOKEN.iter_unpack(arg))


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
        assert len(d) <= K_DONTNEED_ENTRIES and sum(c for _, c in d) <= K_DONTNEED_TOKENS


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
    for arg in dontneed_batches(list(range(0, 4 * K_DONTNEED_ENTRIES, 2))):
        conn.setsockopt(K_SOL_SOCKET, K_SO_DEVMEM_DONTNEED, arg)
    too_many = DMABUF_TOKEN.pack(0, 1) * (K_DONTNEED_ENTRIES + 1)
    with pytest.raises(OSError) as ei:
        conn.setsockopt(K_SOL_SOCKET, K_SO_DEVMEM_DONTNEED, too_many)
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
    from zcnet.netns import in_netns

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
    from zcnet.netns import in_netns
    from zcnet.rx.zc.devmem import open_devmem

    if os.path.exists("/dev/udmabuf"):
        pytest.skip("udmabuf exists: the dma-buf is created before binding")
    with Lab() as lab, in_netns(lab.ns_a), pytest.raises(Unsupported) as ei:
        ifname = lab.if_a
        open_devmem(-1, 1 << 20, ifname=ifname, queue=0)
    assert f"device {ifname} cannot bind a dma-buf" in ei.value.message


# --- a Receiver over the real DevmemProvider ------------------------------------------------------
#
PAGE = 4096
BINDING_ID = 7
PAT_DEVMEM = StreamPattern(seed=16)


class FakeBinding:
    """Stands in for the netdev bind-rx binding, the one piece loopback cannot give."""

    def __init__(self, ifname: str, fd: int, queues: list[int]) -> None:
        self.ifname, self.fd, self.queues = ifname, fd, queues
        self.id = BINDING_ID
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
    are decoded here: that is what the kernel was given. ``first_token`` 0 models kernels whose
    tokens are indices into the binding's buffers (0 included). A returned token's page is
    poisoned and reused first, so a token given back while its chunk is held corrupts that
    chunk's bytes.
    """

    def __init__(self, dmabuf_fd: int, size: int, *, device_share: float, seed: int,
                 first_token: int = 1, pages: range | None = None,
                 heads: bool = True) -> None:
        self.mm = mmap.mmap(dmabuf_fd, size, mmap.MAP_SHARED)
        self.rng = random.Random(seed)
        self.share = device_share  # of the calls, spread evenly
        self.credit = 0.0
        # The pool's pages this socket's flow gets (sockets on one binding share the dma-buf)
        self.free_pages = list(pages if pages is not None else range(size // PAGE))
        self.heads = heads  # False: header split always works, every payload byte in a page
        self.free_tokens: list[int] = []
        self.next_token = first_token
        self.dontneed_calls = 0
        self.linear_bytes = 0
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
                    nic.dontneed_calls += 1
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
        # The kernel stops a call when the next cmsg would not fit (put_cmsg_notrunc): at most
        # two cmsgs per page (a linear head and a fragment) and a final linear run.
        slots = ancbufsize // socket.CMSG_SPACE(DMABUF_CMSG.size)
        budget = min(len(self.free_pages), 64, (slots - 1) // 2 if self.heads else slots)
        if self.credit < 1 or budget < (2 if self.heads else 1):
            self.calls["host"] += 1
            # A random share of the iov, so a stream takes many calls of both kinds.
            n, anc, mflags, addr = real([iov[:self.rng.randint(1, 1 << 16)]], ancbufsize, flags)
            self.stream += n
            self.linear_bytes += n
            return n, anc, mflags, addr
        self.calls["device"] += 1
        self.credit -= 1
        # At most one fragment per free page, and few enough cmsgs for the control buffer.
        scratch = bytearray(min(len(iov), budget * PAGE))
        n, anc, mflags, addr = real([scratch], ancbufsize, flags)
        assert not anc, "loopback gave a cmsg"
        out: list[tuple[int, int, bytes]] = []
        iov[:n] = b"\xee" * n
        pos = lin = 0
        while pos < n:
            head = min(n - pos, self.rng.choice((0, 0, self.rng.randint(1, 300)))
                       if self.heads else 0)
            if not self.free_pages or budget == 0:
                head = n - pos  # no page left: the rest of the skb stays linear
            if head:
                iov[lin:lin + head] = scratch[pos:pos + head]
                self.linear_bytes += head
                out.append((K_SOL_SOCKET, K_SCM_DEVMEM_LINEAR, DMABUF_CMSG.pack(0, head, 0, 0, 0)))
                lin += head
                pos += head
            for _ in range(self.rng.randint(1, 4)):
                if pos == n or not self.free_pages or budget == 0:
                    break
                page = heapq.heappop(self.free_pages)
                budget -= 1
                if self.heads:
                    start = self.rng.choice((0, 0, self.rng.randrange(PAGE)))
                    want = self.rng.choice((PAGE, self.rng.randint(1, PAGE)))
                else:  # whole pages: the bytes read fit the pages budgeted
                    start, want = 0, PAGE
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


def _patch_binding(monkeypatch, bind) -> None:  # type: ignore[no-untyped-def]
    """bind-rx replaced by ``bind`` (no NIC here takes a binding), no RX ring reserve."""
    from zcnet.rx.zc import devmem_binding

    monkeypatch.setattr(devmem_binding, "bind_rx", bind)
    monkeypatch.setattr(devmem_binding, "_reserve", lambda ifname: 0)


@pytest.fixture
def devmem_rx(monkeypatch, tcp_pair):
    """(open(device_share, seed) -> (Receiver, nic, binding), sending socket)."""
    from zcnet.rx.zc import devmem
    from zcnet.rx.zc.api import Receiver
    from zcnet.rx.zc.devmem_binding import acquire

    conn, cli = tcp_pair
    bindings: list[FakeBinding] = []

    def fake_bind(ifname: str, fd: int, queues: list[int]) -> FakeBinding:
        bindings.append(FakeBinding(ifname, fd, queues))
        return bindings[-1]

    _patch_binding(monkeypatch, fake_bind)
    size = 128 * PAGE
    memfd = os.memfd_create("zcnet-test-dmabuf", os.MFD_CLOEXEC)
    os.ftruncate(memfd, size)
    opened: list[tuple[Receiver, DevmemNic]] = []

    def open_rx(device_share: float, seed: int = 1,
                first_token: int = 1) -> tuple[Receiver, DevmemNic, FakeBinding]:
        nic = DevmemNic(memfd, size, device_share=device_share, seed=seed,
                        first_token=first_token)
        sockmod = type("socket_module", (), {"__getattr__": lambda _s, k: getattr(socket, k),
                                             "socket": nic.socket_class()})()
        monkeypatch.setattr(devmem, "socket", sockmod)
        provider = devmem.DevmemProvider(conn.fileno(), acquire("lo", [3], size, memfd))
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
    assert (binding.ifname, binding.queues) == ("lo", [3])
    assert binding.fd == rx.area.dmabuf_fd == rx.provider.binding.dmabuf_fd
    total = 3 << 20
    sender = _send_pattern(cli, total)
    expect = 0
    for chunk in rx:
        with chunk:
            assert chunk.offset == -1 and chunk.stream_offset == expect
            assert len(chunk.data) == len(chunk) > 0
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
    # Batches run with tokens from 0, as kernels with index tokens hand them out.
    rx, nic, binding = open_rx(device_share=0.5, seed=5 if form == "chunks" else 6,
                               first_token=1 if form == "chunks" else 0)
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
            assert len(item.data) == len(item)
            return [(item.stream_offset, item.data)]
        out, s = [], item.stream_offset
        for mv in item.views():
            out.append((s, mv))
            s += len(mv)
        assert s - item.stream_offset == len(item)  # every byte has a view
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
            assert all(n > 0 for _, n in spans), "an empty fragment: the kernel sends none"
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
    assert rx.stats_dict()["dontneed_calls"] == nic.dontneed_calls > 0
    assert rx.stats_dict()["linear"] == rx.stats.linear == nic.linear_bytes > 0
    assert rx.stats.rearms == 0  # devmem has nothing to re-arm
    if form == "batches":
        assert 0 in nic.returned
    rx.close()
    assert binding.closed


@pytest.mark.timeout(60)
def test_devmem_chunks_held_at_close_keep_their_socket_and_free_the_binding_last(devmem_rx):
    """Closing the receiver with chunks held keeps its socket open (destroying it would hand
    their pages back to the NIC, which refills them while the application reads) and the
    binding bound: the chunks keep their bytes; their release gives each token back on that
    socket, then the socket, the binding and the area go."""
    open_rx, cli = devmem_rx
    rx, nic, binding = open_rx(device_share=1.0)
    sender = _send_pattern(cli, 256 << 10)
    held = []
    while not held or sum(map(len, held)) < 64 << 10:
        held += rx.recv(5.0)
    sender.join()
    prov = rx.provider
    sock = prov._sock
    rx.close()
    assert not binding.closed and not rx.area.closed and sock.fileno() >= 0
    assert prov.binding.members == 0 and prov.binding.holders == 1
    for c in held:
        assert PAT_DEVMEM.matches(c.stream_offset, np.frombuffer(c.data, np.uint8))
    tokens = {c._tok for c in held if c._tok >= 0}
    assert tokens and tokens <= set(nic.held)
    rx.release_many(held)
    assert tokens <= set(nic.returned) and prov.held == 0
    assert sock.fileno() == -1 and binding.closed and prov.binding.closed and rx.area.closed


# --- recv_devmem and the provider, case by case ---------------------------------------------------


class ScriptedSocket:
    """recvmsg_into answers from a script: (bytes for the iov, cmsgs, msg flags[, bytes
    received: more than the iov got when fragments went to the dma-buf]) or an OSError."""

    def __init__(self, *answers) -> None:  # type: ignore[no-untyped-def]
        self.answers = list(answers)

    def recvmsg_into(self, buffers, ancbufsize, flags):  # type: ignore[no-untyped-def]
        if not self.answers:
            raise BlockingIOError
        a = self.answers.pop(0)
        if isinstance(a, OSError):
            raise a
        data, anc, mflags, *n = a
        buffers[0][:len(data)] = data
        return (n[0] if n else len(data)), anc, mflags, None


def test_foreign_cmsgs_between_fragments_are_skipped():
    out = Delivery()
    anc = [frag(0, 10, 1), (socket.SOL_SOCKET, socket.SCM_RIGHTS, b"\0" * 4), frag(4096, 20, 2)]
    parse_cmsgs(anc, b"", out)
    assert out.offsets == [0, 4096] and out.tokens == [1, 2]


def test_unannounced_bytes_after_announced_linear_ones_are_linear_too():
    """100 bytes, 30 of them announced by SCM_DEVMEM_LINEAR: the other 70 are plain copied data
    and follow in the iov."""
    payload = bytes(range(100))
    sock = ScriptedSocket((payload, [linear(30)], 0))
    out = Delivery()
    iov = memoryview(bytearray(256))
    assert recv_devmem(sock, iov, out) == 100  # type: ignore[arg-type]
    assert out.lengths == [30, 70] and out.offsets == [-1, -1] and out.tokens == [-1, -1]
    assert out.linear == {0: payload[:30], 1: payload[30:]}


def test_a_receive_of_fragments_only_adds_no_linear_entry():
    # The count includes the fragments' bytes although the iov stays empty.
    sock = ScriptedSocket((b"", [frag(0, 4096, 1), frag(8192, 100, 2)], 0, 4196))
    out = Delivery()
    assert recv_devmem(sock, memoryview(bytearray(64)), out) == 0  # type: ignore[arg-type]
    assert out.lengths == [4096, 100] and out.tokens == [1, 2] and out.linear == {}


def test_a_stream_error_ends_the_delivery_with_its_errno():
    sock = ScriptedSocket((b"abc", [], 0), ConnectionResetError(errno.ECONNRESET, "reset"),
                          (b"never", [], 0))
    out = Delivery()
    assert recv_devmem(sock, memoryview(bytearray(64)), out) == 3  # type: ignore[arg-type]
    assert out.end == -errno.ECONNRESET and out.linear == {0: b"abc"}
    assert sock.answers == [(b"never", [], 0)]  # no receive after the error


def test_a_truncated_control_buffer_is_an_error_naming_the_lost_tokens():
    from zcnet.errors import ZcnetError

    sock = ScriptedSocket((b"", [frag(0, 100, 1)], socket.MSG_CTRUNC, 100))
    with pytest.raises(ZcnetError) as ei:
        recv_devmem(sock, memoryview(bytearray(64)), Delivery())  # type: ignore[arg-type]
    assert ei.value.message == "devmem control buffer truncated: fragment tokens were lost"
    assert ei.value.hint == "report this; the control buffer must grow"


def test_dontneed_counts_tokens_across_runs_in_one_call():
    """Runs share a call's 1024-token budget: two runs of 600 split the second at 424."""
    got = [_decode(b) for b in dontneed_batches([*range(600), *range(1000, 1600)])]
    assert got == [[(0, 600), (1000, 424)], [(1424, 176)]]
    got = [_decode(b) for b in dontneed_batches([*range(400), *range(1000, 1400),
                                                 *range(2000, 2400)])]
    assert got == [[(0, 400), (1000, 400), (2000, 224)], [(2224, 176)]]


@pytest.fixture
def fake_bind(monkeypatch):
    """bind_rx recorded instead of asking the device (no NIC here takes a binding)."""
    made: list[FakeBinding] = []

    def bind(ifname: str, fd: int, queues: list[int]) -> FakeBinding:
        made.append(FakeBinding(ifname, fd, queues))
        return made[-1]

    _patch_binding(monkeypatch, bind)
    return made


def _member(memfd: int, fd: int, queues: tuple[int, ...] = (0,), size: int = 1 << 20):
    """A DevmemProvider on this process's binding of ``queues`` of eth7 (fake_bind)."""
    from zcnet.rx.zc.devmem import DevmemProvider
    from zcnet.rx.zc.devmem_binding import acquire

    return DevmemProvider(fd, acquire("eth7", queues, size, memfd))


def _memfd(size: int):  # type: ignore[no-untyped-def]
    fd = os.memfd_create("zcnet-test-dmabuf", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    yield fd
    os.close(fd)


@pytest.fixture
def memfd():
    yield from _memfd(1 << 20)


@pytest.mark.parametrize(("ifname", "queue", "want"), [
    ("eth7", 2, ("eth7", [2])), (None, None, ("found0", [9])), ("eth7", None, ("eth7", [9])),
    (None, 2, ("found0", [2]))])
def test_open_devmem_binds_the_given_or_found_queue(monkeypatch, fake_bind, memfd, tcp_pair,
                                                    ifname, queue, want):
    from zcnet.rx.zc import devmem
    from zcnet.rx.zc.devmem import open_devmem

    asked = []
    monkeypatch.setattr(devmem, "find_queue", lambda fd: asked.append(fd) or ("found0", 9))
    conn, _ = tcp_pair
    p = open_devmem(conn.fileno(), 64 << 10, dmabuf_fd=memfd, ifname=ifname, queue=queue)
    try:
        assert [(b.ifname, b.queues) for b in fake_bind] == [(want[0], want[1])]
        assert os.path.samestat(os.fstat(fake_bind[0].fd), os.fstat(memfd))
        assert asked == ([] if ifname and queue is not None else [conn.fileno()])
        assert p.area.size == 1 << 20  # the whole dma-buf, mapped by the member itself
        assert p.can_arm() and p.held_back() == 0 and p.ring is None
        assert p.note == (f"queue {want[1][0]} of {want[0]}, dma-buf fd "
                          f"{p.binding.dmabuf_fd} (binding {BINDING_ID}, shared by the "
                          "connections on them)")
        assert p.extra_stats() == {"linear": 0, "dontneed_calls": 0, "share_stops": 0,
                                   "held_limit": (1 << 20) // 2 // PAGE, "members": 1}
    finally:
        p.close()
        p.area.close()
    assert fake_bind[0].closed


def test_open_devmem_warns_that_hugetlb_does_not_apply(fake_bind, memfd, tcp_pair):
    """A dma-buf's exporter picks its pages: hugetlb=True is not silently dropped but named in a
    warning that points at the caller's line."""
    from zcnet.rx.zc.devmem import open_devmem

    conn, _ = tcp_pair
    with pytest.warns(RuntimeWarning, match="hugetlb does not apply to devmem") as caught:
        p = open_devmem(conn.fileno(), 64 << 10, dmabuf_fd=memfd, hugetlb=True,
                        ifname="eth7", queue=2)
    try:
        assert [w.filename for w in caught] == [__file__]
        assert p.area.kind != "hugetlb" and p.area.dmabuf_fd == p.binding.dmabuf_fd
    finally:
        p.close()
        p.area.close()


def test_open_devmem_without_udmabuf_probes_the_device_first(monkeypatch):
    """No dma-buf given and no /dev/udmabuf: the device is asked (fd -1 as u32) before the
    missing udmabuf is reported."""
    from zcnet.errors import ZcnetError
    from zcnet.rx.zc import devmem, devmem_binding

    if os.path.exists("/dev/udmabuf"):
        pytest.skip("udmabuf exists: no probe is needed")
    asked = []

    def bind(ifname: str, fd: int, queues: list[int]) -> FakeBinding:
        asked.append((ifname, fd, queues))
        raise OSError(errno.EBADF, "bad fd")  # the device passed its checks

    monkeypatch.setattr(devmem_binding, "bind_rx", bind)
    with pytest.raises(ZcnetError, match="/dev/udmabuf does not exist"):
        devmem.open_devmem(-1, 1 << 20, ifname="eth7", queue=3)
    assert asked == [("eth7", 0xFFFFFFFF, [3])]


@pytest.mark.parametrize("err", [errno.EPERM, errno.ENODEV])
def test_probe_passes_on_ebadf_only(monkeypatch, err):
    from zcnet.rx.zc import devmem_binding

    monkeypatch.setattr(devmem_binding, "bind_rx",
                        lambda *a: (_ for _ in ()).throw(OSError(err, "x")))
    with pytest.raises(OSError) as ei:
        devmem_binding.probe_device("eth7", 0)
    assert ei.value.errno == err
    monkeypatch.setattr(devmem_binding, "bind_rx",
                        lambda *a: (_ for _ in ()).throw(OSError(errno.EBADF, "x")))
    assert devmem_binding.probe_device("eth7", 0) is None


def test_a_binding_that_fails_leaves_no_fd_and_no_binding(monkeypatch, memfd):
    """no_leaks (module-wide) sees an fd or a mapping if open_devmem left one; the process
    has no binding of the queue afterwards."""
    from zcnet.rx.zc import devmem
    from zcnet.rx.zc.devmem_binding import bound_here

    _patch_binding(monkeypatch, lambda *a: (_ for _ in ()).throw(Unsupported("no", "fix")))
    with pytest.raises(Unsupported):
        devmem.open_devmem(-1, 1 << 20, dmabuf_fd=memfd, ifname="eth7", queue=0)
    assert bound_here("eth7", [0]) is None


@pytest.mark.parametrize("extack", ["", "rx queue 0 has no memory provider support"])
def test_bind_rx_refusal_names_the_device_and_the_fix(monkeypatch, extack):
    from zcnet.nic import netdev
    from zcnet.rx.zc.devmem import bind_rx

    def refuse(dev, fd, queues):  # type: ignore[no-untyped-def]
        e = Unsupported("kernel says no")
        if extack:
            e.extack = extack  # type: ignore[attr-defined]
        raise e

    monkeypatch.setattr(netdev, "bind_rx", refuse)
    with pytest.raises(Unsupported) as ei:
        bind_rx("lo", 5, [0, 1])
    assert ei.value.message == (
        "device lo cannot bind a dma-buf to queue(s) [0, 1]: it lacks queue management ops, "
        "DMA or header-data split" + (f" ({extack})" if extack else ""))
    assert ei.value.hint == ("devmem TCP needs a NIC with the queue API and tcp-data-split on; "
                             "elsewhere use provider 'soft'")


@pytest.mark.timeout(30)
def test_provider_reap_waits_for_data_and_unattached_one_is_idle(fake_bind, memfd, tcp_pair,
                                                                 caplog):
    """reap(timeout) sleeps in poll until data comes (None: as long as it takes), returns empty
    when the time is up; the linear warning is logged once with the byte count."""
    conn, cli = tcp_pair
    idle = _member(memfd, -1)
    assert idle.reap(0.05).lengths == []
    idle.recycle([1, 2], [10, 10])  # nothing attached: nothing to give back to
    idle.close()
    idle.area.close()
    p = _member(memfd, conn.fileno())
    try:
        assert p.reap(0.05).lengths == []  # nothing sent: the time runs out
        for timeout in (5.0, None):
            timer = threading.Timer(0.2, cli.sendall, (b"x" * 1000,))
            timer.start()
            with caplog.at_level("WARNING", logger="zcnet.rx.zc.devmem"):
                got = p.reap(timeout)
            timer.join()
            assert sum(got.lengths) == 1000, timeout
        assert p.extra_stats()["linear"] == 2000 and p.extra_stats()["dontneed_calls"] == 0
    finally:
        p.close()
        p.area.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "zcnet.rx.zc.devmem"]
    assert warned == ["devmem: 1000 bytes arrived in host memory (SCM_DEVMEM_LINEAR): header "
                      "split is off or the flow is not steered to the bound queue"]


def test_a_socket_on_fd_0_is_attached_and_arm_is_idempotent(fake_bind, memfd, tcp_pair):
    """fd 0 is a socket like any other (a daemon's stdin may be closed); arming a devmem
    provider does nothing (the binding delivers regardless), however often."""
    conn, cli = tcp_pair
    saved = os.dup(0)
    try:
        os.dup2(conn.fileno(), 0)
        p = _member(memfd, 0)
        os.dup2(saved, 0)  # the provider holds its own duplicate
        try:
            cli.sendall(b"y" * 100)
            assert sum(p.reap(5.0).lengths) == 100
            p.arm()
            p.arm()
            cli.sendall(b"z" * 10)
            assert sum(p.reap(5.0).lengths) == 10
        finally:
            p.close()
            p.area.close()
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def _maps_of(name: str) -> int:
    """Mappings of the memfd called ``name`` in this process (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return sum(line.rstrip().endswith(f"/memfd:{name} (deleted)") or
                   line.rstrip().endswith(f"/memfd:{name}") for line in f)


def test_a_binding_that_fails_unmaps_the_area_before_the_error_is_seen(monkeypatch, memfd):
    """The area is closed on the way out, not when the traceback's frames die."""
    from zcnet.rx.zc import devmem

    _patch_binding(monkeypatch, lambda *a: (_ for _ in ()).throw(Unsupported("no", "fix")))
    with pytest.raises(Unsupported) as ei:
        devmem.open_devmem(-1, 1 << 20, dmabuf_fd=memfd, ifname="eth7", queue=0)
    assert ei.value.__traceback__ is not None  # its frames (and their locals) still live
    assert _maps_of("zcnet-test-dmabuf") == 0


def test_a_socket_that_cannot_be_attached_unbinds(fake_bind, memfd):
    from zcnet.rx.zc.devmem_binding import bound_here

    with open("/dev/null", "rb") as null, pytest.raises(OSError) as ei:
        _member(memfd, null.fileno())  # not a socket
    assert ei.value.errno == errno.ENOTSOCK
    assert len(fake_bind) == 1 and fake_bind[0].closed and bound_here("eth7", [0]) is None


def test_every_call_on_a_closed_devmem_provider_names_itself(fake_bind, memfd, tcp_pair):
    from zcnet.errors import ClosedError

    conn, _ = tcp_pair
    p = _member(memfd, conn.fileno())
    p.area.close()
    p.close()
    p.close()  # twice is harmless
    assert fake_bind[0].closed
    calls = {"attach": lambda: p.attach(conn.fileno()), "can_arm": p.can_arm,
             "arm": p.arm, "reap": lambda: p.reap(0), "recycle": lambda: p.recycle([1], [9])}
    for name, call in calls.items():
        with pytest.raises(ClosedError) as ei:
            call()
        assert ei.value.message == f"{name}() on a closed DevmemProvider"


def test_devmem_reap_polls_as_long_as_it_is_told(monkeypatch, fake_bind, memfd, tcp_pair):
    """The timeout reaches poll(2) in milliseconds (poll itself recorded, then not waited)."""
    import select

    real = select.poll
    waits: list[int] = []

    class RecordingPoll:
        def __init__(self) -> None:
            self._p = real()

        def register(self, fd: int, events: int) -> None:
            self._p.register(fd, events)

        def unregister(self, fd: int) -> None:
            self._p.unregister(fd)

        def poll(self, ms: int) -> list[tuple[int, int]]:
            waits.append(ms)
            return self._p.poll(0)

    monkeypatch.setattr(select, "poll", RecordingPoll)
    conn, _ = tcp_pair
    p = _member(memfd, conn.fileno())
    try:
        for timeout in (2.5, 0.25, 0):
            assert p.reap(timeout).lengths == []
    finally:
        p.close()
        p.area.close()
    assert waits == [2500, 250, 0]


def test_open_receiver_devmem_binds_the_dmabuf_and_receives(fake_bind, memfd, tcp_pair):
    """provider="devmem": the dma-buf and the queue reach the binding, the socket's bytes
    arrive (linear on loopback), and closing unbinds."""
    from zcnet.rx.zc import open_receiver

    conn, cli = tcp_pair
    with open_receiver(conn, "devmem", area_size=64 << 10, dmabuf_fd=memfd, ifname="eth7",
                       queue=2) as rx:
        assert rx.name == "devmem" and rx.why == "devmem requested"
        assert [(b.ifname, b.queues) for b in fake_bind] == [("eth7", [2])]
        assert os.path.samestat(os.fstat(rx.area.dmabuf_fd), os.fstat(memfd))
        cli.sendall(b"d" * 300)
        got = b""
        while len(got) < 300:
            chunks = rx.recv(timeout=5.0)
            got += b"".join(bytes(c) for c in chunks)
            rx.release_many(chunks)
        assert got == b"d" * 300
    assert fake_bind[0].closed


def test_auto_takes_devmem_when_zcrx_fails_and_says_why(fake_bind, memfd, tcp_pair, caplog):
    from zcnet.rx.zc import open_receiver

    conn, _ = tcp_pair
    with caplog.at_level("INFO", logger="zcnet.rx.zc.opener"):
        rx = open_receiver(conn, "auto", area_size=64 << 10, dmabuf_fd=memfd, ifname="eth7",
                           queue=2)
    with rx:
        assert rx.name == "devmem" and rx.why.startswith("devmem: zcrx: ")
        assert [(b.ifname, b.queues) for b in fake_bind] == [("eth7", [2])]
    assert not [r for r in caplog.records if r.name == "zcnet.rx.zc.opener"]  # no fallback


def test_auto_without_dmabuf_falls_back_to_soft_and_logs_why(tcp_pair, caplog):
    from zcnet.rx.zc import open_receiver

    conn, _ = tcp_pair
    with caplog.at_level("INFO", logger="zcnet.rx.zc.opener"):
        rx = open_receiver(conn, "auto", area_size=1 << 20, buf_size=4096)
    with rx:
        assert rx.name == "soft" and rx.why.endswith("; devmem: no dma-buf given")
        logged = [r.getMessage() for r in caplog.records if r.name == "zcnet.rx.zc.opener"]
        assert logged == [f"zero-copy provider for fd {conn.fileno()}: {rx.why}"]


def test_a_receiver_that_cannot_be_built_closes_its_provider_and_area(monkeypatch, tcp_pair):
    from zcnet.errors import ClosedError, UsageError
    from zcnet.rx.zc import open_receiver, opener

    made = []

    def refuse(sock, p, **kw):  # type: ignore[no-untyped-def]
        made.append(p)
        raise UsageError("no receiver")

    monkeypatch.setattr(opener, "Receiver", refuse)
    conn, _ = tcp_pair
    with pytest.raises(UsageError, match=r"^no receiver$"):
        open_receiver(conn, "soft", area_size=1 << 20, buf_size=4096)
    (p,) = made
    assert p.area.closed
    with pytest.raises(ClosedError):
        p.can_arm()


# --- one binding, many connections (zcnet.rx.zc.devmem_binding) ---------------------------------

@pytest.fixture
def big_memfd():
    yield from _memfd(4 << 20)


def test_connections_on_one_queue_set_share_one_binding_and_split_the_dma_buf(fake_bind,
                                                                              big_memfd):
    """Four connections on queue 0: one bind-rx; each may hold a quarter of the 4 MiB (half
    of it in pages, half queued in its socket); a fifth would get under 1 MiB and is refused
    naming the fix; as members leave the others' shares grow, and the last one unbinds."""
    from zcnet.errors import UsageError
    from zcnet.rx.zc.devmem_binding import MIN_SHARE, bound_here

    members = [_member(big_memfd, -1, size=4 << 20) for _ in range(4)]
    try:
        assert len(fake_bind) == 1 and fake_bind[0].queues == [0]
        b = bound_here("eth7", [0])
        assert all(m.binding is b for m in members) and b.members == 4 == b.holders
        assert b.share() == MIN_SHARE and b.held_limit() == (1 << 20) // 2 // PAGE
        assert b.rcvbuf() == 256 << 10
        with pytest.raises(UsageError) as ei:
            _member(big_memfd, -1, size=4 << 20)
        assert ei.value.message == (
            "devmem on queue 0 of eth7: its 4 MiB dma-buf (0 MiB kept for the device's RX "
            "ring) gives 5 connections 819 KiB each, under the 1 MiB a connection needs")
        assert ei.value.hint == ("use a dma-buf (area) of at least 5 MiB for the first "
                                 "connection on these queues, or fewer connections")
        assert b.members == 4 and len(fake_bind) == 1
        for n, m in enumerate(members[:3]):
            m.close()
            m.area.close()
            assert b.members == 3 - n and b.held_limit() == (4 << 20) // (3 - n) // 2 // PAGE
            assert not fake_bind[0].closed
    finally:
        for m in members:
            m.close()
            m.area.close()
    assert fake_bind[0].closed and b.closed and bound_here("eth7", [0]) is None


def test_several_queues_are_one_binding_and_an_overlapping_set_is_refused(fake_bind, memfd):
    """queues 1,2: one bind-rx over both; a connection asking for queue 2 alone (or another
    dma-buf for 1,2) while that binding lives is told which binding holds it."""
    from zcnet.errors import UsageError
    from zcnet.rx.zc.devmem import open_devmem

    p = open_devmem(-1, 1 << 20, dmabuf_fd=memfd, ifname="eth7", queues=[2, 1])
    try:
        assert [b.queues for b in fake_bind] == [[1, 2]]
        assert p.note.startswith("queues 1,2 of eth7, dma-buf fd ")
        with pytest.raises(UsageError) as ei:
            open_devmem(-1, 1 << 20, dmabuf_fd=memfd, ifname="eth7", queue=2)
        assert ei.value.message == ("devmem on queues 2 of eth7: this process has queues 1,2 "
                                    "of eth7 bound already")
        assert ei.value.hint == "receive on queues 1,2 (one binding per queue set)"
        other = os.memfd_create("zcnet-test-other", os.MFD_CLOEXEC)
        try:
            os.ftruncate(other, 1 << 20)
            with pytest.raises(UsageError, match="this process bound another dma-buf"):
                open_devmem(-1, 1 << 20, dmabuf_fd=other, ifname="eth7", queues=[1, 2])
        finally:
            os.close(other)
        assert len(fake_bind) == 1 and p.binding.members == 1
    finally:
        p.close()
        p.area.close()
    assert fake_bind[0].closed


def test_a_queue_bound_by_another_program_is_named_with_its_errno(monkeypatch, memfd):
    from zcnet.nic.genl import NetlinkError
    from zcnet.rx.zc.devmem import open_devmem

    def taken(ifname: str, fd: int, queues: list[int]) -> FakeBinding:
        raise NetlinkError(errno.EEXIST, "bind", "designated queue already memory provider "
                           "bound")

    _patch_binding(monkeypatch, taken)
    with pytest.raises(NetlinkError) as ei:
        open_devmem(-1, 1 << 20, dmabuf_fd=memfd, ifname="eth7", queue=1)
    assert ei.value.errno == errno.EEXIST
    assert ei.value.message == ("queue 1 of eth7 is bound by another program (zcrx or devmem) "
                                "or an XDP program: designated queue already memory provider "
                                "bound (File exists)")
    assert ei.value.hint == ("stop that program, or receive on other queues (zcnet nic setup "
                             "--queues)")


@pytest.mark.timeout(120)
def test_a_connection_holding_its_chunks_stops_at_its_share_while_another_finishes(
        monkeypatch, fake_bind, big_memfd):
    """Two connections on one binding, each fed by its own socket into its own pages of the
    dma-buf. One never releases: it stops reading at its share (pages held <= held_limit
    after every receive), while the other receives its whole stream, verified. Then the first
    releases and gets the rest of its stream, verified too."""
    from zcnet.rx.zc import devmem
    from zcnet.rx.zc.api import Receiver

    size = 4 << 20
    pairs, rxs, nics = [], [], []
    try:
        for i in range(2):
            with socket.create_server(("127.0.0.1", 0)) as srv:
                cli = socket.create_connection(srv.getsockname())
                conn, _ = srv.accept()
            pairs.append((conn, cli))
            half = size // PAGE // 2
            nic = DevmemNic(big_memfd, size, device_share=1.0, seed=i,
                            pages=range(i * half, (i + 1) * half), heads=False)
            nics.append(nic)
            sockmod = type("socket_module", (), {"__getattr__": lambda _s, k: getattr(socket, k),
                                                 "socket": nic.socket_class()})()
            monkeypatch.setattr(devmem, "socket", sockmod)
            rxs.append(Receiver(conn, _member(big_memfd, conn.fileno(), size=size)))
        hog, other = rxs
        limit = hog.provider.binding.held_limit()
        assert limit == size // 2 // 2 // PAGE
        total = 4 << 20  # more than the hog's share, in pages of at most 4 KiB
        senders = [_send_pattern(cli, total) for _, cli in pairs]
        held = []
        while hog.provider.share_stops == 0:
            held += hog.recv(0.5)  # at its share, recv waits out the timeout for a release
            assert hog.provider.held <= limit
        assert len([c for c in held if c.offset >= 0]) == hog.provider.held
        got = 0
        for chunk in other:
            with chunk:
                assert PAT_DEVMEM.matches(chunk.stream_offset, np.frombuffer(chunk.data, np.uint8))
                got += len(chunk)
            assert hog.provider.held <= limit
        assert got == total and other.provider.held == 0
        assert not hog.recv(0.2) and hog.stalled == "exhausted"  # still at its share
        for c in held:
            assert PAT_DEVMEM.matches(c.stream_offset, np.frombuffer(c.data, np.uint8))
        expect = sum(map(len, held))
        hog.release_many(held)
        for chunk in hog:
            with chunk:
                assert chunk.stream_offset == expect
                assert PAT_DEVMEM.matches(expect, np.frombuffer(chunk.data, np.uint8))
                expect += len(chunk)
        assert expect == total
        for s in senders:
            s.join()
        assert hog.stats_dict()["share_stops"] > 0 and other.stats_dict()["members"] == 2
    finally:
        for rx in rxs:
            rx.close()
        for nic in nics:
            nic.close()
        for conn, cli in pairs:
            conn.close()
            cli.close()
    assert fake_bind[0].closed


def _child_reads(handle, offset: int, conn) -> None:  # type: ignore[no-untyped-def]
    """In a flow worker's kind of child (forkserver): the binding's view from there."""
    from zcnet.rx.zc.devmem import open_shared

    p = open_shared(-1, handle)
    conn.send((p.binding.members, p.binding.held_limit(), p.binding.owner,
               bytes(p.area.view[offset:offset + 5])))
    p.close()
    p.area.close()


@pytest.mark.timeout(60)
def test_a_binding_shared_with_another_process_maps_the_dmabuf_and_follows_the_count(
        fake_bind, big_memfd):
    """The handle a session gives its flow worker: in the child the dma-buf holds what the
    parent wrote, the member count and held limit are the owner's (three members), the child
    binds nothing and owns nothing of the binding."""
    import multiprocessing as mp
    from multiprocessing import forkserver, resource_tracker

    from zcnet.rx.zc.devmem_binding import acquire

    ctx = mp.get_context("forkserver")  # as the bench's: the handle is pickled, fds sent along
    b = acquire("eth7", [4], 4 << 20, big_memfd)
    for _ in range(2):
        acquire("eth7", [4], 4 << 20)
    try:
        os.pwrite(big_memfd, b"hello", 3 * PAGE)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child_reads, args=(b.shared(), 3 * PAGE, child))
        proc.start()
        child.close()
        assert parent.poll(30)
        assert parent.recv() == (3, b.held_limit(), False, b"hello")
        proc.join(10)
        parent.close()
        assert proc.exitcode == 0
        assert len(fake_bind) == 1 and not fake_bind[0].closed
    finally:
        for _ in range(3):
            b.quit()
        forkserver._forkserver._stop()  # type: ignore[attr-defined]  # no server left behind
        resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]
    assert fake_bind[0].closed


def test_engine_option_queues_names_a_set():
    from zcnet.errors import UsageError
    from zcnet.rx.engine import EngineOptions

    assert EngineOptions(queues="2,1,2").queue_set() == (1, 2)
    assert EngineOptions(queue=3).queue_set() == EngineOptions(queues=3).queue_set() == (3,)
    assert EngineOptions.from_mapping({"queues": 3}).queue_set() == (3,)  # --rx-opt queues=3
    assert EngineOptions(queue=2, queues="1,2").queue_set() == (1, 2)
    assert EngineOptions().queue_set() == ()
    for bad in ("", "1,x", "-1"):
        with pytest.raises(UsageError, match="expected queue ids"):
            EngineOptions(queues=bad).queue_set()
    with pytest.raises(UsageError, match="disagree"):
        EngineOptions(queue=3, queues="1,2").queue_set()


def test_a_members_socket_queue_follows_its_share(fake_bind, big_memfd, tcp_pair):
    """SO_RCVBUF is a quarter of the share (the kernel doubles it: half the share of truesize)
    and SO_RCVLOWAT at most half of that, so the queue can reach it; when a second member
    joins, the first one's next receive halves both."""
    conn, _ = tcp_pair
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1 << 20)
    p = _member(big_memfd, conn.fileno(), size=4 << 20)
    other = None
    try:
        def queue() -> tuple[int, int]:
            return (conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                    conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))

        assert queue() == (2 * (1 << 20), 512 << 10)
        other = _member(big_memfd, -1, size=4 << 20)
        p.reap(0)
        assert queue() == (2 * (512 << 10), 256 << 10) and p.rcvbuf == 512 << 10
    finally:
        for m in (p, other):
            if m is not None:
                m.close()
                m.area.close()
