"""The Receiver against a scripted provider: what it hands out (chunks, coalescing, linear
copies, reprs, errors) and exactly what it gives back to the provider, for deliveries chosen
by the test rather than by the kernel's timing."""

from __future__ import annotations

import pytest

from zcnet.rx.zc import open_receiver
from zcnet.rx.zc.api import CoalescedChunk, LinearChunk, Receiver
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import Delivery

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


class ScriptedProvider:
    """Delivers the given Deliveries one per reap (then EOF), records every recycle call."""

    name = "scripted"
    note = ""

    def __init__(self, *deliveries: Delivery) -> None:
        self.area = Area(1 << 20)
        self.armed = True
        self.script = list(deliveries)
        self.recycled: list[tuple[list[int], list[int]]] = []

    def arm(self) -> None:
        self.armed = True

    def can_arm(self) -> bool:
        return True

    def reap(self, timeout: float | None) -> Delivery:
        return self.script.pop(0) if self.script else Delivery(end=0)

    def recycle(self, tokens: list[int], lengths: list[int]) -> None:
        if tokens:
            self.recycled.append((list(tokens), list(lengths)))

    def held_back(self) -> int:
        return 0

    def extra_stats(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def delivery(offsets, lengths, tokens, linear=None) -> Delivery:  # type: ignore[no-untyped-def]
    return Delivery(list(offsets), list(lengths), list(tokens), dict(linear or {}))


@pytest.fixture
def rx_for():
    made: list[Receiver] = []

    def make(*deliveries: Delivery, coalesce: bool = False) -> Receiver:
        made.append(Receiver(-1, ScriptedProvider(*deliveries), coalesce=coalesce))
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

    def interrupted() -> None:
        real_close()
        raise KeyboardInterrupt

    rx.provider.close = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        rx.close()
    assert rx.area.closed
