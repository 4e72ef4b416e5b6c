"""The Receiver against a scripted provider: what it hands out (chunks, coalescing, linear
copies, reprs, errors) and exactly what it gives back to the provider, for deliveries chosen
by the test rather than by the kernel's timing."""

from __future__ import annotations

import math
import os
import socket

import pytest
from test_zc_zcrx import FakeGenl

from fake_zcrx_kernel import FakeKernel, Stream
from zcnet.errors import ClosedError
from zcnet.rx.zc import netqueue, open_receiver, zcrx, zcrx_rings
from zcnet.rx.zc.api import CoalescedChunk, LinearChunk, Receiver
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.core import RxCore
from zcnet.rx.zc.provider import CopyCount, Delivery, ProviderBase

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


class ScriptedProvider(ProviderBase):
    """Delivers the given Deliveries one per reap (then EOF), records every recycle call."""

    name = "scripted"
    note = ""
    ring = None

    def __init__(self, *deliveries: Delivery) -> None:
        self.area = Area(1 << 20)
        self.script = list(deliveries)
        self.recycled: list[tuple[list[int], list[int]]] = []

    def arm(self) -> None:
        pass

    def can_arm(self) -> bool:
        return True

    def reap(self, timeout: float | None) -> Delivery:
        return self.script.pop(0) if self.script else Delivery(end=0)

    def recycle(self, tokens: list[int], lengths: list[int]) -> None:
        if len(tokens):  # a list, or a numpy array from a vectorized batch
            self.recycled.append((list(tokens), list(lengths)))

    def extra_stats(self) -> dict[str, int]:
        return {}

    def kernel_copy(self) -> CopyCount:
        return CopyCount(None, "scripted: no kernel")

    def close(self, armed: bool = False) -> bool:
        return True


def delivery(offsets, lengths, tokens, linear=None) -> Delivery:  # type: ignore[no-untyped-def]
    return Delivery(list(offsets), list(lengths), list(tokens), dict(linear or {}))


@pytest.fixture
def rx_for():
    made: list[Receiver] = []

    def make(*deliveries: Delivery, coalesce: bool = False,
             kind: type[ScriptedProvider] = ScriptedProvider) -> Receiver:
        made.append(Receiver(-1, kind(*deliveries), coalesce=coalesce))
        return made[-1]

    yield make
    for rx in made:
        rx.close()


def test_coalescing_merges_neighbours_only_and_gives_each_token_back(rx_for):
    rx = rx_for(delivery([0, 100, 4096, 8192, 8292], [100, 200, 50, 100, 7], [10, 11, 12, 13, 14]),
                delivery([0, 300], [300, 1], [20, 21]), coalesce=True)
    a, b, c = rx.recv()
    assert isinstance(a, CoalescedChunk) and (a.offset, len(a), a.parts) == (0, 300, 2)
    assert type(b).__name__ == "Chunk" and (b.offset, len(b), b.parts) == (4096, 50, 1)
    assert isinstance(c, CoalescedChunk) and (c.offset, len(c), c.parts) == (8192, 107, 2)
    assert [x.stream_offset for x in (a, b, c)] == [0, 300, 350]
    assert rx.stats.coalesced == 2
    rx.release_many([c, a, b])
    (d,) = rx.recv()  # exactly two neighbours: one chunk
    assert (d.offset, len(d), d.parts, d.stream_offset) == (0, 301, 2, 457)
    assert rx.stats.coalesced == 3
    d.release()
    assert rx.recv() == [] and rx.eof
    assert rx.provider.recycled == [([13, 14, 10, 11, 12], [100, 7, 100, 200, 50]),
                                    ([20, 21], [300, 1])]


