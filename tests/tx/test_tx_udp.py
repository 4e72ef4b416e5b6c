"""UDP burst senders into the checking sink on loopback: exact counts, intact payloads, GSO
fallback counting, and a sink that notices damage."""

from __future__ import annotations

import errno
import os
import socket
import time

import pytest

from zcnet.bench.txbench import ALL_MODES, _factory
from zcnet.errors import ZcnetError
from zcnet.tx.hwcount import HwCounters
from zcnet.tx.sink import Sink
from zcnet.tx.udp_modes import (
    GSO_MAX_BYTES,
    GSO_MAX_SEGMENTS,
    gso_can_carry,
    gso_refusal,
    run_for,
)
from zcnet.uapi.perf_event import PERF_COUNT_SW_TASK_CLOCK, PERF_TYPE_SOFTWARE

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


def _sender_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def _send(mode: str, lengths: list[int], bursts: int) -> tuple[dict, dict]:
    with Sink("127.0.0.1", tuple(sorted(set(lengths)))) as sink, \
            _sender_socket(sink.port) as sock:
        sender = _factory(mode)(sock, lengths)
        try:
            sent, _, _ = run_for(sender, packets=bursts * len(lengths))
        finally:
            sender.close()
        assert sent == bursts * len(lengths)
        return sink.snapshot(100), sender.counters.as_dict()


@pytest.mark.parametrize("lengths", [[64] * 32, [13] * 5, [100] * 7 + [40], [5] * 3],
                         ids=["64x32", "13x5", "short-last", "no-seq"])
def test_each_mode_delivers_exactly_n_intact(no_leaks, lengths: list[int]) -> None:
    bursts = 20
    n = bursts * len(lengths)
    with Sink("127.0.0.1", tuple(sorted(set(lengths)))) as sink:  # one sink, modes in turn
        before = sink.snapshot(0)
        for mode in ALL_MODES:
            with _sender_socket(sink.port) as sock:
                sender = _factory(mode)(sock, lengths)
                try:
                    run_for(sender, packets=n)
                finally:
                    sender.close()
            after = sink.snapshot(100)
            got = {k: after[k] - before[k] for k in ("received", "bytes", "bad_payload",
                                                     "wrong_size", "seq_sum")}
            before = after
            assert got["received"] == n and got["bytes"] == bursts * sum(lengths), mode
            assert got["bad_payload"] == 0 and got["wrong_size"] == 0, mode
            if min(lengths) >= 8:  # packets carry their sequence number: each arrived once
                assert got["seq_sum"] == n * (n - 1) // 2, mode
            counters = sender.counters.as_dict()
            assert counters["packets"] == n and counters["fallback_packets"] == 0, mode
            calls_per_burst = len(lengths) if mode == "single" else 1
            assert counters["calls"] == bursts * calls_per_burst, mode


@pytest.mark.parametrize(("lengths", "why"), [
    ([64] * (GSO_MAX_SEGMENTS + 1), "too many segments"),
    ([1400] * 48, "more than 64 KiB"),
    ([64, 128] * 4, "mixed sizes"),
])
def test_gso_fallback_is_counted_and_delivers(no_leaks, lengths: list[int], why: str) -> None:
    assert not gso_can_carry(lengths), why
    bursts = 5
    got, counters = _send("gso", lengths, bursts)
    n = bursts * len(lengths)
    assert counters["fallback_bursts"] == bursts and counters["fallback_packets"] == n
    assert got["received"] == n and got["bad_payload"] == 0 and got["wrong_size"] == 0
    assert got["seq_sum"] == n * (n - 1) // 2


def test_gso_can_carry_rules() -> None:
    assert gso_can_carry([64] * GSO_MAX_SEGMENTS)
    assert gso_can_carry([100, 100, 30])  # only the last may be shorter
    assert not gso_can_carry([100, 30, 100])
    assert not gso_can_carry([100, 100, 130])
    assert not gso_can_carry([])
    seg = GSO_MAX_BYTES // 10
    assert gso_can_carry([seg] * 10) and not gso_can_carry([seg + 1] * 10)
    assert "segments" in gso_refusal([64] * 65) and "mixed" in gso_refusal([64, 128])
    assert "per send" in gso_refusal([seg + 1] * 10)


def test_sink_counts_damaged_and_wrong_sized_packets(no_leaks) -> None:
    with Sink("127.0.0.1", (64,)) as sink, _sender_socket(sink.port) as sock:
        sender = _factory("mmsg")(sock, [64] * 4)
        run_for(sender, packets=4)
        sock.send(bytes(64))           # right size, wrong pattern
        sock.send(bytes(sender.rows[0, :63]))  # one byte short
        got = sink.snapshot(100)
    assert got["received"] == 6
    assert got["bad_payload"] == 1 and got["wrong_size"] == 1
    assert got["seq_sum"] == 0 + 1 + 2 + 3


class _Flaky:
    """A real connected socket whose send() first fails with a transient errno."""

    def __init__(self, sock: socket.socket, errnos: list[int]) -> None:
        self._sock, self._errnos = sock, list(errnos)

    def fileno(self) -> int:
        return self._sock.fileno()

    def getpeername(self) -> tuple[str, int]:
        return self._sock.getpeername()

    def setsockopt(self, *args: int) -> None:
        self._sock.setsockopt(*args)

    def send(self, data: memoryview, flags: int = 0) -> int:
        if self._errnos:
            err = self._errnos.pop(0)
            raise OSError(err, os.strerror(err))
        return self._sock.send(data, flags)


@pytest.mark.parametrize("mode", ["single", "gso"])
def test_transient_errors_are_counted_and_retried(no_leaks, mode: str) -> None:
    with Sink("127.0.0.1", (64,)) as sink, _sender_socket(sink.port) as real:
        flaky = _Flaky(real, [errno.EAGAIN, errno.ENOBUFS, errno.EAGAIN])
        sender = _factory(mode)(flaky, [64] * 8)  # type: ignore[arg-type]
        run_for(sender, packets=16)
        got = sink.snapshot(100)
    assert sender.counters.retries == {"EAGAIN": 2, "ENOBUFS": 1}
    assert got["received"] == 16 and got["seq_sum"] == sum(range(16))


def test_lasting_errors_end_the_run(no_leaks) -> None:
    with Sink("127.0.0.1", (64,)) as sink, _sender_socket(sink.port) as real:
        sender = _factory("single")(_Flaky(real, [errno.EHOSTUNREACH]), [64])  # type: ignore[arg-type]
        with pytest.raises(ZcnetError, match="unreachable"):
            run_for(sender, packets=1)


def test_perf_counters_count_this_thread(no_leaks) -> None:
    """The perf_event_open plumbing, on software events (this VM has no PMU)."""
    sw = {"task_clock": (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK)}
    with HwCounters.open(sw) as counters:  # type: ignore[union-attr]
        counters.start()
        cpu0 = time.thread_time_ns()
        while time.thread_time_ns() - cpu0 < 20_000_000:
            pass
        spent = time.thread_time_ns() - cpu0
        got = counters.stop()
    assert 0.5 * spent < got["task_clock"] < 2 * spent + 5_000_000
