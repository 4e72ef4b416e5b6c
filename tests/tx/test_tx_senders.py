"""TCP send paths: every kind delivers intact data; zero-copy kinds reuse a slot only after its
completion and release each exactly once (poisoning released slots must never reach the peer)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smaps import field, smaps_entry
from zcnet.errors import UsageError, ZcnetError
from zcnet.lab import names
from zcnet.netns import in_netns
from zcnet.tx import sendzc
from zcnet.tx.senders import KINDS, MsgZerocopySender, fill_pattern, make_sender
from zcnet.uapi.socket import SO_RCVBUFFORCE, SO_ZEROCOPY
from zcnet.uring.mem import Mapping

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

CHUNK = 32 << 10
SENDS = 300
POISON = 0xEE


class Reader(threading.Thread):
    def __init__(self, sock: socket.socket, total: int) -> None:
        super().__init__()
        self.sock, self.total, self.data = sock, total, bytearray()

    def run(self) -> None:
        while len(self.data) < self.total:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return
            self.data += chunk


# devmem sends from a dma-buf bound to a device with netmem TX, which loopback is not:
# tests/tx/test_tx_devmem.py (host) and tests/tx/test_tx_devmem_vm.py (netdevsim) test it.
LOOPBACK_KINDS = sorted(k for k in KINDS if k != "devmem")


def _expected(i: int) -> np.ndarray:
    return ((np.arange(CHUNK, dtype=np.uint32) + i) % 251).astype(np.uint8)


@pytest.mark.parametrize("kind", LOOPBACK_KINDS)
def test_sends_arrive_intact_and_slots_wait_for_completion(no_leaks, tcp_pair, kind: str) -> None:
    client, server = tcp_pair
    reader = Reader(server, SENDS * CHUNK)
    reader.start()
    buf = bytearray(4 * CHUNK)
    fills: Counter[int] = Counter()
    releases: Counter[int] = Counter()
    seq = [0]
    holder: list = []

    def in_flight(slot: int) -> int:
        sender = holder[0]
        if hasattr(sender, "in_flight"):
            return sender.in_flight(slot)
        if hasattr(sender, "tracker"):
            return sender.tracker.refs(slot)
        return 0

    def on_fill(slot: int, view: memoryview) -> None:
        assert fills[slot] == releases[slot], f"slot {slot} reused before its release"
        assert in_flight(slot) == 0, f"slot {slot} reused with completions still due"
        fills[slot] += 1
        fill_pattern(view, seq[0])
        seq[0] += 1

    def on_release(slot: int, view: memoryview) -> None:
        assert in_flight(slot) == 0, f"slot {slot} released before its notification"
        releases[slot] += 1
        assert releases[slot] == fills[slot], f"slot {slot} released twice"
        view[:] = bytes([POISON]) * len(view)  # the kernel must be done reading it

    sender = make_sender(kind, client, buf, slots=4, on_fill=on_fill, on_release=on_release)
    holder.append(sender)
    try:
        for _ in range(SENDS):
            assert sender.send(CHUNK) == CHUNK
        sender.flush()
        stats = sender.stats()
    finally:
        sender.close()
    reader.join(timeout=30)
    assert len(reader.data) == SENDS * CHUNK
    got = np.frombuffer(reader.data, dtype=np.uint8).reshape(SENDS, CHUNK)
    for i in range(SENDS):
        assert np.array_equal(got[i], _expected(i)), f"send {i} damaged (poison: {POISON:#x})"
    assert fills == releases and sum(fills.values()) == SENDS
    assert stats.bytes == SENDS * CHUNK and stats.pending == 0 and not stats.note
    if kind == "copy":
        assert stats.zerocopy == stats.copied == 0
    else:
        # Loopback hands the data to a local socket, so the kernel copies every zero-copy send
        # and reports it (SO_EE_CODE_ZEROCOPY_COPIED / IORING_NOTIF_USAGE_ZC_COPIED).
        assert stats.copied == stats.sends >= SENDS and stats.zerocopy == 0


class _NoZerocopy(socket.socket):
    """A TCP socket whose SO_ZEROCOPY is refused, as by a kernel without it (ENOPROTOOPT)."""

    def setsockopt(self, level: int, opt: int, *args: object) -> None:  # type: ignore[override]
        if (level, opt) == (socket.SOL_SOCKET, SO_ZEROCOPY):
            raise OSError(errno.ENOPROTOOPT, os.strerror(errno.ENOPROTOOPT))
        super().setsockopt(level, opt, *args)  # type: ignore[arg-type]


def test_msgzc_falls_back_to_copy_with_a_note(no_leaks, tcp_pair) -> None:
    client, server = tcp_pair
    with _NoZerocopy(fileno=os.dup(client.fileno())) as a:
        sender = make_sender("msgzc", a, bytearray(4096), slots=2)
        assert sender.send(1000) == 1000
        stats = sender.stats()
        assert stats.path == "copy" and stats.kind == "msgzc" and "SO_ZEROCOPY" in stats.note
        assert server.recv(4096) == bytes(1000)
        sender.close()


def test_sendzc_falls_back_when_the_opcode_is_missing(no_leaks, tcp_pair, monkeypatch) -> None:
    client, server = tcp_pair
    monkeypatch.setattr(sendzc.bufring, "unsupported", lambda *ops: "SEND_ZC not in probe")
    sender = make_sender("sendzc", client, bytearray(8192), slots=2)
    assert sender.send(100) == 100
    assert sender.stats().note.endswith("SEND_ZC not in probe")
    assert server.recv(100) == bytes(100)
    sender.close()


@pytest.mark.parametrize("kind", LOOPBACK_KINDS)
def test_oversized_send_is_a_usage_error(no_leaks, tcp_pair, kind: str) -> None:
    sender = make_sender(kind, tcp_pair[0], bytearray(8192), slots=2)
    try:
        with pytest.raises(UsageError):
            sender.send(4097)
    finally:
        sender.close()


def test_unknown_kind_names_the_choices() -> None:
    with socket.socket() as sock, pytest.raises(UsageError, match="copy"):
        make_sender("nope", sock, bytearray(10))


@pytest.mark.parametrize("kind", LOOPBACK_KINDS)
def test_non_blocking_socket_against_a_slow_reader(no_leaks, tcp_pair, kind: str) -> None:
    """The send buffer fills (EAGAIN) while the peer is not reading; sends wait, then finish."""
    client, server = tcp_pair
    client.setblocking(False)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    # The receive buffer stays as the kernel made it: shrinking it on an established connection
    # can make the kernel drop a segment and clamp the window, and the stream then crawls.
    sends = 64
    # 16 slots hold more than both socket buffers together (64 KiB here, tcp_rmem's 128 KiB
    # default there while the peer is not reading), so the send buffer fills first.
    sender = make_sender(kind, client, bytearray(16 * CHUNK), slots=16,
                         on_fill=lambda slot, view: fill_pattern(view, slot))
    reader = Reader(server, sends * CHUNK)
    timer = threading.Timer(0.3, reader.start)  # the peer starts reading late
    timer.start()
    try:
        for _ in range(sends):
            sender.send(CHUNK)
        sender.flush()
        stats = sender.stats()
    finally:
        sender.close()
        timer.join()
        reader.join(timeout=30)
    assert len(reader.data) == sends * CHUNK and stats.pending == 0
    got = np.frombuffer(reader.data, dtype=np.uint8).reshape(sends, CHUNK)
    assert all(np.array_equal(row, _expected(int(row[0]))) for row in got)
    if kind in ("copy", "msgzc"):  # io_uring waits inside the kernel instead
        assert stats.retries > 0  # it did meet a full send buffer


@pytest.fixture
def ifb_netns():
    """A namespace whose route leads to an ifb device, which frees every packet it is given:
    nothing receives the data, so the kernel has no reason to copy and zero-copy completes as
    zero-copy. This is as far as a send gets on this machine without a NIC."""
    # Named as one side of a lab this process owns, so a killed run's namespace is swept as
    # stale and a concurrent run's is not taken for this run's leak.
    name = names.owned(os.getpid(), 900).ns_a
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for cmd in (["link", "add", "d0", "type", "ifb"],
                    ["addr", "add", "198.18.200.1/24", "dev", "d0"],
                    ["link", "set", "d0", "up"]):
            subprocess.run(["ip", "-n", name, *cmd], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


_DATAGRAM_OK = {"msgzc": MsgZerocopySender,
                "sendzc": functools.partial(sendzc.SendZcSender, fixed=True),
                "sendzc-plain": functools.partial(sendzc.SendZcSender, fixed=False)}


@pytest.mark.root
@pytest.mark.parametrize("kind", sorted(_DATAGRAM_OK))
def test_true_zero_copy_completions_at_the_device_boundary(no_leaks, ifb_netns, kind) -> None:
    with in_netns(ifb_netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.connect(("198.18.200.2", 9))
        releases: Counter[int] = Counter()
        # The classes, not make_sender: it takes TCP only, and TCP cannot complete zero-copy
        # here (a peer on this machine makes the kernel copy; into the ifb no ACK comes back).
        sender = _DATAGRAM_OK[kind](sock, bytearray(4 * 4096), slots=4,
                                    on_release=lambda slot, view: releases.update([slot]))
        try:
            for _ in range(100):
                sender.send(1200)
            sender.flush()
            stats = sender.stats()
        finally:
            sender.close()
    assert stats.path == kind and stats.sends == 100
    assert stats.zerocopy == 100 and stats.copied == 0
    assert sum(releases.values()) == 100


ETH_P_ALL = 0x0003
SOL_PACKET = 263          # linux/socket.h
PACKET_STATISTICS = 6     # linux/if_packet.h: struct tpacket_stats {tp_packets, tp_drops}
MADV_HUGEPAGE = 14
DGRAM = 1200
TAP_SENDS = 60
HUGE = 2 << 20


@pytest.fixture
def ifb_tap(ifb_netns):
    """The ifb namespace, with a token bucket on d0 slow enough that packets wait in it (the
    kernel transmits, and reads the sender's memory, well after the send call returned) and a
    packet socket capturing every frame d0 transmits: the bytes a receiver on the wire gets.

    The tap's receive buffer is forced far above what its frames need: the kernel charges a
    captured SEND_ZC frame from a registered buffer PAGE_ALIGN(offset in the folio + length),
    so a send buffer on a transparent huge page costs up to 2 MiB per 1242-byte frame, and 60
    of them overflow any rmem_max-capped buffer (frames dropped, never seen)."""
    subprocess.run(["ip", "netns", "exec", ifb_netns, "tc", "qdisc", "add", "dev", "d0", "root",
                    "tbf", "rate", "4mbit", "burst", "1600", "latency", "5s"],
                   check=True, capture_output=True)
    with in_netns(ifb_netns):
        tap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    with tap:
        tap.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, (TAP_SENDS + 4) * (HUGE + 8192))
        tap.bind(("d0", 0))
        yield ifb_netns, tap


def _udp_payloads(tap: socket.socket) -> list[bytes]:
    """Payloads of the UDP datagrams to 198.18.200.2:9 queued on the tap, parsed by hand
    (Ethernet 14 bytes, IPv4 header of IHL words, UDP 8 bytes). No wait: the tap gets its copy
    of a frame in the transmit path before the device frees it, and only that free completes
    the zero-copy send, so after flush() every frame the device sent is already queued."""
    out = []
    while True:
        try:
            frame = tap.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return out
        if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 17 or ip[16:20] != socket.inet_aton("198.18.200.2"):
            continue
        udp = ip[ihl:]
        if int.from_bytes(udp[2:4], "big") == 9:
            out.append(bytes(udp[8:int.from_bytes(udp[4:6], "big")]))


def _datagram(seq: int) -> bytes:
    return seq.to_bytes(4, "big") + bytes((seq + i) % 251 for i in range(DGRAM - 4))


@contextlib.contextmanager
def _send_buffer(memory: str, size: int) -> Iterator[Any]:
    """``size`` bytes of sender memory: from the heap, or 1 MiB into a transparent huge page
    (what a buffer on a heap that numpy marked MADV_HUGEPAGE gets in a long test run)."""
    if memory == "heap":
        yield bytearray(size)
        return
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("transparent huge pages are off on this kernel")
    with Mapping.anonymous(2 * HUGE, populate=False) as m:
        start = -m.addr % HUGE
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        if libc.madvise(m.addr + start, HUGE, MADV_HUGEPAGE):
            pytest.skip(f"madvise(MADV_HUGEPAGE): {os.strerror(ctypes.get_errno())}")
        m.view(np.uint8, start, HUGE)[:] = 1  # the first touch faults in the huge page
        if not _anon_huge_kib(m.addr):
            pytest.skip("no transparent huge page available for the send buffer")
        yield m.view(np.uint8, start + (1 << 20), size)


def _anon_huge_kib(addr: int) -> int:
    """AnonHugePages of the mapping that holds ``addr`` (/proc/self/smaps)."""
    huge = field(smaps_entry(addr), "AnonHugePages")  # ["N", "kB"]
    return int(huge[0]) if huge else 0


@pytest.mark.root
@pytest.mark.timeout(120)
@pytest.mark.parametrize("memory", ["heap", "thp"])
@pytest.mark.parametrize("kind", sorted(_DATAGRAM_OK))
def test_released_slots_poisoned_at_once_never_reach_the_wire(no_leaks, ifb_tap, kind,
                                                              memory) -> None:
    """Each slot is poisoned the moment the sender releases it; the packets wait in the qdisc
    while the kernel still points at the slots, so a slot released before the kernel is done
    puts poison on the wire. What the wire got is read from the packet tap, not the sender."""
    ns, tap = ifb_tap
    seq = [0]

    def on_fill(slot: int, view: memoryview) -> None:
        view[:DGRAM] = _datagram(seq[0])
        seq[0] += 1

    def on_release(slot: int, view: memoryview) -> None:
        view[:] = bytes([POISON]) * len(view)

    with in_netns(ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock, _send_buffer(memory, 4 * 4096) as buf:
        sock.connect(("198.18.200.2", 9))
        # The tap sees datagrams one per send, so the sender class is built directly:
        # make_sender accepts only TCP sockets.
        sender = KINDS[kind](sock, buf, 4, on_fill, on_release)
        try:
            for _ in range(TAP_SENDS):
                sender.send(DGRAM)
            sender.flush()
            stats = sender.stats()
        finally:
            sender.close()
    assert stats.path == kind and not stats.note
    got = _udp_payloads(tap)
    packets, drops = struct.unpack("II", tap.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    assert len(got) == TAP_SENDS, \
        f"the tap holds {len(got)} of {TAP_SENDS} datagrams ({packets} frames, {drops} dropped)"
    for i, payload in enumerate(got):
        assert payload == _datagram(i), \
            f"datagram {i} on the wire is not what was sent (poison {POISON:#x}: " \
            f"{payload.count(POISON)} bytes)"
    # The window was real: the token bucket held packets back (it counts each time it had to).
    qd = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev",
                         "d0"], check=True, capture_output=True, text=True).stdout
    (tbf,) = [q for q in json.loads(qd) if q["kind"] == "tbf"]
    assert tbf["overlimits"] > 0 and tbf["packets"] >= TAP_SENDS


# --- SendZcSender, case by case ----------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "fixed_calls"), [({}, 1), ({"fixed": True}, 1),
                                                     ({"fixed": False}, 0)])
def test_sendzc_sends_from_the_registered_buffer_unless_told_otherwise(
        tcp_pair, monkeypatch, kwargs, fixed_calls) -> None:
    """The default is the registered (fixed) buffer; which SQE is written is the only place
    the choice shows before the kernel."""
    calls = Counter()
    for name in ("prep_send_zc", "prep_send_zc_fixed"):
        real = getattr(sendzc, name)
        monkeypatch.setattr(sendzc, name,
                            lambda *a, _n=name, _r=real, **k: calls.update([_n]) or _r(*a, **k))
    client, server = tcp_pair
    s = sendzc.SendZcSender(client, bytearray(8192), 2, **kwargs)
    try:
        assert s.send(100) == 100
        s.flush()
    finally:
        s.close()
    assert server.recv(100) == bytes(100)
    assert calls == Counter({"prep_send_zc_fixed": fixed_calls, "prep_send_zc": 1 - fixed_calls})


def test_sendzc_setup_refusals_fall_back_to_copy_naming_the_reason(tcp_pair, monkeypatch) -> None:
    client, _ = tcp_pair

    def no_ring(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(sendzc, "Ring", no_ring)
    s = make_sender("sendzc", client, bytearray(8192), slots=2)
    assert s.stats().note == ("sendzc unavailable, sent by copy: io_uring unavailable: "
                              f"{os.strerror(errno.ENOSYS)}")
    monkeypatch.undo()

    def no_register(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setattr(sendzc.bufring, "register_buffers", no_register)
    s = make_sender("sendzc", client, bytearray(8192), slots=2)
    assert s.stats().note == ("sendzc unavailable, sent by copy: registering the send buffer "
                              f"failed: {os.strerror(errno.ENOMEM)}")


@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_on_a_shut_down_socket_raises_and_gives_the_slot_back(tcp_pair, fixed) -> None:
    """A send the kernel refuses at once posts one CQE and no notification: the error names
    SEND_ZC, and the slot comes back (nothing of it is in flight)."""
    client, _ = tcp_pair
    client.shutdown(socket.SHUT_WR)
    released: list[int] = []
    s = sendzc.SendZcSender(client, bytearray(8192), 2, None,
                            lambda slot, view: released.append(slot), fixed=fixed)
    try:
        with pytest.raises(OSError) as ei:
            s.send(100)
        assert ei.value.errno == errno.EPIPE
        assert ei.value.strerror == f"SEND_ZC: {os.strerror(errno.EPIPE)}"
        assert released == [0] and s.outstanding == 0
    finally:
        s.close()


def _small_buffered_pair() -> tuple[socket.socket, socket.socket]:
    """A loopback pair whose send and receive buffers are small, so that a send of a few MiB
    must wait for the reader."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 << 10)
    client.connect(ls.getsockname())
    server, _ = ls.accept()
    ls.close()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
    return client, server


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_cut_short_by_a_reset_resumes_then_raises_and_frees_the_slot_once(fixed) -> None:
    """A peer that resets mid-send: the kernel ends the waiting SEND_ZC with the bytes it got
    out (a short result), the sender sends the rest from the same slot, and that send's error
    reaches the caller: a send never reports bytes it did not send. Every notification is
    accounted for and the slot comes back exactly once."""
    client, server = _small_buffered_pair()
    released: list[int] = []
    s = sendzc.SendZcSender(client, sendzc.send_buffer(8 << 20), 1, None,
                            lambda slot, view: released.append(slot), fixed=fixed)
    got: list[object] = []

    def send() -> None:
        try:
            got.append(s.send(8 << 20))
        except OSError as exc:
            got.append(exc)

    t = threading.Thread(target=send)
    try:
        t.start()
        queued = 0
        while not queued and t.is_alive():  # the first bytes are out: the send is waiting
            queued = struct.unpack("i", fcntl.ioctl(server.fileno(), termios.FIONREAD,
                                                    b"\0" * 4))[0]
            time.sleep(0.001)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()  # RST
        t.join()
        assert len(got) == 1 and isinstance(got[0], OSError), got
        assert got[0].errno in (errno.EPIPE, errno.ECONNRESET)
        assert got[0].strerror.startswith("SEND_ZC: ")
        assert s.stats().sends == 2  # the short send and its resumption
        s.flush()
        assert s.outstanding == 0 and released == [0]
    finally:
        s.close()
        client.close()
        server.close()
    assert released == [0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_waits_in_the_kernel_for_a_slow_reader_one_request_per_send(fixed) -> None:
    """MSG_WAITALL: a send larger than the socket buffers completes in the kernel as one
    request, whatever the reader's pace, and the bytes arrive intact."""
    client, server = _small_buffered_pair()
    buf = sendzc.send_buffer(4 << 20)
    buf[:] = os.urandom(len(buf))
    s = sendzc.SendZcSender(client, buf, 1, fixed=fixed)
    received = bytearray()

    def read() -> None:
        while len(received) < len(buf):
            part = server.recv(8 << 10)
            if not part:
                return
            received.extend(part)

    t = threading.Thread(target=read)
    try:
        t.start()
        assert s.send(len(buf)) == len(buf)
        s.flush()
        t.join()
        assert received == buf[:]
        assert s.stats().sends == 1
    finally:
        s.close()
        server.shutdown(socket.SHUT_RDWR)  # wakes the reader if the send failed
        t.join()
        client.close()
        server.close()


def test_sendzc_close_survives_a_flush_that_gives_up(tcp_pair) -> None:
    from zcnet.errors import ZcnetError

    client, _ = tcp_pair
    s = sendzc.SendZcSender(client, bytearray(8192), 2)

    def stuck() -> None:
        raise ZcnetError("1 zero-copy sends still unacknowledged after 5 s")

    s.flush = stuck  # type: ignore[method-assign]
    s.close()
    assert s.ring.fd < 0  # the ring is closed all the same


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["msgzc", "sendzc"])
def test_one_slot_is_reused_after_each_notification(tcp_pair, kind) -> None:
    """With a single slot every send waits for the previous one's notification (one CQE), and
    the data arrives in order."""
    client, server = tcp_pair
    reader = Reader(server, 20 * 1000)
    reader.start()
    s = make_sender(kind, client, bytearray(4096), slots=1,
                    on_fill=lambda slot, view: fill_pattern(view, 0))
    try:
        for _ in range(20):
            assert s.send(1000) == 1000
        s.flush()
    finally:
        s.close()
    reader.join(timeout=30)
    assert len(reader.data) == 20 * 1000


class _Interrupted(Exception):
    pass


def _alarm(_sig: int, _frame: object) -> None:
    raise _Interrupted


@pytest.fixture
def stalled_pair():
    """A loopback TCP pair whose receiver never reads, with small buffers on both sides."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.connect(ls.getsockname())
    server, _ = ls.accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ls.close()
    old = signal.signal(signal.SIGALRM, _alarm)
    yield client, server
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
    client.close()
    server.close()


@pytest.mark.timeout(60, method="thread")  # the test uses SIGALRM itself
@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_flush_and_close_end_by_their_deadline_when_the_peer_stalls(
        no_leaks, stalled_pair, fixed: bool) -> None:
    client, _server = stalled_pair
    buf = bytearray(8 << 20)
    s = sendzc.SendZcSender(client, buf, slots=1, fixed=fixed)
    try:
        # The send cannot complete (nobody reads): interrupt it as Ctrl-C would.
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted):
            s.send(len(buf))
        assert s.outstanding
        # flush(timeout) must give up after about that long, not wait for the peer forever.
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # the failure guard
        enters = _count_calls(s.ring, "submit")
        with pytest.raises(ZcnetError) as stuck:
            s.flush(timeout=0.3)
        assert stuck.value.message == \
            f"{s.outstanding} zero-copy sends still unacknowledged after 0.3 s"
        assert s.outstanding >= 1
        # One enter that sleeps out the deadline, perhaps one more if the kernel woke early; a
        # flush that spun instead of sleeping in the kernel would enter over and over.
        assert 1 <= enters[0] <= 3, f"flush entered the kernel {enters[0]} times"
        signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        # Giving up on the connection ends the parked send, so close() returns at once.
        client.shutdown(socket.SHUT_RDWR)
        signal.setitimer(signal.ITIMER_REAL, 10.0)
        s.close()
        signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.mark.timeout(60, method="thread")  # the test uses SIGALRM itself
@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_send_to_a_peer_that_never_reads_raises_stuck_by_its_deadline(
        no_leaks, stalled_pair, fixed: bool) -> None:
    """A send that cannot complete (nobody reads, small socket buffers) raises the stuck error
    naming the causes and the fix once its timeout has passed, instead of hanging; a later
    send() waits for that one first, and raises the same way while it is parked."""
    client, _server = stalled_pair
    buf = sendzc.send_buffer(8 << 20)
    s = sendzc.SendZcSender(client, buf, slots=2, fixed=fixed)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # the failure guard: a hang ends here
        for _ in range(2):
            with pytest.raises(ZcnetError) as stuck:
                s.send(4 << 20, timeout=0.3)
            assert stuck.value.message == \
                f"{s.outstanding} zero-copy sends still unacknowledged after 0.3 s"
            assert "SO_SNDBUF" in (stuck.value.hint or "")
            assert "send_buffer" in (stuck.value.hint or "")
            assert s.outstanding == 1  # the first send, still parked; the second never began
        assert s.stats().bytes == 0
        signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        client.shutdown(socket.SHUT_RDWR)  # ends the parked send
        signal.setitimer(signal.ITIMER_REAL, 10.0)
        s.close()
        signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.mark.timeout(60)
def test_sendzc_send_after_a_deadline_keeps_the_stream_in_order(no_leaks) -> None:
    """The send that outlived its deadline is not lost or overtaken: once the peer reads, the
    next send() completes after it and the peer gets both, in order."""
    client, server = _small_buffered_pair()
    buf = sendzc.send_buffer(2 << 20)
    fills = iter(range(2))  # each send's slot gets the pattern of its own seed
    s = sendzc.SendZcSender(client, buf, 2, lambda slot, view: fill_pattern(view, next(fills)))
    received = bytearray()
    try:
        with pytest.raises(ZcnetError, match="unacknowledged"):
            s.send(1 << 20, timeout=0.2)
        t = threading.Thread(target=lambda: received.extend(_read_all(server, 2 << 20)))
        t.start()
        assert s.send(1 << 20) == 1 << 20
        s.flush()
        t.join(30)
        assert not t.is_alive()
        expected = bytearray(2 << 20)
        fill_pattern(memoryview(expected)[:1 << 20], 0)
        fill_pattern(memoryview(expected)[1 << 20:], 1)
        assert received == expected
    finally:
        s.close()
        client.close()
        server.close()


def _read_all(sock: socket.socket, total: int) -> bytes:
    got = bytearray()
    while len(got) < total:
        part = sock.recv(1 << 16)
        if not part:
            break
        got += part
    return bytes(got)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "1"])
def test_sendzc_send_refuses_a_bad_timeout_before_sending(tcp_pair, timeout: object) -> None:
    client, _ = tcp_pair
    s = sendzc.SendZcSender(client, sendzc.send_buffer(1 << 16), 2)
    try:
        with pytest.raises(UsageError, match="timeout"):
            s.send(1000, timeout=timeout)  # type: ignore[arg-type]
        assert s.stats().sends == 0
    finally:
        s.close()


def test_send_buffer_is_never_a_transparent_huge_page(no_leaks) -> None:
    """send_buffer() memory is marked never to become a THP (VM_NOHUGEPAGE: "nh" in smaps'
    VmFlags), so it stays off THP whatever the system's THP mode, and the kernel says it is
    not eligible (THPeligible 0)."""
    m = sendzc.send_buffer(8 << 20)
    try:
        entry = smaps_entry(ctypes.addressof(ctypes.c_char.from_buffer(m)))
        assert "nh" in field(entry, "VmFlags"), entry
        # THPeligible exists from Linux 5.0 on
        assert field(entry, "THPeligible") in ([], ["0"]), entry
    finally:
        m.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("memory", ["thp", "send_buffer"])
def test_registered_send_from_inside_a_huge_page_ends_by_its_deadline(no_leaks, memory) -> None:
    """The product risk: a registered SEND_ZC from 1 MiB into a transparent huge page through a
    small SO_SNDBUF may park for good although the peer reads (it does on this Linux 6.x);
    send() then raises the stuck error by its deadline instead of hanging. From send_buffer()
    memory the same send completes and the bytes arrive."""
    n = 1 << 20
    client, server = _small_buffered_pair()
    got = bytearray()
    t = threading.Thread(target=lambda: got.extend(_read_all(server, n)))
    try:
        with contextlib.ExitStack() as stack:
            if memory == "thp":
                buf = stack.enter_context(_send_buffer("thp", n))
            else:  # the same offset; the mapping goes with the last view of it
                buf = np.frombuffer(sendzc.send_buffer(2 * n), np.uint8)[n:]
            fill_pattern(memoryview(buf), 7)
            s = stack.enter_context(contextlib.closing(
                sendzc.SendZcSender(client, buf, 1, fixed=True)))
            t.start()
            try:
                outcome = str(s.send(n, timeout=2.0))
            except ZcnetError as exc:  # kept as text: the traceback would hold the buffer
                outcome = str(exc)
            client.shutdown(socket.SHUT_WR if outcome == str(n) else socket.SHUT_RDWR)
        t.join(30)
        if memory == "send_buffer":
            assert outcome == str(n)
            expected = bytearray(n)
            fill_pattern(memoryview(expected), 7)
            assert got == expected
        elif outcome != str(n):  # parked: named, not a hang (a fair kernel would send it)
            assert "unacknowledged after 2 s" in outcome, outcome
            assert "transparent huge pages" in outcome, outcome
    finally:
        client.close()
        server.close()
        if t.ident is not None:
            t.join(30)


def _count_calls(obj: object, name: str) -> list[int]:
    """Count calls of ``obj.name`` from now on (the count is element 0 of the returned list)."""
    count = [0]
    real = getattr(obj, name)

    def counted(*a: object, **kw: object) -> object:
        count[0] += 1
        return real(*a, **kw)

    setattr(obj, name, counted)
    return count


@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_calls_after_close_name_themselves(tcp_pair, fixed) -> None:
    from zcnet.errors import ClosedError

    client, _ = tcp_pair
    s = sendzc.SendZcSender(client, bytearray(8192), fixed=fixed)
    assert len(s.slots) == 8  # the default
    s.close()
    s.close()  # twice is harmless
    calls = {"send": lambda: s.send(10), "in_flight": lambda: s.in_flight(0), "flush": s.flush}
    for name, call in calls.items():
        with pytest.raises(ClosedError) as ei:
            call()
        assert ei.value.message == f"{name}() on a closed SendZcSender"


@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_sends_from_a_buffer_of_any_length(tcp_pair, fixed) -> None:
    """A buffer whose length is no multiple of 8 (3 slots of 4115 bytes): every send carries
    the bytes its slot was filled with."""
    client, server = tcp_pair
    size = 4115
    sent: list[bytes] = []

    def fill(slot: int, view: memoryview) -> None:
        data = bytes((len(sent) * 37 + j) % 251 for j in range(size))
        view[:size] = data
        sent.append(data)

    s = sendzc.SendZcSender(client, bytearray(3 * size), 3, fill, fixed=fixed)
    try:
        for _ in range(6):
            s.send(size)
        s.flush()
    finally:
        s.close()
    got = b""
    while len(got) < 6 * size:
        got += server.recv(1 << 16)
    assert got == b"".join(sent)


def _sndtimeo(sock: socket.socket) -> bytes:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)


@pytest.mark.timeout(60, method="thread")  # the test uses SIGALRM itself
@pytest.mark.parametrize("kind", ["copy", "msgzc"])
@pytest.mark.parametrize("blocking", [True, False])
def test_send_to_a_peer_that_never_reads_ends_by_its_deadline(
        no_leaks, stalled_pair, kind: str, blocking: bool) -> None:
    """copy and msgzc sends to a peer that never reads raise a clear error once their timeout
    has passed, on a blocking socket too (where a plain send() would sleep in the kernel for
    good), instead of hanging; the socket's own SO_SNDTIMEO is back after close()."""
    client, server = stalled_pair
    client.setblocking(blocking)
    own = _sndtimeo(client)
    s = make_sender(kind, client, bytearray(8 << 20), slots=2)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # the failure guard: a hang ends here
        t0 = time.monotonic()
        with pytest.raises(ZcnetError) as e:
            for _ in range(4):  # msgzc: the slots fill with unacknowledged sends first
                s.send(4 << 20, timeout=0.5)
        waited = time.monotonic() - t0
        signal.setitimer(signal.ITIMER_REAL, 0)
        if kind == "copy":
            assert e.value.message.startswith(f"send of {4 << 20} B stalled: ")
            assert "the rest was not sent" in e.value.message
        else:
            assert "zero-copy sends still unacknowledged after 0.5 s" in e.value.message
        assert "peer stopped reading" in (e.value.hint or "")
        # Each wait is bounded (SO_SNDTIMEO or poll), so it ends within a step of the deadline.
        assert waited < 0.5 + 5, f"took {waited:.1f} s"
    finally:
        # The peer resets: the kernel drops what it held, so msgzc's close() has no
        # notifications left to wait for.
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()
        signal.setitimer(signal.ITIMER_REAL, 10.0)
        s.close()
        signal.setitimer(signal.ITIMER_REAL, 0)
    assert _sndtimeo(client) == own


@pytest.mark.parametrize("kind", ["copy", "msgzc"])
def test_send_timeout_is_checked(no_leaks, tcp_pair, kind: str) -> None:
    client, _server = tcp_pair
    s = make_sender(kind, client, bytearray(1 << 16), slots=1)
    try:
        with pytest.raises(UsageError, match="timeout"):
            s.send(100, timeout=-1)
    finally:
        s.close()