def test_linear_copies_sit_at_their_stream_offset_and_return_token_minus_one(rx_for):
    rx = rx_for(delivery([-1, 0, -1], [3, 5, 2], [-1, 7, -1], {0: b"abc", 2: b"xy"}))
    rx.area.view[0:5] = b"HELLO"
    got = rx.recv()
    assert [type(c) for c in got] == [LinearChunk, type(got[1]), LinearChunk]
    assert [(c.stream_offset, bytes(c.data)) for c in got] == \
        [(0, b"abc"), (3, b"HELLO"), (8, b"xy")]
    assert rx.stats.linear == 5
    rx.release_many(got)
    rx.flush()
    assert rx.provider.recycled == [([-1, 7, -1], [3, 5, 2])]


def test_batches_return_their_tokens_and_views_follow_the_stream(rx_for):
    rx = rx_for(delivery([-1, 4096], [2, 3], [-1, 9], {0: b"ab"}),
                delivery([0, 100], [100, 50], [1, 2]))
    rx.area.view[4096:4099] = b"cde"
    b1 = rx.recv_batch()
    assert [bytes(v) for v in b1.views()] == [b"ab", b"cde"] and b1.stream_offset == 0
    b2 = rx.recv_batch()
    assert [len(v) for v in b2.views(coalesce=True)] == [150] and b2.stream_offset == 5
    assert [len(a) for a in b2.arrays()] == [100, 50]
    rx.release_many([b2, b1])
    rx.flush()
    assert rx.provider.recycled == [([1, 2, -1, 9], [100, 50, 2, 3])]


def test_recv_batch_gives_up_at_its_timeout(rx_for):
    class Idle(ScriptedProvider):
        def reap(self, timeout: float | None) -> Delivery:
            return Delivery()  # nothing, ever

    rx = Receiver(-1, Idle())
    try:
        assert rx.recv_batch(0.05) is None and not rx.eof
    finally:
        rx.close()


def test_reprs_and_stats_name_what_they_are(rx_for):
    rx = rx_for(delivery([0], [10], [1]), delivery([0, 10], [10, 5], [2, 3]))
    (c,) = rx.recv()
    assert repr(c) == "<Chunk offset=0 length=10 stream_offset=0 parts=1 held>"
    c.release()
    assert repr(c) == "<Chunk offset=0 length=10 stream_offset=0 parts=1 released>"
    b = rx.recv_batch()
    assert repr(b) == "<Batch parts=2 length=15 stream_offset=10 held>"
    b.release()
    assert repr(b) == "<Batch parts=2 length=15 stream_offset=10 released>"
    assert rx.stats_dict()["provider"] == "scripted"


def test_release_errors_say_what_went_wrong(rx_for):
    rx, other = rx_for(delivery([0, 10], [10, 10], [1, 2])), rx_for(delivery([0], [5], [3]))
    c1, c2 = rx.recv()
    (o,) = other.recv()
    with pytest.raises(ValueError) as ei:
        rx.release(o)
    assert str(ei.value) == "chunk belongs to another receiver"
    with pytest.raises(ValueError) as ei:
        rx.release_many([c1, o])
    assert str(ei.value) == "chunk belongs to another receiver"
    with pytest.raises(ValueError) as ei:
        rx.release_many([c1, c1])
    assert str(ei.value) == "the same chunk appears twice in one release_many"
    c1.release()
    with pytest.raises(ValueError) as ei:
        rx.release_many([c2, c1])
    assert str(ei.value) == f"{c1!r} released twice"
    rx.release_many([c2])
    o.release()


# --- behaviour that mutation testing found unchecked (scripts/mutation.sh) ---------------------

def test_batch_views_are_per_buffer_unless_coalescing_is_asked(rx_for):
    rx = rx_for(delivery([0, 100], [100, 50], [1, 2]))
    b = rx.recv_batch()
    assert [len(v) for v in b.views()] == [100, 50]
    assert [len(v) for v in b.views(coalesce=True)] == [150]
    b.release()


