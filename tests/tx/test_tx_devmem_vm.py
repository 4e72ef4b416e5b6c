"""devmem TX for real, inside a VM booted with zcnet's netdevsim test kernel (udmabuf built in):
the udmabuf's memfd view is the dma-buf's memory; netdevsim advertises netmem TX (the
scaffolding reads the dma-buf through its DMA addresses, as a NIC would, and hands the peer
ordinary pages), so the sender's bytes arrive verified at the peer with every completion
accounted for, and the kernel's own answers to a wrong binding id, a socket routed past the
device and a range past the dma-buf's end are what zcnet says they are. Scaffolding, not a
NIC: the DMA is simulated."""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
import pytest

from zcnet.errors import ClosedError, UsageError
from zcnet.lab import Lab
from zcnet.netns import in_netns
from zcnet.nic import netdev
from zcnet.nic.device import Device
from zcnet.pattern import pattern_view
from zcnet.rx.zc.area import Area
from zcnet.tx.devmem import DevmemError, DevmemMsg, open_tx_dmabuf
from zcnet.tx.senders import make_sender
from zcnet.uapi.socket import SO_ZEROCOPY, SOL_SOCKET
from zcnet.uring.dmabuf import Udmabuf

pytestmark = [pytest.mark.vm(kernel="nsim"), pytest.mark.root]

CHUNK = 256 << 10
SLOTS = 8
SENDS = 64  # 16 MiB through a 2 MiB dma-buf: every slot reused eight times
POISON = 0xA5


@pytest.fixture
def lab(no_leaks) -> Iterator[Lab]:
    with Lab(device="netdevsim", queues=2) as lab:
        yield lab


class Peer:
    """Side b: accepts one connection and reads everything until EOF in a thread."""

    def __init__(self, lab: Lab) -> None:
        with in_netns(lab.ns_b):
            self.listener = socket.create_server((lab.addr_b, 0))
        self.data = bytearray()
        self.error: BaseException | None = None
        self.conn: socket.socket | None = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.listener.settimeout(60)
            conn, _ = self.listener.accept()
            self.conn = conn
            self._ready.set()
            conn.settimeout(120)
            while chunk := conn.recv(1 << 20):
                self.data += chunk
        except OSError as exc:
            self.error = exc
        finally:
            self._ready.set()

    def connect(self, lab: Lab) -> socket.socket:
        with in_netns(lab.ns_a):
            sock = socket.create_connection(self.listener.getsockname(), timeout=60)
        sock.settimeout(None)
        self._ready.wait(60)
        return sock

    def idle(self, seconds: float = 0.5) -> bool:
        """True when nothing more arrived within ``seconds``."""
        before = len(self.data)
        select.select([], [], [], seconds)
        return len(self.data) == before

    def join(self) -> bytes:
        self.thread.join(120)
        self.listener.close()
        if self.conn is not None:
            self.conn.close()
        assert self.error is None, self.error
        return bytes(self.data)


# --- udmabuf ------------------------------------------------------------------------------------

def test_udmabuf_view_is_the_dmabufs_memory(no_leaks) -> None:
    """Written through the memfd mapping inside the write bracket, read through a mapping of
    the dma-buf fd itself (the receive side's Area): the same pages."""
    with Udmabuf(3 * 4096 + 1) as buf:
        assert buf.size == 4 * 4096 and os.lseek(buf.fd, 0, os.SEEK_END) == buf.size
        with buf.cpu_write():
            np.frombuffer(buf.view, dtype=np.uint8)[:] = pattern_view(7, buf.size)
        with Area(buf.size, dmabuf_fd=buf.fd) as area:
            area.sync(True)
            assert np.array_equal(area.array, pattern_view(7, buf.size))
            area.sync(False)
        slot = buf.view[4096:8192]
    assert buf.closed and bytes(slot[:4]) == pattern_view(4096 + 7, 4).tobytes()
    slot.release()  # the last view: the mapping goes with it (no_leaks)


# --- the send path ------------------------------------------------------------------------------

