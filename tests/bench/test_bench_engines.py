"""Each receive engine moves >= 64 MiB over a real TCP socket, verified byte for byte."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from zcnet.pattern import PERIOD, TILED, Verifier, pattern_view
from zcnet.rx.engine import EngineOptions, close_engine
from zcnet.rx.registry import engine_names, make_engine

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

SIZE = 64 << 20


def _send_pattern(sock: socket.socket, total: int, corrupt_at: int | None = None) -> None:
    mv = memoryview(TILED)
    sent = 0
    with sock:
        while sent < total:
            n = min(256 << 10, total - sent)
            start = sent % PERIOD
            chunk = mv[start:start + n]
            if corrupt_at is not None and sent <= corrupt_at < sent + n:
                bad = bytearray(chunk)
                bad[corrupt_at - sent] ^= 0xFF
                chunk = memoryview(bad)
            sock.sendall(chunk)
            sent += n


def _run(engine: str, total: int, corrupt_at: int | None = None,
         opts: EngineOptions | None = None) -> tuple[int, Verifier]:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    tx = socket.create_connection(ls.getsockname())
    rx, _ = ls.accept()
    ls.close()
    t = threading.Thread(target=_send_pattern, args=(tx, total, corrupt_at))
    t.start()
    v = Verifier()
    with rx:
        stats = make_engine(engine, opts).run(rx, v.check)
    t.join()
    return stats.bytes, v


@pytest.mark.parametrize("engine", ["epoll", "uring", "uring-mshot"])
def test_engine_moves_64mib_verified(no_leaks, engine: str) -> None:
    got, v = _run(engine, SIZE)
    assert got == SIZE
    assert v.checked == SIZE and v.mismatches == 0


@pytest.mark.parametrize("engine", ["epoll", "uring-mshot"])
def test_verifier_catches_a_flipped_byte(engine: str) -> None:
    got, v = _run(engine, 4 << 20, corrupt_at=3_000_001)
    assert got == 4 << 20 and v.mismatches == 1


def test_mshot_without_bundles_and_tiny_ring_still_exact(no_leaks) -> None:
    """Few small buffers force ENOBUFS terminations and re-arms; no byte may be lost."""
    opts = EngineOptions(mshot_buf=4096, mshot_entries=4, bundle=False)
    got, v = _run("uring-mshot", 8 << 20, opts=opts)
    assert got == 8 << 20 and v.mismatches == 0


def test_verifier_detects_misplaced_chunk() -> None:
    v = Verifier()
    good = pattern_view(0, 1000).copy()
    assert v.check(good) == 0
    # The next 1000 bytes delivered as a repeat of the first 1000: a duplicated chunk.
    assert v.check(good) > 900
    assert v.as_dict() == {"checked_bytes": 2000, "mismatches": v.mismatches}


def test_unknown_engine_lists_choices() -> None:
    with pytest.raises(ValueError, match="epoll"):
        make_engine("nope")
    assert {"epoll", "uring", "uring-mshot"} <= set(engine_names())


def test_pattern_is_not_trivially_periodic() -> None:
    a = pattern_view(0, 4096)
    assert len(np.unique(a)) > 200 and not np.array_equal(a, pattern_view(256, 4096))


class _StubProvider:
    """Stands in for a zcrx registration that unsupported() made (no capable NIC here)."""

    def __init__(self, fail_attach: bool = False) -> None:
        self.closed = 0
        self.fail_attach = fail_attach

    def attach(self, fd: int) -> None:
        if self.fail_attach:
            raise OSError(22, "attach refused")

    def close(self) -> None:
        self.closed += 1


def test_nic_engine_releases_a_registration_that_run_never_took() -> None:
    eng = make_engine("zcrx")
    stub = _StubProvider()
    eng._prov = stub  # type: ignore[attr-defined]
    close_engine(eng)
    close_engine(eng)  # idempotent
    assert stub.closed == 1
    close_engine(make_engine("epoll"))  # engines without state have nothing to close


def test_nic_engine_failed_open_closes_the_registration() -> None:
    eng = make_engine("zcrx")
    stub = _StubProvider(fail_attach=True)
    eng._prov = stub  # type: ignore[attr-defined]
    with socket.socket() as s, pytest.raises(OSError, match="attach refused"):
        eng._open(s)  # type: ignore[attr-defined]
    assert stub.closed == 1
