"""Helpers for the zero-copy receive tests (soft provider here, zcrx copy mode in the vm):
a pattern sender, checks against the pattern, and the receive loops the tests share."""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from zcnet.pattern import StreamPattern
from zcnet.rx.zc import Chunk, Receiver

PAT = StreamPattern(seed=4)


class Sender(threading.Thread):
    """Sends ``total`` pattern bytes (from pattern offset ``base``), then closes (or resets when
    ``reset`` is set and the receiver signals ``go_reset``)."""

    def __init__(self, sock: socket.socket, total: int, *, piece: int = 1 << 20,
                 reset: bool = False, base: int = 0) -> None:
        super().__init__(daemon=True)
        self.sock, self.total, self.piece, self.reset = sock, total, piece, reset
        self.base = base
        self.go_reset = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            off = 0
            while off < self.total:
                n = min(self.piece, self.total - off)
                self.sock.sendall(PAT.expected(self.base + off, n))
                off += n
            if self.reset:
                self.go_reset.wait(10)
                # SO_LINGER {on, 0}: close sends RST instead of FIN.
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                self.sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            self.error = e
        finally:
            self.sock.close()


def check(chunk: Chunk) -> None:
    assert PAT.matches(chunk.stream_offset, chunk.array), (
        f"bad byte at stream offset {chunk.stream_offset}"
        f"+{PAT.first_mismatch(chunk.stream_offset, chunk.array)}")


def hold_until_stalled(rx, want: str) -> list[Chunk]:
    held: list[Chunk] = []
    for _ in range(10_000):
        got = rx.recv(timeout=0.2)
        held.extend(got)
        if not got and rx.stalled == want:
            return held
    raise AssertionError(f"receiver never reported {want}; stalled={rx.stalled}")


def release_in_thread(rx: Receiver) -> tuple[int, list[BaseException]]:
    """Iterate ``rx`` to EOF in this (the owner) thread while a consumer thread checks every
    chunk against PAT and releases it; (bytes verified, the consumer's errors)."""
    work: queue.SimpleQueue[Chunk | None] = queue.SimpleQueue()
    verified = [0]
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            while (c := work.get()) is not None:
                check(c)
                verified[0] += len(c)
                c.release()
        except BaseException as e:  # reported by the caller
            errors.append(e)

    th = threading.Thread(target=consume)
    th.start()
    try:
        for c in rx:
            work.put(c)
    finally:
        work.put(None)
        th.join()
    return verified[0], errors


def check_to_eof(rx: Receiver) -> int:
    """Iterate ``rx`` to EOF, checking every chunk against PAT and releasing it; the bytes."""
    got = 0
    for c in rx:
        check(c)
        got += len(c)
        c.release()
    return got


def mapped(addr: int) -> bool:
    """Whether ``addr`` lies in any mapping of this process (anonymous ones included)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return True
    return False


def open_asking_for_hugetlb(open_provider):  # type: ignore[no-untyped-def]
    """``open_provider()`` (called with hugetlb=True); asserts that its area got 2 MiB pages or
    warned that there were none. Returns the provider."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prov = open_provider()
    fell_back = any("hugetlb" in str(w.message) for w in caught)
    if not (prov.area.kind == "hugetlb" or (prov.area.kind == "anon" and fell_back)):
        prov.close()
        prov.area.close()
        raise AssertionError(f"hugetlb asked for, area is {prov.area.kind} without a warning")
    return prov


MIB = 1 << 20


def connections(stack: ExitStack, n: int) -> list[tuple[socket.socket, socket.socket]]:
    """``n`` loopback TCP connections: (receiving, sending) pairs, closed with ``stack``."""
    ls = stack.enter_context(socket.socket())
    ls.bind(("127.0.0.1", 0))
    ls.listen(n)
    out = []
    for _ in range(n):
        c = stack.enter_context(socket.create_connection(ls.getsockname()))
        s, _ = ls.accept()
        stack.enter_context(s)
        out.append((s, c))
    return out