def test_devmem_stream_arrives_verified_with_every_completion_accounted(lab) -> None:
    peer = Peer(lab)
    fills: Counter[int] = Counter()
    releases: Counter[int] = Counter()
    pos = 0
    with ExitStack() as stack:
        sock = stack.enter_context(peer.connect(lab))
        with in_netns(lab.ns_a):
            buf = stack.enter_context(open_tx_dmabuf(sock, SLOTS * CHUNK))

            def on_fill(slot: int, view: memoryview) -> None:
                nonlocal pos
                assert fills[slot] == releases[slot], f"slot {slot} refilled before release"
                fills[slot] += 1
                np.frombuffer(view, dtype=np.uint8)[:] = pattern_view(pos, CHUNK)
                pos += CHUNK

            def on_release(slot: int, view: memoryview) -> None:
                releases[slot] += 1
                with buf.cpu_write():  # the kernel is done reading it: poison must never arrive
                    view[:] = bytes([POISON]) * len(view)

            sender = make_sender("devmem", sock, buf, slots=SLOTS, on_fill=on_fill,
                                 on_release=on_release)
            assert sock.getsockopt(SOL_SOCKET, socket.SO_BINDTODEVICE, 16).strip(b"\0") == \
                lab.if_a.encode()
            binding = sender.binding.id
            try:
                for _ in range(SENDS):
                    assert sender.send(CHUNK) == CHUNK
                sender.flush()
                stats = sender.stats()
                issued = sender.tracker.next_id
            finally:
                sender.close()
            with pytest.raises(ClosedError):
                sender.send(CHUNK)
            assert sender.stats() == stats  # the final counters stay readable
            with pytest.raises(DevmemError, match=f"knows no TX binding {binding}"):
                DevmemMsg(binding, SLOTS * CHUNK, lab.if_a).send(sock, 0, 4096)  # unbound
        sock.shutdown(socket.SHUT_WR)
        got = peer.join()
    assert len(got) == SENDS * CHUNK
    assert _is_the_pattern(got), "bytes at the peer differ from what was written"
    assert stats.kind == stats.path == "devmem" and stats.bytes == SENDS * CHUNK
    assert not stats.note  # a note is for a fallback, and devmem has none
    # Every call that queued bytes took one zero-copy id; every id came back, none as a copy.
    assert stats.pending == 0 and issued == stats.sends >= SENDS
    assert stats.zerocopy == stats.sends and stats.copied == 0
    assert fills == releases and sum(fills.values()) == SENDS


def _is_the_pattern(got: bytes) -> bool:
    step = 4 << 20  # pattern_view gives at most MAX_SLICE bytes at a time
    arr = np.frombuffer(got, dtype=np.uint8)
    return all(np.array_equal(arr[i:i + step], pattern_view(i, min(step, len(arr) - i)))
               for i in range(0, len(arr), step))


@pytest.fixture
def bound(lab) -> Iterator[tuple[Lab, Peer, socket.socket, netdev.DmabufBinding, Udmabuf]]:
    """Side a connected to b, bound to if_a with SO_ZEROCOPY, and a dma-buf bound for TX."""
    peer = Peer(lab)
    with ExitStack() as stack:
        sock = stack.enter_context(peer.connect(lab))
        sock.setsockopt(SOL_SOCKET, socket.SO_BINDTODEVICE, lab.if_a.encode())
        sock.setsockopt(SOL_SOCKET, SO_ZEROCOPY, 1)
        buf = stack.enter_context(Udmabuf(1 << 20))
        dev = stack.enter_context(Device.open(lab.if_a, lab.ns_a))
        binding = stack.enter_context(netdev.bind_tx(dev, buf.fd))
        yield lab, peer, sock, binding, buf
        sock.shutdown(socket.SHUT_WR)
        peer.join()


def test_wrong_binding_id_and_a_closed_binding_send_nothing(bound) -> None:
    lab, peer, sock, binding, buf = bound
    with pytest.raises(DevmemError, match=f"knows no TX binding {binding.id + 1000}") as ei:
        DevmemMsg(binding.id + 1000, buf.size, lab.if_a).send(sock, 0, 4096)
    assert ei.value.errno == errno.EINVAL
    msg = DevmemMsg(binding.id, buf.size, lab.if_a)
    assert msg.send(sock, 0, 4096) == 4096  # the right id goes
    binding.close()
    with pytest.raises(DevmemError, match=f"knows no TX binding {binding.id}"):
        msg.send(sock, 0, 4096)
    assert peer.idle() and len(peer.data) == 4096


def test_socket_routed_past_the_bound_device_is_named(bound) -> None:
    """A loopback connection in the sender's namespace with the binding's id: the kernel's
    ENODEV (its route leaves through lo), named, and nothing sent."""
    lab, _, _, binding, buf = bound
    with ExitStack() as stack:
        with in_netns(lab.ns_a):
            ls = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
            lo = stack.enter_context(socket.create_connection(ls.getsockname()))
        there = stack.enter_context(ls.accept()[0])
        lo.setsockopt(SOL_SOCKET, SO_ZEROCOPY, 1)
        with pytest.raises(DevmemError, match="route does not leave through the bound device "
                                              r"\(the socket is not bound to a device\)") as ei:
            DevmemMsg(binding.id, buf.size, lab.if_a).send(lo, 0, 4096)
        assert ei.value.errno == errno.ENODEV
        assert not select.select([there], [], [], 0.3)[0]


def test_ranges_past_the_end_what_the_kernel_does_and_why_zcnet_checks_first(bound) -> None:
    lab, peer, sock, binding, buf = bound
    msg = DevmemMsg(binding.id, buf.size, lab.if_a)
    with pytest.raises(UsageError, match="does not fit"):
        msg.send(sock, buf.size - 100, 200)
    assert peer.idle()
    # The bare call: a range wholly past the end is the kernel's EFAULT, nothing queued ...
    with pytest.raises(OSError) as ei:
        msg.sendmsg(sock.fileno(), buf.size, 4096)
    assert ei.value.errno == errno.EFAULT and peer.idle()
    # ... but one that runs past it keeps the segments filled before the end: a short count,
    # and those bytes go. That is why zcnet checks the range before the call.
    n = msg.sendmsg(sock.fileno(), buf.size - (128 << 10), 256 << 10)
    assert 0 < n <= 128 << 10
    peer.idle(1.0)
    assert len(peer.data) == n
