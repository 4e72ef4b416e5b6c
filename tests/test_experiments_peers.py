"""The C peers run in the lab like an engine cell; a missing binary says so with the fix."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from zcnet.bench.cpustat import SHARES
from zcnet.bench.peers import parse_peers, run_peer
from zcnet.bench.records import ResultRow, read_file, to_json
from zcnet.errors import UsageError
from zcnet.lab import Lab
from zcnet.report.tables import experiment_tables

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def lab(no_leaks: None) -> Iterator[Lab]:
    with Lab(mtu=9000) as the_lab:
        yield the_lab


def _check_cpu(row: ResultRow) -> None:
    for side in ("rx", "tx"):
        shares = row.side_shares(side)
        assert shares is not None and shares.sampled
        # Every share of the CPU's time, steal (a VM has it) and guest included: 100 in all.
        assert sum(shares.share(k) or 0.0 for k in SHARES) == pytest.approx(100.0, abs=0.1)


@pytest.mark.root
def test_iperf3_in_the_lab(lab: Lab) -> None:
    if not shutil.which("iperf3"):
        pytest.skip("iperf3 not installed")
    row = run_peer("iperf3", lab, rx_cpu=1, tx_cpu=0, duration=1, mtu=9000, placement="split")
    assert row.status == "ok", row.reason
    assert (row.engine, row.peer, row.mtu, row.placement) == ("iperf3", "iperf3", 9000, "split")
    assert row.bytes and row.seconds and row.bytes > 0 and row.seconds > 0.5
    assert row.gbps == pytest.approx(row.bytes * 8 / row.seconds / 1e9, rel=0.01)
    _check_cpu(row)


@pytest.mark.root
def test_sockperf_in_the_lab(lab: Lab) -> None:
    if not shutil.which("sockperf"):
        pytest.skip("sockperf not installed")
    row = run_peer("sockperf", lab, rx_cpu=1, tx_cpu=0, duration=1, mtu=9000,
                   placement="split")
    assert row.status == "ok", row.reason
    assert (row.gbps or 0) > 0 and row.latency_us and row.latency_p99_us
    assert row.latency_us > 0 and row.latency_p99_us >= row.latency_us * 0.5
    _check_cpu(row)


@pytest.mark.root
def test_missing_binary_says_not_installed(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    for name in ("iperf3", "sockperf"):
        row = run_peer(name, lab, rx_cpu=0, tx_cpu=0, duration=1, mtu=1500, placement="same")
        assert row.status == "unsupported"
        assert row.reason == f"not installed (apt-get install {name})"
    doc = {"tool": "zcnet", "kind": "bench", "results": [
        {"engine": "epoll", "mtu": 1500, "placement": "same", "status": "ok", "gbps": 9.0},
        to_json(row)]}
    peer_table = experiment_tables(read_file(doc))[-1]
    assert peer_table.rows == [["sockperf", "1500", "same", "n/a", "", ""]]
    assert peer_table.notes == ["n/a: sockperf mtu 1500 same: not installed (apt-get install "
                                "sockperf)"]


def test_peer_table_ratio_against_best_engine() -> None:
    doc = {"tool": "zcnet", "kind": "bench", "results": [
        {"engine": "epoll", "mtu": 9000, "placement": "split", "status": "ok", "gbps": 9.0},
        {"engine": "uring", "mtu": 9000, "placement": "split", "status": "ok", "gbps": 12.0},
        {"engine": "iperf3", "peer": "iperf3", "mtu": 9000, "placement": "split",
         "status": "ok", "gbps": 10.0}]}
    tables = experiment_tables(read_file(doc))
    assert tables[0].headers == ["MTU", "epoll", "uring"]  # peers are not engine columns
    assert tables[-1].rows == [["iperf3", "9000", "split", "10.00", "uring 12.00", "1.20x"]]
    assert "Gbit/s" in tables[-1].title


def test_repeated_peers_read_one_row_per_mtu_with_median_and_range() -> None:
    """`reproduce --repeat 3`: each peer once per MTU and placement, its median and range, and
    the ratio of the medians (not one row per repeat)."""
    def row(engine: str, mtu: int, gbps: float, rep: int, peer: bool = False) -> dict[str, Any]:
        return {"engine": engine, "mtu": mtu, "placement": "same", "status": "ok",
                "gbps": gbps, "repeat": rep, **({"peer": engine} if peer else {})}

    results = [r for rep, (a, b, c) in enumerate(((20.0, 10.0, 30.0), (22.0, 14.0, 33.0),
                                                 (21.0, 12.0, 36.0)))
               for r in (row("uring", 1500, a, rep), row("uring", 9000, b, rep),
                         row("iperf3", 1500, c, rep, True), row("iperf3", 9000, c / 2, rep, True))]
    table = experiment_tables(read_file({"tool": "zcnet", "kind": "bench",
                                         "results": results}))[-1]
    assert table.rows == [
        ["iperf3", "1500", "same", "33.00 [30.00..36.00]", "uring 21.00", "0.64x"],
        ["iperf3", "9000", "same", "16.50 [15.00..18.00]", "uring 12.00", "0.73x"]]


def test_parse_peers() -> None:
    assert parse_peers("iperf3, sockperf") == ["iperf3", "sockperf"]
    with pytest.raises(UsageError, match="choose from: iperf3, sockperf"):
        parse_peers("iperf3,netperf")