def test_vectorized_batch_counts_plain_ints_that_reports_can_serialize(rx_for):
    import json

    import numpy as np

    d = Delivery(np.array([0, 4096, 8192]), np.array([10, 20, 30]), np.array([1, 2, 3]))
    rx = rx_for(d)
    b = rx.recv_batch()
    assert b.length == 60 and type(b.length) is int and b.parts == 3
    assert (rx.stats.delivered, rx.stats.delivered_bytes) == (3, 60)
    b.release()
    rx.flush()
    json.dumps(rx.stats_dict())  # a numpy integer in the counters would refuse here
    assert rx.provider.recycled == [([1, 2, 3], [10, 20, 30])]


def test_owner_only_calls_name_themselves(rx_for):
    import threading

    rx = rx_for(delivery([0], [10], [1]))
    errors: list[Exception] = []

    def other_thread() -> None:
        for call in (rx.flush, rx.recv_batch, rx.recv):
            try:
                call()
            except Exception as e:  # collected for the owner to check
                errors.append(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert [e.message for e in errors] == [  # type: ignore[attr-defined]
        f"{m}() called from a thread that did not open the receiver"
        for m in ("flush", "recv_batch", "recv")]
    assert {e.hint for e in errors} == {  # type: ignore[attr-defined]
        "iterate in the opening thread; other threads may only release"}
    rx.close()
    for name, call in (("flush", rx.flush), ("recv_batch", rx.recv_batch), ("recv", rx.recv)):
        with pytest.raises(ClosedError) as ei:
            call()
        assert ei.value.message == f"{name}() on a closed Receiver"


def test_debug_release_poisons_exactly_its_bytes_and_counts_live_views():
    import warnings

    from zcnet.rx.zc.api import POISON

    rx = Receiver(-1, ScriptedProvider(delivery([0, 4096], [100, 50], [1, 2])), debug=True)
    try:
        rx.area.array[:8192] = 7
        a, b = rx.recv()
        view = a.data
        arr = a.array  # numpy arrays cannot be revoked, only reported
        arr2 = a.array
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rx.release(a)
        (w,) = caught
        assert w.category is ResourceWarning
        assert str(w.message).startswith(f"{a!r} released while 2 array(s)/view(s) over it "
                                         "are alive")
        with pytest.raises(ValueError):
            view[0]  # revoked
        assert (arr == POISON).all() and (arr2 == POISON).all()
        assert (rx.area.array[100:8192] == 7).all()  # nothing past the chunk
        del arr, arr2
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no view left: no warning
            b.release()
        assert (rx.area.array[4096:4146] == POISON).all() and rx.area.array[4146] == 7
    finally:
        rx.close()


def test_stats_dict_says_why_this_provider():
    rx = Receiver(-1, ScriptedProvider(), why="chosen by the test")
    try:
        d = rx.stats_dict()
        assert d["why"] == "chosen by the test" and d["provider"] == "scripted"
    finally:
        rx.close()


def test_on_release_calls_back_once_on_the_next_release(rx_for):
    rx = rx_for(delivery([0, 10, 20], [10, 10, 10], [1, 2, 3]))
    a, b, c = rx.recv()
    calls: list[str] = []
    rx.on_release(lambda: calls.append("first"))
    assert calls == []
    a.release()
    b.release()
    assert calls == ["first"]  # once
    rx.on_release(lambda: calls.append("at once"))  # b is released and not yet flushed
    assert calls == ["first", "at once"]
    rx.flush()
    rx.on_release(lambda: calls.append("cancelled"))
    rx.on_release(None)
    c.release()
    assert calls == ["first", "at once"]
    rx.close()
    with pytest.raises(ClosedError) as ei:
        rx.on_release(lambda: None)
    assert ei.value.message == "on_release() on a closed Receiver"


def test_open_receiver_refusals_say_what_to_pass(tcp_pair):
    from zcnet.errors import UsageError
    from zcnet.rx.zc import open_receiver

    with pytest.raises(UsageError) as ei:
        open_receiver(tcp_pair[1], "nope")
    assert ei.value.message == "unknown zero-copy provider 'nope'"
    assert ei.value.hint == "choose one of zcrx, devmem, soft, auto"
    for bad in (0.0, 1.5):
        with pytest.raises(UsageError) as ei:
            open_receiver(tcp_pair[1], "soft", max_held=bad)
        assert ei.value.message == f"max_held must be in (0, 1], got {bad}"
    # A wrong type is named with its parameter, not a TypeError from a comparison deep inside.
    for kw in ({"buf_size": 4096.0}, {"rx_buf_len": True}, {"queue": "0"}, {"buf_size": None}):
        (name, value), = kw.items()
        with pytest.raises(UsageError) as ei:
            open_receiver(tcp_pair[1], "soft", **kw)
        assert ei.value.message.startswith(f"{name} must be an int")
        assert f"{type(value).__name__} {value!r}" in ei.value.message
        assert ei.value.hint.startswith(f"pass {name}= ")
    with pytest.raises(UsageError, match="area size must be an int, got str '1M'"):
        open_receiver(tcp_pair[1], "soft", area_size="1M")
    open_receiver(tcp_pair[1], "soft", queue=None, area_size=1 << 20).close()


def test_open_receiver_soft_takes_the_options_given(tcp_pair):
    from zcnet.rx.zc import open_receiver

    with open_receiver(tcp_pair[1], "soft", area_size=1 << 20, buf_size=16 << 10, max_held=1.0,
                       coalesce=True, debug=True) as rx:
        assert rx.why == "soft provider requested" and rx.name == "soft"
        assert rx.provider.buf_size == 16 << 10 and rx.area.size == 1 << 20
        assert rx.coalesce and rx.debug and rx.core.limit == 1 << 20
        tcp_pair[0].sendall(b"z" * 1000)
        got = b""
        while len(got) < 1000:
            for c in rx.recv(timeout=5):
                got += bytes(c.data)
                c.release()
        assert got == b"z" * 1000


def test_auto_says_why_each_provider_was_passed_over(tcp_pair):
    from zcnet.rx.zc import open_receiver

    with open_receiver(tcp_pair[1], "auto", area_size=1 << 20) as rx:
        assert rx.name == "soft"
        zcrx_part, devmem_part = rx.why.removeprefix("soft, because ").split("; ")
        assert rx.why.startswith("soft, because zcrx: ") and "NAPI" in zcrx_part
        assert devmem_part == "devmem: no dma-buf given"
    fd = os.memfd_create("stand-in-dmabuf", os.MFD_CLOEXEC)  # loopback refuses devmem anyway
    try:
        os.ftruncate(fd, 1 << 20)
        with open_receiver(tcp_pair[1], "auto", area_size=1 << 20, dmabuf_fd=fd) as rx:
            assert rx.name == "soft" and rx.area.kind == "dmabuf"
            reasons = rx.why.removeprefix("soft, because ").split("; ")
            assert reasons[0].startswith("zcrx: ") and reasons[-1].startswith("devmem: ")
            assert "no dma-buf given" not in rx.why
    finally:
        os.close(fd)


def test_close_from_another_thread_is_refused_and_repr_names_the_receiver():
    import threading

    from zcnet.errors import ZcnetError

    rx = Receiver(-1, ScriptedProvider(delivery([0, 100], [100, 50], [1, 2])), coalesce=True)
    caught: list[Exception] = []

    def close_elsewhere() -> None:
        try:
            rx.close()
        except ZcnetError as e:
            caught.append(e)

    t = threading.Thread(target=close_elsewhere)
    t.start()
    t.join()
    assert [e.message for e in caught] == [  # type: ignore[attr-defined]
        "close called from a thread that did not open the receiver"]
    assert repr(rx) == f"<Receiver scripted fd=-1 area=anon:{1 << 20} in_flight=0>"
    (c,) = rx.recv()  # two neighbours, one coalesced chunk: two kernel buffers held
    assert repr(rx) == f"<Receiver scripted fd=-1 area=anon:{1 << 20} in_flight=2>"
    rx.close()
    assert not rx.area.closed  # the chunk is still held
    c.release()  # the last release after close does the accounting and unmaps
    assert rx.area.closed
    assert (rx.stats.released, rx.stats.released_bytes) == (2, 150)


def test_open_receiver_defaults_and_the_socket_check(tcp_pair):
    from zcnet.errors import UsageError
    from zcnet.rx.zc import open_receiver

    with open_receiver(tcp_pair[1], area_size=1 << 20) as rx:  # provider "auto"
        assert rx.why.startswith("soft, because zcrx: ") and not rx.debug
        assert not rx.coalesce and rx.core.limit == int(0.75 * rx.area.size)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("127.0.0.1", 9))
        with pytest.raises(UsageError) as ei:
            open_receiver(udp, "soft")
    assert ei.value.message.startswith("zero-copy receiver")


