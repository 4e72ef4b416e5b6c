"""MSG_ZEROCOPY completions: parsing and coalescing crafted error-queue messages, the id tracker,
and real completions on loopback (where the kernel always copies and says so)."""

from __future__ import annotations

import itertools
import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zcnet.tx.zerocopy import (
    ID_MOD,
    DoubleRelease,
    ZcRange,
    ZcTracker,
    coalesce,
    parse_cmsgs,
    read_completions,
    wait_completions,
)
from zcnet.uapi.errqueue import (
    IP_RECVERR,
    IPV6_RECVERR,
    SO_EE_CODE_ZEROCOPY_COPIED,
    SO_EE_ORIGIN_ICMP,
    SO_EE_ORIGIN_ZEROCOPY,
    SOL_IP,
    SOL_IPV6,
    sock_extended_err,
)
from zcnet.uapi.socket import MSG_ZEROCOPY, SO_ZEROCOPY

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


def _ee(lo: int, hi: int, *, code: int = 0, origin: int = SO_EE_ORIGIN_ZEROCOPY,
        err: int = 0) -> bytes:
    ee = sock_extended_err(ee_errno=err, ee_origin=origin, ee_code=code, ee_info=lo, ee_data=hi)
    return bytes(ee) + bytes(16)  # the offender sockaddr follows in real messages


def test_parse_keeps_only_zerocopy_notifications() -> None:
    anc = [
        (SOL_IP, IP_RECVERR, _ee(0, 4)),
        (SOL_IPV6, IPV6_RECVERR, _ee(5, 5, code=SO_EE_CODE_ZEROCOPY_COPIED)),
        (SOL_IP, IP_RECVERR, _ee(9, 9, origin=SO_EE_ORIGIN_ICMP)),  # an ICMP error, not ours
        (SOL_IP, IP_RECVERR, _ee(7, 8, err=111)),  # errno set: not a completion
        (SOL_IP, 99, _ee(1, 1)),  # another cmsg type
        (SOL_IP, IP_RECVERR, b"\x00" * 4),  # truncated
    ]
    assert parse_cmsgs(anc) == [ZcRange(0, 4, False), ZcRange(5, 5, True)]


def test_coalesce_merges_touching_ranges_of_the_same_kind() -> None:
    ranges = [ZcRange(5, 9, False), ZcRange(0, 4, False), ZcRange(10, 10, True),
              ZcRange(11, 12, True), ZcRange(20, 21, False)]
    assert coalesce(ranges) == [ZcRange(0, 9, False), ZcRange(10, 12, True),
                                ZcRange(20, 21, False)]


def test_coalesce_across_the_32_bit_wrap() -> None:
    top = ID_MOD - 2
    merged = coalesce([ZcRange(0, 3, False), ZcRange(top, ID_MOD - 1, False)], base=top)
    assert merged == [ZcRange(top, 3, False)]
    assert len(merged[0]) == 6


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)), min_size=1, max_size=30),
       st.integers(0, ID_MOD - 1))
def test_coalesce_covers_the_same_ids(spans: list[tuple[int, int]], base: int) -> None:
    ranges = [ZcRange((base + lo) % ID_MOD, (base + lo + n) % ID_MOD, False) for lo, n in spans]
    ids = {(r.lo + i) % ID_MOD for r in ranges for i in range(len(r))}
    merged = coalesce(ranges, base=base)
    got = [(r.lo + i) % ID_MOD for r in merged for i in range(len(r))]
    assert sorted(got) == sorted(ids)  # same ids, none twice
    ends = [((r.lo - base) % ID_MOD, (r.hi - base) % ID_MOD) for r in merged]
    assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(ends))  # gaps remain


def test_tracker_releases_a_slot_after_its_last_send_only() -> None:
    t = ZcTracker(first_id=ID_MOD - 2)  # ids ID_MOD-2, ID_MOD-1, 0, 1: crosses the wrap
    ids = [t.submitted(slot) for slot in (0, 0, 1, 2)]
    assert ids == [ID_MOD - 2, ID_MOD - 1, 0, 1]
    assert t.complete(ZcRange(ID_MOD - 2, ID_MOD - 2, False)) == []  # slot 0 has one more
    assert t.complete(ZcRange(ID_MOD - 1, 0, True)) == [0, 1]
    assert t.complete(ZcRange(1, 1, False)) == [2]
    assert (t.zerocopy, t.copied, t.outstanding) == (2, 2, 0)
    with pytest.raises(DoubleRelease):
        t.complete(ZcRange(1, 1, False))


def test_real_completions_on_loopback_are_copied(no_leaks, tcp_pair) -> None:
    client, server = tcp_pair
    client.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    sends, chunk = 200, 4096
    total = sends * chunk
    got = bytearray()
    reader = threading.Thread(target=lambda: _read_all(server, total, got))
    reader.start()
    payload = bytes(range(256)) * (chunk // 256)
    calls = 0
    for _ in range(sends):
        view = memoryview(payload)
        while view:
            n = client.send(view, MSG_ZEROCOPY)
            view = view[n:]
            calls += 1
    reader.join(timeout=30)
    assert len(got) == total and got == payload * sends
    ranges: list[ZcRange] = []
    covered = 0
    while covered < calls:
        batch = wait_completions(client, 2000)
        assert batch, f"notifications stopped at {covered} of {calls}"
        ranges += batch
        covered = sum(len(r) for r in ranges)
    assert read_completions(client) == []
    assert covered == calls  # every send id exactly once
    assert all(r.copied for r in ranges)  # loopback delivery copies, and the kernel says so
    merged = coalesce(ranges)
    assert merged == [ZcRange(0, calls - 1, True)]


def _read_all(sock: socket.socket, total: int, out: bytearray) -> None:
    while len(out) < total:
        data = sock.recv(1 << 16)
        if not data:
            return
        out += data