class ZcrxServer:
    """One thread serving every connection of a queue: ``ready()``, then ``recv(0)`` on each
    one it names; each chunk checked at its connection's pattern offset (connection i's stream
    starts at pattern offset i MiB, so a chunk routed to another connection fails)."""

    def __init__(self, zq, socks: list[socket.socket], *, hold: frozenset[int] = frozenset(),
                 first: int = 0):
        self.zq = zq
        self.rx = [Receiver(s, zq.join(s.fileno()), max_held=1.0) for s in socks]
        self.by_member = {rx.provider.mid: i for i, rx in enumerate(self.rx)}
        self.got = [0] * len(socks)
        self.done_at: list[float | None] = [None] * len(socks)
        self.errors: dict[int, OSError] = {}
        self.hold = hold
        self.kept: list = []
        self.most_held = 0
        self.first = first  # the pattern index of socks[0] (pattern offset first MiB)

    def run(self, until, timeout: float = 120) -> None:
        start = time.monotonic()
        while not until():
            assert time.monotonic() - start < timeout, f"stuck: {self.got}"
            for m in self.zq.ready(0.2):
                i = self.by_member.get(m.mid)
                if i is None or self.rx[i].closed:
                    continue
                rx = self.rx[i]
                try:
                    chunks = rx.recv(0)
                except OSError as e:
                    self.errors[i] = e
                    self.done_at[i] = time.monotonic()
                    continue
                for c in chunks:
                    assert c.stream_offset == self.got[i]
                    assert PAT.matches((self.first + i) * MIB + c.stream_offset, c.array), (
                        f"connection {i}: wrong bytes at {c.stream_offset}")
                    self.got[i] += c.length
                    (self.kept.append(c) if i in self.hold else c.release())
                if rx.eof and self.done_at[i] is None:
                    self.done_at[i] = time.monotonic()
            share = self.zq.share_bytes()
            for rx in self.rx:
                if not rx.closed:
                    st = rx.stats  # the bytes its receiver holds (delivered, not released)
                    held = st.delivered_bytes - st.released_bytes
                    self.most_held = max(self.most_held, held)
                    assert held <= share

    def finished(self, i: int) -> bool:
        return self.done_at[i] is not None


def _send_round_robin(socks: list[socket.socket], total: int, piece: int) -> None:
    for s in socks:  # the parent's copies stay open: only the child sends
        s.setblocking(True)
    for off in range(0, total, piece):
        for i, s in enumerate(socks):
            s.sendall(PAT.expected(i * MIB + off, min(piece, total - off)))
    for s in socks:
        s.shutdown(socket.SHUT_WR)


def send_from_child(socks: list[socket.socket], total: int, piece: int = 64 << 10):
    """Send ``total`` bytes on each socket (socket i from pattern offset i MiB) from a forked
    child, round robin: the test process makes no thread (each would keep a malloc arena
    mapped, which the leak check counts). Returns the started process; join it."""
    import multiprocessing as mp

    p = mp.get_context("fork").Process(target=_send_round_robin, args=(socks, total, piece))
    p.start()
    return p


def serve_imported(handoff, socks: list[socket.socket], first: int, conn) -> None:
    """A worker process's side of a hosted zcrx queue (zcnet.rx.zc.zcrx_procs): import it,
    serve ``socks`` (pattern index ``first`` on) with ZcrxServer until each ends, and send
    back what it saw: (bytes per connection, errors, members seen, its share, refill entries
    it wrote, the kernel's copy count)."""
    from zcnet.rx.zc.zcrx_procs import import_queue

    try:
        zq = import_queue(handoff, shared=True)  # stays open after its connections
        srv = ZcrxServer(zq, socks, first=first)
        members = zq.mem.members
        share = zq.share_bytes()
        conn.send("joined")
        srv.run(lambda: all(map(srv.finished, range(len(socks)))), timeout=300)
        for rx in srv.rx:
            rx.close()
        zq.ready(0)
        produced, delivered = zq.rq.produced, sum(rx.stats.delivered for rx in srv.rx)
        assert zq.close()
        conn.send((srv.got, {i: str(e) for i, e in srv.errors.items()}, members, share,
                   produced, delivered))
    except BaseException as e:  # reported to the test
        conn.send(f"error: {e!r}")
        raise