def test_open_receiver_zcrx_defaults_to_one_page_buffers(tcp_pair, monkeypatch):
    from zcnet.rx.zc import open_receiver
    from zcnet.uapi import io_uring as u

    k = FakeKernel()  # the kernel side of tests/rx/test_zc_zcrx.py, offering copy mode
    monkeypatch.setattr(zcrx_rings, "Ring", k.ring_class())  # queue_ring makes it
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: zcrx.Offers(
        u.ZCRX_REG_IMPORT | u.ZCRX_REG_NODEV, u.ZCRX_FEATURE_RX_PAGE_SIZE, 3))
    k.stream = Stream(b"q" * 100, end=0)
    with open_receiver(tcp_pair[1], "zcrx", area_size=1 << 20) as rx:
        assert rx.provider.buf_len == zcrx.PAGE_SIZE and rx.provider.mode == "copy"
        assert rx.why == f"zcrx requested; {rx.provider.note}"
        (c,) = rx.recv(timeout=0)
        assert bytes(c.data) == b"q" * 100 and k.ring.sock_fd == tcp_pair[1].fileno()
        c.release()
    assert not k.rejections


def test_device_note_is_added_for_the_provider_interface_only(tcp_pair, monkeypatch):
    """A zero-copy provider on a device that copies anyway (netdevsim) says so in ``why``; the
    soft provider, which has no device, never does."""
    from zcnet.rx.zc import open_receiver, opener
    from zcnet.uapi import io_uring as u

    asked: list[str | None] = []

    def note(ifname: str | None) -> str | None:
        asked.append(ifname)
        return "the device copies" if ifname == "lo" else None

    monkeypatch.setattr(opener, "device_note", note)
    k = FakeKernel()
    monkeypatch.setattr(zcrx_rings, "Ring", k.ring_class())  # queue_ring makes it
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: zcrx.Offers(
        u.ZCRX_REG_IMPORT | u.ZCRX_REG_NODEV, u.ZCRX_FEATURE_RX_PAGE_SIZE, 3))
    with open_receiver(tcp_pair[1], "zcrx", area_size=1 << 20, ifname="lo", queue=0) as rx:
        assert rx.why == f"zcrx requested; {rx.provider.note}; the device copies"
    with open_receiver(tcp_pair[1], "soft", area_size=1 << 20, ifname="lo") as rx:
        assert rx.why == "soft provider requested"
    assert asked == ["lo"]


