"""ZCRX_CTRL_ADD_AREA against a real 7.3 kernel in copy mode (the VM): a queue opened with room
to grow takes an area more, data the first area cannot hold lands in the added one (offsets
past it, bytes checked), buffers named by the added area go back through the refill ring and
are used again, and every misuse is a clear error that leaves the queue working."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from zcnet.errors import ClosedError, UsageError
from zcnet.rx.zc.api import Receiver
from zcnet.rx.zc.area import PAGE_SIZE
from zcnet.rx.zc.zcrx import kernel_offers, open_zcrx_queue
from zcnet.uapi import io_uring as u

pytestmark = pytest.mark.vm

FIRST = 64 << 10   # 16 buffers
ADDED = 128 << 10  # 32 more
PAYLOAD = bytes(range(256)) * 600  # 150 KiB: more than the first area holds


@pytest.fixture
def growable(no_leaks):
    if not kernel_offers().add_area:
        pytest.skip("this kernel has no ZCRX_CTRL_ADD_AREA (7.3); run the vm tests under "
                    "`zcnet vm run`")
    zq = open_zcrx_queue(FIRST, copy=True, area_capacity=1 << 20)
    try:
        yield zq
    finally:
        zq.close()


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        tx = socket.create_connection(ls.getsockname()[:2])
        rx, _ = ls.accept()
    return tx, rx


def _receive_holding(rx: Receiver, n: int) -> tuple[bytes, list]:
    """``n`` bytes, every chunk held (so the kernel must find buffers elsewhere)."""
    got, held = bytearray(), []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        for c in rx.recv(1.0):
            got += bytes(c.data)
            held.append(c)
    return bytes(got), held


def test_data_the_first_area_cannot_hold_lands_in_the_added_one(growable) -> None:
    zq = growable
    assert zq.buffers() == FIRST // PAGE_SIZE
    area_id = zq.add_area(ADDED)
    assert area_id >= 1 and zq.added_areas == [(area_id, FIRST, ADDED)]
    assert zq.area.size == FIRST + ADDED and zq.buffers() == (FIRST + ADDED) // PAGE_SIZE
    tx, s = _pair()
    with tx, s:
        rx = Receiver(s, zq.join(s.fileno()))
        try:
            for rnd in range(2):  # the second round reuses buffers the refill ring gave back
                tx.sendall(PAYLOAD)
                got, held = _receive_holding(rx, len(PAYLOAD))
                assert got == PAYLOAD, rnd
                assert max(c.offset + c.length for c in held) > FIRST  # the added area
                assert all(c.offset >= 0 and c.offset + c.length <= zq.area.size for c in held)
                for c in held:
                    c.release()
        finally:
            rx.close()


def test_misuse_is_refused_and_the_queue_still_receives(growable) -> None:
    zq = growable
    with pytest.raises(UsageError, match="multiple of 4096"):
        zq.add_area(1000)
    with pytest.raises(UsageError, match=r"do not fit.*area_capacity"):
        zq.add_area(2 << 20)
    refused: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(refused, zq.add_area, ADDED))
    t.start()
    t.join()
    assert len(refused) == 1 and "single-issuer" in str(refused[0])
    assert zq.area.size == FIRST and not zq.added_areas  # nothing half-added
    tx, s = _pair()
    with tx, s:
        rx = Receiver(s, zq.join(s.fileno()))
        try:
            tx.sendall(PAYLOAD[:FIRST // 2])
            got, held = _receive_holding(rx, FIRST // 2)
            assert got == PAYLOAD[:FIRST // 2]
            for c in held:
                c.release()
        finally:
            rx.close()


def test_a_queue_without_room_to_grow_says_how_to_get_it(no_leaks) -> None:
    if not kernel_offers().add_area:
        pytest.skip("this kernel has no ZCRX_CTRL_ADD_AREA (7.3)")
    zq = open_zcrx_queue(FIRST, copy=True)
    try:
        with pytest.raises(UsageError, match="area_capacity="):
            zq.add_area(ADDED)
    finally:
        zq.close()
    with pytest.raises(ClosedError):
        zq.add_area(ADDED)


def test_the_kernel_names_the_added_area_in_its_token(growable) -> None:
    """The id add_area returns is the kernel's (rq_area_token >> IORING_ZCRX_AREA_SHIFT), and
    refill entries keep it: the ring's table maps it to where its memory starts."""
    zq = growable
    first = zq.add_area(ADDED)
    second = zq.add_area(4 * PAGE_SIZE)
    assert second == first + 1
    table = zq.rq.area_starts
    assert table is not None and list(table[[0, first, second]]) == [0, FIRST, FIRST + ADDED]
    assert zq.rq.push_mask == (1 << 64) - 1 and zq.rq.area_token == 0
    assert u.IORING_ZCRX_AREA_SHIFT == 48


def _catch(into: list[BaseException], f, *args) -> None:  # type: ignore[no-untyped-def]
    try:
        f(*args)
    except Exception as e:  # handed to the test thread
        into.append(e)