def test_open_receiver_zcrx_passes_memory_queue_and_buffer_options(tcp_pair, monkeypatch):
    from zcnet.nic import genl
    from zcnet.rx.zc import open_receiver, opener
    from zcnet.uapi import io_uring as u

    k = FakeKernel()
    monkeypatch.setattr(zcrx_rings, "Ring", k.ring_class())  # queue_ring makes it
    monkeypatch.setattr(zcrx, "kernel_offers", lambda: zcrx.Offers(
        u.ZCRX_REG_IMPORT | u.ZCRX_REG_NODEV, u.ZCRX_FEATURE_RX_PAGE_SIZE, 3))
    monkeypatch.setattr(netqueue, "incoming_napi_id", lambda fd: 42)  # lo's queue 3 (FakeGenl)
    monkeypatch.setattr(genl, "GenlSocket", FakeGenl)
    monkeypatch.setattr(opener, "device_note", lambda ifname: f"note for {ifname}")
    fd = os.memfd_create("stand-in-dmabuf", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 1 << 20)
        with open_receiver(tcp_pair[1], "zcrx", area_size=1 << 20, dmabuf_fd=fd,
                           rx_buf_len=2 * zcrx.PAGE_SIZE) as rx:
            assert rx.area.kind == "dmabuf" and rx.provider.buf_len == 2 * zcrx.PAGE_SIZE
            assert (rx.provider.ifname, rx.provider.queue) == ("lo", 3)
            assert rx.why.endswith("; note for lo")  # the interface found, not the one given
    finally:
        os.close(fd)


def test_close_unmaps_the_area_even_when_the_provider_close_is_interrupted(
        no_leaks, tcp_pair) -> None:
    """Ctrl-C while the provider cancels its receive must not leak the area (and the provider
    must still release its ring)."""
    client, server = tcp_pair
    rx = open_receiver(server, "soft", area_size=1 << 20, buf_size=64 << 10)
    client.sendall(b"x" * 1000)
    got = rx.recv(timeout=2)
    assert got
    rx.release_many(got)
    rx.flush()
    real_close = rx.provider.close

    def interrupted(armed: bool = False) -> bool:
        real_close(armed)
        raise KeyboardInterrupt

    rx.provider.close = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        rx.close()
    assert rx.area.closed


# --- receiver.py's loop, checked against the mutants it let through -------------------------

class Clock:
    """A monotonic clock the test moves: waits and reaps take no real time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    from zcnet.rx.zc import receiver

    c = Clock()
    monkeypatch.setattr(receiver, "time", c)
    return c


def test_receiver_defaults_copy_nothing_merge_nothing_and_give_no_reason():
    rx = Receiver(-1, ScriptedProvider(delivery([0, 100], [100, 50], [1, 2])))
    try:
        assert rx.stalled is None and rx.stats_dict()["why"] == ""
        rx.area.view[0:150] = b"a" * 150
        a, b = rx.recv()  # neighbours stay two chunks unless coalescing is asked for
        assert (len(a), len(b)) == (100, 50)
        view = a.data
        rx.release_many([a, b])
        assert bytes(view) == b"a" * 100  # no debug poisoning or revoking by default
        assert rx.stats.rearms == 0
    finally:
        rx.close()


def test_receiver_refuses_max_held_outside_zero_to_one():
    from zcnet.errors import UsageError

    prov = ScriptedProvider()
    for bad in (0.0, -0.5, 1.5, 1.001):
        with pytest.raises(UsageError) as ei:
            Receiver(-1, prov, max_held=bad)
        assert ei.value.message == f"max_held must be in (0, 1], got {bad}"
    Receiver(-1, prov, max_held=1.0).close()  # the bound itself is allowed; closes the area
    assert prov.area.closed


def test_receiver_of_a_socket_names_its_fd():
    a, b = socket.socketpair()
    with a, b:
        rx = Receiver(b, ScriptedProvider(Delivery(end=-104)))
        try:
            assert rx.fd == b.fileno() and f" fd={b.fileno()} " in repr(rx)
            with pytest.raises(ConnectionResetError) as ei:
                rx.recv()
            assert ei.value.strerror == (f"Connection reset by peer (zero-copy receive on fd "
                                         f"{b.fileno()})")
        finally:
            rx.close()


def test_stream_error_comes_after_the_data_once_then_eof(rx_for):
    import errno

    rx = rx_for(delivery([0], [10], [1]), Delivery(end=-errno.ECONNRESET))
    (c,) = rx.recv()
    c.release()
    with pytest.raises(ConnectionResetError) as ei:
        rx.recv()
    assert ei.value.errno == errno.ECONNRESET
    assert ei.value.strerror == "Connection reset by peer (zero-copy receive on fd -1)"
    assert rx.eof  # reported once; afterwards the stream reads as ended
    assert rx.recv() == [] and rx.recv_batch() is None


def test_timeouts_are_checked_and_infinity_means_no_limit(rx_for):
    from zcnet.errors import UsageError

    class Recording(ScriptedProvider):
        timeouts: list[float | None]

        def reap(self, timeout: float | None) -> Delivery:
            self.timeouts.append(timeout)
            return super().reap(timeout)

    rx = rx_for(delivery([0], [10], [1]), kind=Recording)
    rx.provider.timeouts = []
    for method, call in (("recv", rx.recv), ("recv_batch", rx.recv_batch)):
        for bad in (-1, -0.5, math.nan):
            with pytest.raises(UsageError) as ei:
                call(bad)
            assert ei.value.message == (f"{method}() timeout must be seconds >= 0 or None, "
                                        f"got {bad!r}")
            assert ei.value.hint == "pass None to wait without a limit"
    assert rx.provider.timeouts == []  # refused before entering the kernel
    (c,) = rx.recv(math.inf)
    assert rx.provider.timeouts == [None]  # the provider waits without a limit
    c.release()
    (got,) = [rx.recv(5.0)]
    assert got == [] and rx.eof
    assert 0 < rx.provider.timeouts[1] <= 5.0  # what is left of the 5 s, not a spent deadline


def test_an_empty_round_is_not_the_end_and_an_idle_timeout_enters_the_kernel_once(rx_for, clock):
    class Idle(ScriptedProvider):
        """Nothing for this receiver: woken early once (another request's completion), then
        waits out what is left."""

        timeouts: list[float | None]

        def reap(self, timeout: float | None) -> Delivery:
            self.timeouts.append(timeout)
            assert len(self.timeouts) < 5, "the receiver spins on an idle provider"
            if self.script:
                return super().reap(timeout)
            clock.now += (timeout or 0) / 2 if len(self.timeouts) == 1 else (timeout or 0)
            return Delivery()

    rx = rx_for(kind=Idle)
    rx.provider.timeouts = []
    assert rx.recv(1.0) == [] and not rx.eof
    assert rx.provider.timeouts == [1.0, 0.5]
    rx.provider.timeouts = []
    rx.provider.script = [Delivery(), delivery([0], [7], [4])]  # an empty round, then data
    (c,) = rx.recv()
    assert len(c) == 7 and rx.provider.timeouts == [None, None]
    c.release()


def test_held_back_buffers_are_offered_again_before_each_round(rx_for):
    class HoldsBack(ScriptedProvider):
        held = 2
        calls: list[tuple[list[int], list[int]]]

        def held_back(self) -> int:
            return self.held

        def recycle(self, tokens: list[int], lengths: list[int]) -> None:
            self.calls.append((list(tokens), list(lengths)))
            self.held = 0  # the refill ring had room this time

    rx = rx_for(delivery([0], [10], [1]), kind=HoldsBack)
    rx.provider.calls = []
    (c,) = rx.recv()
    assert rx.provider.calls == [([], [])] and rx.provider.held_back() == 0
    c.release()
    rx.flush()
    assert rx.provider.calls == [([], []), ([1], [10])]


def test_a_vectorized_batch_and_a_chunk_released_together_give_back_every_buffer(rx_for):
    import numpy as np

    rx = rx_for(Delivery(np.array([0, 4096]), np.array([10, 20]), np.array([1, 2], np.uint16)),
                delivery([8192], [30], [3]))
    b = rx.recv_batch()
    (c,) = rx.recv()
    rx.release_many([b, c])
    rx.flush()
    ((toks, lens),) = rx.provider.recycled
    assert sorted(zip(toks, lens, strict=True)) == [(1, 10), (2, 20), (3, 30)]
    assert (rx.stats.released, rx.stats.released_bytes, rx.stats.in_flight) == (3, 60, 0)


class Exhausting(ScriptedProvider):
    """A provider with ``free`` buffers: a round uses them up and its receive stops
    (``stopped``) until buffers come back, as the soft provider's multishot receive does."""

    def __init__(self, free: int, *deliveries: Delivery) -> None:
        super().__init__(*deliveries)
        self.free = free

    def can_arm(self) -> bool:
        return self.free > 0

    def reap(self, timeout: float | None) -> Delivery:
        d = super().reap(timeout)
        self.free -= len(d.offsets)
        if not self.free and d.end is None:
            d.stopped = "exhausted"
        return d

    def recycle(self, tokens: list[int], lengths: list[int]) -> None:
        super().recycle(tokens, lengths)
        self.free += len(tokens)


def _fake_waits(rx: Receiver, clock: Clock, plan) -> list[float | None]:
    """Replace the wait for releases: each wait takes the next step of ``plan`` (a chunk
    list to release, or None: nothing released, the wait times out)."""
    steps: list[float | None] = []

    class Planned(RxCore):
        __slots__ = ()

        def wait_release(self, timeout: float | None) -> bool:
            steps.append(timeout)
            todo = plan.pop(0)
            if todo is None:
                clock.now += timeout or 0
                return False
            rx.release_many(todo)
            return True

    assert not rx.core.queue
    rx.core.__class__ = Planned
    return steps


def test_exhausted_buffers_pause_then_rearm_and_count(clock, caplog):
    import logging

    rx = Receiver(-1, Exhausting(2, delivery([0, 4096], [100, 200], [1, 2]),
                                 delivery([0, 4096], [300, 400], [1, 2])))
    try:
        first = rx.recv()
        assert rx.stats.rearms == 0  # the first arm is no re-arm
        plan: list = [None]
        steps = _fake_waits(rx, clock, plan)
        plan.append(first)  # nothing for a second (a warning), then the release
        with caplog.at_level(logging.INFO, logger="zcnet.rx.zc"):
            second = rx.recv()
            assert [len(c) for c in second] == [300, 400] and rx.stalled is None
            plan.append(second)
            assert rx.recv() == [] and rx.eof
        assert steps == [1.0, 1.0, 1.0]  # waits of a second at most, without a timeout
        assert (rx.stats.exhausted, rx.stats.rearms, rx.stats.backpressure) == (2, 2, 0)
        assert [r.getMessage() for r in caplog.records] == [
            f"scripted receiver paused: exhausted (300 of {1 << 20} bytes held)",
            f"scripted receiver stalled (exhausted): the application holds 300 of {1 << 20} "
            "area bytes; release chunks to resume",
            f"scripted receiver paused: exhausted (700 of {1 << 20} bytes held)"]
    finally:
        rx.close()


def test_backpressure_waits_out_the_timeout_in_steps_and_warns_once(clock, caplog):
    import logging

    rx = Receiver(-1, ScriptedProvider(delivery([0, 4096], [1000, 1000], [1, 2]),
                                       delivery([0, 4096], [1000, 1000], [3, 4])),
                  max_held=0.001)  # 1048 bytes
    try:
        held = rx.recv()
        steps = _fake_waits(rx, clock, [None] * 4)
        start = clock.now
        with caplog.at_level(logging.INFO, logger="zcnet.rx.zc"):
            assert rx.recv(3.5) == [] and not rx.eof
        assert rx.stalled == "backpressure"
        assert steps == [1.0, 1.0, 1.0, 0.5] and clock.now == start + 3.5
        assert [r.getMessage() for r in caplog.records] == [
            f"scripted receiver paused: backpressure (2000 of {1 << 20} bytes held)",
            f"scripted receiver stalled (backpressure): the application holds 2000 of "
            f"{1 << 20} area bytes; release chunks to resume"]
        rx.release_many(held)
        held = rx.recv()  # released: delivery resumes
        assert [len(c) for c in held] == [1000, 1000] and rx.stalled is None
        _fake_waits(rx, clock, [None])
        assert rx.recv(0) == [] and rx.stalled == "backpressure"
        assert rx.stats.backpressure == 2
        rx.release_many(held)
    finally:
        rx.close()
